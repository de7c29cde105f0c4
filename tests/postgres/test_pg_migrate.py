"""`ledger migrate` between SQLite and PostgreSQL, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.app.commands.migrate import verify_chain
from ledger.events import NewEvent, actor
from ledger.store import open_store

REPO = Path(__file__).resolve().parents[2]


def ledger(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ledger", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.fixture
def sqlite_ledger(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url)
    who = actor("git", "alice@example.com", approvers=["bob@example.com"])
    for i in range(12):
        submitted = {"spec": {"i": i, "f": 0.5, "name": "é"}, "spec_hash": "ab" * 32, "commit": "c0ffee", "path": f"jobs/team{i % 3}/job{i}.yaml"}
        store.append(f"team{i % 3}/job{i}", [NewEvent("submitted", submitted, who, key=f"s{i}")])
        store.append_many([(f"team{i % 3}/job{i}", [NewEvent("queued", {"reason": f"try {n}"}, key=f"q{i}-{n}") for n in range(40)], 1)])
    store.close()
    return url


def test_migrate_sqlite_to_postgres_and_back_with_the_chain_verified(sqlite_ledger, pg_url, tmp_path):
    done = ledger("migrate", "--from", sqlite_ledger, "--to", pg_url, "--batch", "100", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["events"] == summary["copied"] == 12 * 41 and summary["already_present"] == 0
    assert summary["source_verified"] and summary["destination_verified"]
    src, dst = open_store(sqlite_ledger, create=False), open_store(pg_url, create=False)
    try:
        assert list(dst.read_all()) == list(src.read_all())
        assert verify_chain(dst).head_hash == summary["head_hash"]
        # The copy is a live ledger: it continues the same chain.
        dst.append("team0/job0", [NewEvent("started", {})], expected_version=41)
    finally:
        src.close()
        dst.close()
    back = f"sqlite:///{tmp_path / 'back.db'}"
    again = ledger("migrate", "--from", pg_url, "--to", back)
    assert again.returncode == 0, again.stderr
    assert "chain verified on both ends" in again.stdout and "493 events" in again.stdout


def test_an_interrupted_migration_resumes_and_a_foreign_destination_is_refused(sqlite_ledger, pg_url, new_pg_url):
    src = open_store(sqlite_ledger, create=False)
    dst = open_store(pg_url)
    dst.import_events(list(src.read_all(limit=100)))  # what an interrupted run leaves
    dst.close()
    src.close()
    resumed = ledger("migrate", "--from", sqlite_ledger, "--to", pg_url, "--json")
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert (summary["already_present"], summary["copied"]) == (100, 392)

    other = open_store(new_pg_url())
    other.append("someone/else", [NewEvent("note", {})])
    other.close()
    refused = ledger("migrate", "--from", sqlite_ledger, "--to", other.url)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: destination's event 1 differs") and "Traceback" not in refused.stderr


def test_a_broken_source_is_refused_before_anything_is_copied(sqlite_ledger, pg_url):
    import sqlite3

    path = sqlite_ledger.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:  # tamper the way an attacker with file access would
        db.execute("DROP TRIGGER events_no_update")
        db.execute("""UPDATE events SET data = '{"n":999}' WHERE seq = 7""")
    failed = ledger("migrate", "--from", sqlite_ledger, "--to", pg_url)
    assert failed.returncode == 1
    assert "seq 7" in failed.stderr and "Traceback" not in failed.stderr
    dst = open_store(pg_url)
    assert dst.head() == 0
    dst.close()
