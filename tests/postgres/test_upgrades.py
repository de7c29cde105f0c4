"""Upgrades between store formats, on both backends (docs/upgrades.md): nothing but `ledger
upgrade` changes a ledger's format; every other command refuses an older or a newer format in
one line that names both formats."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.events import NewEvent
from ledger.store import open_leases, open_store, upgrade_store
from ledger.store.base import FORMAT_VERSION, UPGRADABLE_FROM
from ledger.store.postgres import split_url
from ledger.verify import verify_store

PREVIOUS = FORMAT_VERSION - 1
# Format 3's insert trigger, as a format-3 SQLite file holds it: MAX(seq), then the hash at seq - 1.
FORMAT_3_TRIGGER = f"""
CREATE TRIGGER events_contiguous BEFORE INSERT ON events
WHEN NEW.seq IS NOT (SELECT IFNULL(MAX(seq), 0) + 1 FROM events)
  OR NEW.version IS NOT (SELECT IFNULL(MAX(version), 0) + 1 FROM events WHERE stream = NEW.stream)
  OR NEW.prev_hash IS NOT IFNULL((SELECT hash FROM events WHERE seq = NEW.seq - 1), '{'0' * 64}')
  OR EXISTS (SELECT 1 FROM events WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'the ledger is append-only: an event with this id is stored already (INSERT OR REPLACE would delete it)')
    WHERE EXISTS (SELECT 1 FROM events WHERE id = NEW.id);
    SELECT RAISE(ABORT, 'the ledger only grows at its head: seq, version or prev_hash out of order');
END;
"""

# Commands that open the ledger, services included: each must refuse another format at once.
COMMANDS = [
    ["list"], ["replay"], ["verify"], ["export"], ["inspect", "a/a"], ["tpus"], ["queue"], ["usage"],
    ["doctor", "a/a"], ["cancel", "a/a", "--reason", "test"], ["admit", "a/a", "--reason", "test"],
    ["ingest", "--repo", "/nonexistent"], ["watch", "--once", "--repo", "/nonexistent"],
    ["reconcile", "--once", "--tpu-endpoint", "127.0.0.1:1"], ["fanout", "--once"],
    ["dashboard", "--port", "0"],
]


@pytest.fixture
def ledger(new_ledger_url) -> str:
    url = new_ledger_url()
    store = open_store(url)
    try:
        store.append("a/a", [NewEvent("note", {"text": str(i)}) for i in range(3)])
        store.append("b/b", [NewEvent("note", {"text": "b"})])
    finally:
        store.close()
    return url


def rows(url: str) -> list[tuple]:
    store = open_store(url, create=False)
    try:
        return list(store.raw_rows())
    finally:
        store.close()


def sql(url: str, *statements: str) -> list[tuple]:
    """Run statements on the ledger through a raw connection (as an older tpu-ledger, or an
    admin, would); {s} is the PostgreSQL schema. The last statement's rows."""
    out: list[tuple] = []
    if url.startswith("sqlite:///"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            for statement in statements:
                out = db.execute(statement.replace("{s}.", "")).fetchall()
        finally:
            db.close()
        return out
    dsn, schema = split_url(url, None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            cur = conn.execute(statement.replace("{s}", f'"{schema}"'))  # type: ignore[arg-type]
            out = cur.fetchall() if cur.description else []
    return out


def stored_format(url: str) -> int:
    return int(sql(url, "SELECT value FROM {s}.meta WHERE key = 'format'")[0][0])


# What format 4 had on PostgreSQL and format 5 has not: a trigger on head that sent the
# NOTIFY (format 5's append functions send it themselves), and no append_one.
FORMAT_4_POSTGRES = [
    """CREATE OR REPLACE FUNCTION {s}.notify_append() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_appended', NEW.seq::text);
        RETURN NULL;
    END $$""",
    """CREATE OR REPLACE TRIGGER head_notify AFTER UPDATE ON {s}.head
        FOR EACH ROW WHEN (NEW.seq > OLD.seq) EXECUTE FUNCTION {s}.notify_append()""",
    "DROP FUNCTION {s}.append_one",
]


def make_previous_format(url: str) -> None:
    """Turn the ledger into what format PREVIOUS code wrote: PostgreSQL gets format 4's head
    trigger back and loses append_one (SQLite's format-4 file is format 5's)."""
    assert PREVIOUS == 4, "a new format: teach this test what the previous one looked like"
    if url.startswith("sqlite:///"):
        sql(url, f"UPDATE meta SET value = '{PREVIOUS}' WHERE key = 'format'")
    else:
        sql(url, *FORMAT_4_POSTGRES, f"UPDATE {{s}}.meta SET value = '{PREVIOUS}' WHERE key = 'format'")


def run(url: str, *args: str, tmp: Path) -> tuple[int, list[str], str]:
    env = {"HOME": str(tmp), "XDG_DATA_HOME": str(tmp / "data"), "XDG_CONFIG_HOME": str(tmp / "config")}
    result = CliRunner().invoke(cli, ["--store", url, *args], env=env)
    return result.exit_code, result.stderr.strip().splitlines(), result.stdout


def test_an_older_format_is_refused_by_every_command_until_ledger_upgrade(ledger, tmp_path):
    before = rows(ledger)
    make_previous_format(ledger)
    for args in COMMANDS:
        code, err, _ = run(ledger, *args, tmp=tmp_path)
        assert code == 1 and len(err) == 1, (args, err)
        assert f"has format {PREVIOUS}, older than this tpu-ledger's format {FORMAT_VERSION}" in err[0], (args, err)
        assert "`ledger upgrade`" in err[0], (args, err)
    assert stored_format(ledger) == PREVIOUS  # nobody upgraded it behind the older processes' back

    code, _, out = run(ledger, "upgrade", "--dry-run", tmp=tmp_path)
    assert code == 0 and f"from format {PREVIOUS} to {FORMAT_VERSION}" in out and "dry run" in out
    assert stored_format(ledger) == PREVIOUS

    code, _, out = run(ledger, "upgrade", tmp=tmp_path)
    assert code == 0 and out.startswith("upgraded ledger ") and f"from format {PREVIOUS} to {FORMAT_VERSION}" in out
    assert stored_format(ledger) == FORMAT_VERSION
    assert rows(ledger) == before  # not an event touched
    store = open_store(ledger, create=False)
    try:
        assert verify_store(store).ok
        store.append("a/a", [NewEvent("note", {"text": "after"})], expected_version=3)
    finally:
        store.close()

    code, _, out = run(ledger, "upgrade", "--json", tmp=tmp_path)
    assert code == 0 and json.loads(out) | {"store": None} == {
        "store": None, "from": FORMAT_VERSION, "to": FORMAT_VERSION, "upgraded": False, "dry_run": False}


def test_the_upgraded_ledger_has_the_new_formats_guarantees(ledger):
    make_previous_format(ledger)
    assert upgrade_store(ledger) == (PREVIOUS, FORMAT_VERSION)
    assert upgrade_store(ledger) == (FORMAT_VERSION, FORMAT_VERSION)
    if ledger.startswith("sqlite:///"):  # format 4's trigger replaced format 3's
        (definition,), = sql(ledger, "SELECT sql FROM sqlite_master WHERE name = 'events_contiguous'")
        assert "ORDER BY seq DESC LIMIT 1" in definition and "MAX(seq)" not in definition
    else:  # format 4's head trigger is gone: one append, one NOTIFY (not two), through append_one
        assert sql(ledger, "SELECT count(*) FROM pg_trigger WHERE tgrelid = '{s}.head'::regclass") == [(0,)]
        assert notified_by_one_append(ledger) == [str(len(rows(ledger)))]
    head = rows(ledger)[-1]
    with pytest.raises((sqlite3.IntegrityError, psycopg.Error)):  # still only grows at its head
        sql(ledger, "INSERT INTO {s}.events (seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash)"
                    f" VALUES ({head[0] + 2}, 'c/c', 1, 'note', '{head[4]}', '{{}}', 'x', NULL, '{{}}', '{head[10]}', '{'0' * 64}')")
    with pytest.raises((sqlite3.IntegrityError, psycopg.Error)):
        sql(ledger, "DELETE FROM {s}.events")
    assert len(rows(ledger)) == head[0]


def notified_by_one_append(url: str) -> list[str]:
    """The payloads LISTEN hears on the ledger's channel for one single-event append."""
    dsn, schema = split_url(url, None)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{schema}_appended"')
        store = open_store(url, create=False)
        try:
            store.append("c/c", [NewEvent("note", {"text": "heard"})])
        finally:
            store.close()
        return [n.payload for n in listener.notifies(timeout=2.0)]


@pytest.mark.parametrize("older", sorted(UPGRADABLE_FROM))
def test_every_upgradable_format_is_named_in_the_refusal(ledger, tmp_path, older):
    sql(ledger, f"UPDATE {{s}}.meta SET value = '{older}' WHERE key = 'format'")
    code, err, _ = run(ledger, "list", tmp=tmp_path)
    assert code == 1 and len(err) == 1 and f"format {older}, older than" in err[0] and f"format {FORMAT_VERSION}" in err[0]


def test_a_newer_format_is_refused_by_every_command_in_one_line(ledger, tmp_path):
    newer = FORMAT_VERSION + 1
    sql(ledger, f"UPDATE {{s}}.meta SET value = '{newer}' WHERE key = 'format'")
    for args in [*COMMANDS, ["upgrade"], ["upgrade", "--dry-run"]]:
        code, err, _ = run(ledger, *args, tmp=tmp_path)
        assert code == 1 and len(err) == 1, (args, err)
        assert f"has format {newer}, newer than this tpu-ledger's format {FORMAT_VERSION}" in err[0], (args, err)
    assert stored_format(ledger) == newer


def test_a_format_too_old_to_upgrade_says_how_to_move_it(ledger, tmp_path):
    sql(ledger, "UPDATE {s}.meta SET value = '1' WHERE key = 'format'")
    for args in (["list"], ["upgrade"]):
        code, err, _ = run(ledger, *args, tmp=tmp_path)
        assert code == 1 and len(err) == 1 and "format 1, older than" in err[0] and "ledger import" in err[0], err


def test_ledger_upgrade_waits_for_no_lease_holder(ledger, tmp_path):
    leases = open_leases(ledger)  # a reconciler of the older version, still running
    try:
        assert leases.acquire("member/recon-a", "recon-a", 300)
        make_previous_format(ledger)
        for args in (["upgrade"], ["upgrade", "--dry-run"]):
            code, err, _ = run(ledger, *args, tmp=tmp_path)
            assert code == 1 and len(err) == 1 and "in use: recon-a still holds a lease" in err[0], err
        assert stored_format(ledger) == PREVIOUS
        assert leases.release("member/recon-a", "recon-a")
    finally:
        leases.close()
    assert upgrade_store(ledger) == (PREVIOUS, FORMAT_VERSION)  # a released lease holds nothing


def test_ledger_upgrade_force_goes_past_a_dead_holders_lease(ledger, tmp_path):
    leases = open_leases(ledger)
    try:
        assert leases.acquire("member/recon-b", "recon-b", 300)  # died without releasing it
    finally:
        leases.close()
    make_previous_format(ledger)
    code, _, out = run(ledger, "upgrade", "--force", tmp=tmp_path)
    assert code == 0 and f"from format {PREVIOUS} to {FORMAT_VERSION}" in out
    assert stored_format(ledger) == FORMAT_VERSION
