"""What PostgreSQL itself enforces, whoever writes: append-only, growth at the head only, a
writer role without UPDATE/DELETE; and how the store opens."""

from __future__ import annotations

from urllib.parse import quote

import psycopg
import pytest
from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.errors import ConflictError, LedgerError, StoreError
from ledger.events import NewEvent
from ledger.store import open_store, upgrade_store
from ledger.store.base import FORMAT_VERSION
from ledger.store.postgres import WRITER_ROLE, PostgresStore, recorder, split_url
from ledger.verify import verify_store


@pytest.fixture
def pg(pg_url):
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    store.append("a/a", [NewEvent("note", {"text": str(i)}) for i in range(3)])
    yield store
    store.close()


def raw(store: PostgresStore):
    dsn, _ = split_url(store.url, None)
    return psycopg.connect(dsn, autocommit=True)


@pytest.mark.parametrize("statement", [
    "UPDATE {s}.events SET data = '{{}}' WHERE seq = 2",
    "DELETE FROM {s}.events WHERE seq = 3",
    "TRUNCATE {s}.events",
])
def test_the_database_refuses_to_change_or_remove_events(pg, statement):
    with raw(pg) as conn, pytest.raises(psycopg.Error, match="append-only"):
        conn.execute(statement.format(s=f'"{pg.schema}"'))
    assert pg.head() == 3 and [e.data["text"] for e in pg.read_all()] == ["0", "1", "2"]


def test_a_raw_insert_can_only_extend_the_chain_at_its_head(pg):
    last = list(pg.raw_rows(0))[-1]
    cols = "seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash"
    bad_rows = [
        (5, "a/a", 4, "note", "t", "{}", "id-gap", None, "{}", last[10], "h"),  # skips seq 4
        (4, "a/a", 4, "note", "t", "{}", "id-prev", None, "{}", "f" * 64, "h"),  # wrong prev_hash
        (4, "a/a", 9, "note", "t", "{}", "id-ver", None, "{}", last[10], "h"),  # version jump
    ]
    with raw(pg) as conn:
        for row in bad_rows:
            with pytest.raises(psycopg.Error, match="only grows at its head"):
                conn.execute(f'INSERT INTO "{pg.schema}".events ({cols}) VALUES ({", ".join(["%s"] * 11)})', row)
        # Several rows at once: each is checked against the row before it in the batch.
        first = (4, "a/a", 4, "note", "t", "{}", "id-ok", None, "{}", last[10], "h4")
        for second in [
            (5, "a/a", 5, "note", "t", "{}", "id-2", None, "{}", "not-h4", "h5"),  # broken link
            (6, "a/a", 5, "note", "t", "{}", "id-2", None, "{}", "h4", "h5"),  # gap inside the batch
            (5, "a/a", 7, "note", "t", "{}", "id-2", None, "{}", "h4", "h5"),  # version jump
        ]:
            with pytest.raises(psycopg.Error, match="only grows at its head"):
                conn.execute(
                    f'INSERT INTO "{pg.schema}".events ({cols}) VALUES ({", ".join(["%s"] * 11)}), ({", ".join(["%s"] * 11)})',
                    first + second,
                )
    assert pg.head() == 3 and chain_rows(pg) == 3


def chain_rows(store) -> int:
    return sum(1 for _ in store.raw_rows(0))


def test_the_writer_role_appends_but_holds_no_update_or_delete_privilege(pg):
    with raw(pg) as conn:
        privileges = {
            p: conn.execute("SELECT has_table_privilege(%s, %s, %s)", (WRITER_ROLE, f'"{pg.schema}".events', p)).fetchone()[0]
            for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
        }
    assert privileges == {"SELECT": True, "INSERT": True, "UPDATE": False, "DELETE": False, "TRUNCATE": False}
    # Connected as the role (what a reconciler host would use), appends and reads work ...
    as_writer = PostgresStore(f"{pg.url}&options={quote('-c role=' + WRITER_ROLE)}", create=False)
    try:
        assert as_writer.append("a/a", [NewEvent("note", {})], expected_version=3).positions == (4,)
        as_writer.set_cursor("fanout", 4)
        assert as_writer.leases().acquire("job:a/a", "me", 5)
        as_writer.refresh_statistics()  # not the table's owner: the server skips it with a warning
        # ... and rewriting is refused by privileges, before any trigger runs.
        with raw(as_writer) as conn:
            for statement in ("UPDATE {s}.events SET type = 'x'", "DELETE FROM {s}.events"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement.format(s=f'"{pg.schema}"'))
    finally:
        as_writer.close()
    assert pg.head() == 4


def test_open_store_routes_postgres_urls_and_checks_the_format(pg, pg_url):
    again = open_store(pg_url.replace("postgresql://", "postgres://"), create=False)
    try:
        assert isinstance(again, PostgresStore) and again.head() == 3
    finally:
        again.close()
    with raw(pg) as conn:
        conn.execute(f"""ALTER TABLE "{pg.schema}".meta DISABLE TRIGGER ALL""")
        conn.execute(f"""UPDATE "{pg.schema}".meta SET value = '99' WHERE key = 'format'""")
    with pytest.raises(StoreError, match="newer"):
        PostgresStore(pg.url)


def test_errors_are_one_line_without_a_password():
    with pytest.raises(LedgerError) as info:
        PostgresStore("postgresql://someone:s3cret@127.0.0.1:1/nothing")
    assert "s3cret" not in str(info.value) and "cannot connect" in str(info.value)
    with pytest.raises(StoreError, match="schema name"):
        PostgresStore("postgresql://127.0.0.1/x?schema=Robert'); DROP")


def test_wait_for_append_sleeps_on_listen_instead_of_polling(pg, pg_url):
    import threading

    reads = []
    head = pg.head
    pg.head = lambda: reads.append(1) or head()  # count the head reads while waiting
    assert pg.wait_for_append(3, timeout=1.0) == 3
    assert len(reads) <= 3  # a poller would have read the head dozens of times in 1 s

    reads.clear()
    writer = open_store(pg_url)
    timer = threading.Timer(0.5, lambda: writer.append("a/a", [NewEvent("note", {})]))
    timer.start()
    try:
        # an hour's timeout: returning with the new head means the NOTIFY woke it (how fast
        # is a figure: bench/lease_bench.py); few head reads mean it slept rather than polled
        assert pg.wait_for_append(3, timeout=3600) == 4
    finally:
        timer.join()
        writer.close()
    assert len(reads) <= 4


def test_a_one_event_append_keeps_every_rule_of_a_batch(pg):
    """One event on one stream goes through append_one (scalar arguments), not append_batches:
    the same fencing, idempotency, chain and a single NOTIFY with the new head."""
    s = f'"{pg.schema}"'
    with raw(pg) as listener:
        listener.execute(f'LISTEN "{pg.schema}_appended"')
        first = pg.append("a/a", [NewEvent("note", {"text": "k"}, key="k")], expected_version=3)
        assert (first.positions, first.version, first.duplicate) == ((4,), 4, False)
        assert [n.payload for n in listener.notifies(timeout=1.0)] == ["4"]  # one, not one per trigger
        # A retry of the keyed event stores nothing and answers with its position, whatever
        # the expected version says now (the first attempt's answer may have been lost).
        again = pg.append("a/a", [NewEvent("note", {"text": "k"}, key="k")], expected_version=3)
        assert (again.positions, again.version, again.duplicate) == ((4,), 4, True)
        # A fenced writer (a stale expected version) is refused and stores nothing.
        with pytest.raises(ConflictError) as info:
            pg.append("a/a", [NewEvent("note", {"text": "stale"})], expected_version=3)
        assert (info.value.expected, info.value.actual) == (3, 4)
        assert [n.payload for n in listener.notifies(timeout=0.5)] == []  # nothing moved, nothing said
    assert pg.head() == 4 and verify_store(pg).ok  # the server's hash is ledger.events' hash
    with raw(pg) as conn:
        assert conn.execute(f"SELECT count(*) FROM pg_trigger WHERE tgrelid = '{s}.head'::regclass").fetchone() == (0,)


def test_no_upsert_or_merge_removes_or_rewrites_a_row(pg):
    """PostgreSQL has no silent REPLACE: every way to overwrite or drop a row is an UPDATE or
    a DELETE, and the row triggers refuse those whoever writes (a raw psycopg connection)."""
    before = list(pg.raw_rows(0))
    first, last = before[0], before[-1]
    events = f'"{pg.schema}".events'
    cols = "seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash"
    at_head = (4, "a/a", 4, "note", last[4], "{}", first[6], None, "{}", last[10], "0" * 64)  # reuses seq 1's id
    marks = ", ".join(["%s"] * 11)
    with raw(pg) as conn:
        for statement in (
            f"INSERT INTO {events} ({cols}) VALUES ({marks}) ON CONFLICT (id) DO UPDATE SET data = excluded.data",
            f"MERGE INTO {events} e USING (SELECT %s AS id) n ON e.id = n.id WHEN MATCHED THEN DELETE",
            f"MERGE INTO {events} e USING (SELECT %s AS id) n ON e.id = n.id WHEN MATCHED THEN UPDATE SET data = '{{}}'",
        ):
            params = at_head if statement.startswith("INSERT") else (first[6],)
            with pytest.raises(psycopg.Error, match="append-only"):
                conn.execute(statement, params)
        # DO NOTHING keeps the stored row and adds nothing.
        conn.execute(f"INSERT INTO {events} ({cols}) VALUES ({marks}) ON CONFLICT DO NOTHING", at_head)
    assert list(pg.raw_rows(0)) == before and pg.head() == 3


def test_a_format_2_ledger_is_upgraded_in_place_by_ledger_upgrade(pg, pg_url):
    before = list(pg.raw_rows(0))
    s = f'"{pg.schema}"'
    with raw(pg) as conn, conn.transaction():  # what a format-2 schema holds: unchecked snapshots
        conn.execute(f"ALTER TABLE {s}.snapshots DROP COLUMN event_hash, DROP COLUMN hash")
        conn.execute(f"INSERT INTO {s}.snapshots VALUES ('ledger', 'old', 3, '\\x00')")
        conn.execute(f"UPDATE {s}.meta SET value = '2' WHERE key = 'format'")
    with pytest.raises(StoreError, match="has format 2, older than"):
        open_store(pg_url, create=False)  # opening it is not upgrading it
    assert upgrade_store(pg_url, dry_run=True) == (2, FORMAT_VERSION)
    with raw(pg) as conn:  # the dry run rolled back
        assert conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'format'").fetchone() == ("2",)
    assert upgrade_store(pg_url) == (2, FORMAT_VERSION)
    again = open_store(pg_url, create=False)
    try:
        with raw(pg) as conn:
            assert conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'format'").fetchone() == (str(FORMAT_VERSION),)
            assert conn.execute(f"SELECT count(*) FROM {s}.snapshots").fetchone() == (0,)
        assert again.list_snapshots() == [] and list(again.raw_rows(0)) == before and verify_store(again).ok
        again.append("a/a", [NewEvent("note", {})], expected_version=3)
    finally:
        again.close()


def test_a_read_command_on_a_broken_ledger_schema_says_so_in_one_line(pg, pg_url):
    with raw(pg) as conn:
        conn.execute(f'DROP TABLE "{pg.schema}".events CASCADE')  # what a careless admin could do
    for args in (["list"], ["tpus"], ["export"], ["verify"], ["inspect", "a/a"]):
        result = CliRunner().invoke(cli, ["--store", pg_url, *args])
        assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ledger ") and "does not exist" in lines[0], lines



def test_paged_reads_with_read_ahead_return_each_row_once_in_order(pg, monkeypatch):
    """Pages of 2 rows: every read crosses pages, and each next page is read on the helper
    thread while the caller holds the one before."""
    monkeypatch.setattr(recorder, "PAGE", 2)
    pg.append("b/b", [NewEvent("note", {"text": str(i)}) for i in range(6)])  # seq 4..9
    assert [e.seq for e in pg.read_all()] == list(range(1, 10))
    assert [e.seq for e in pg.read_all(after=2, limit=5)] == [3, 4, 5, 6, 7]
    assert [e.seq for e in pg.read_all(after=2, limit=4)] == [3, 4, 5, 6]
    assert [r[0] for r in pg.fold_rows(1, 8)] == list(range(2, 9))
    assert [r[0] for r in pg.raw_rows(0, 4)] == [1, 2, 3, 4]
    rows = pg.fold_rows(0, None)
    assert next(rows)[0] == 1  # a read left unfinished: the connection still serves others
    rows.close()
    assert pg.head() == 9 and pg.append("a/a", [NewEvent("note", {})], expected_version=3).positions == (10,)


def test_a_paged_read_asks_for_each_page_by_its_seqs(pg, monkeypatch):
    """Each page is asked as the seqs it holds (after + 1 .. after + PAGE), never as "the next
    PAGE rows after": a server without statistics (a ledger just migrated, before autovacuum's
    ANALYZE) plans an open range as a scan of all of it and a sort, for every page (a replay
    of 1M such events read in 12 s, not 3). Only a short page of an open read asks the open
    way, once, at the head."""
    monkeypatch.setattr(recorder, "PAGE", 2)
    pg.append("b/b", [NewEvent("note", {"text": str(i)}) for i in range(6)])  # seq 4..9
    asked: list[tuple] = []
    execute = pg._db.execute
    monkeypatch.setattr(pg._db, "execute", lambda q, params=None: asked.append(params) or execute(q, params))
    assert [r[0] for r in pg.fold_rows()] == list(range(1, 10))
    *pages, head = [(after, upper) for after, upper, size in asked]
    assert pages == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)] and head == (9, recorder._NO_LIMIT)  # the open ask at the head
    asked.clear()
    assert [r[0] for r in pg.fold_rows(5, 9)] == [6, 7, 8, 9] and [a[:2] for a in asked] == [(5, 7), (7, 9)]  # one ask a page


def test_a_paged_read_reads_past_a_gap_in_seq_and_verify_reports_it(pg, monkeypatch):
    """The growth trigger keeps seqs without gaps; should its owner turn it off and leave one,
    a read still returns the rows past it, and verify says where the ledger broke."""
    monkeypatch.setattr(recorder, "PAGE", 2)
    pg.append("b/b", [NewEvent("note", {"text": str(i)}) for i in range(4)])  # seq 4..7
    s = f'"{pg.schema}"'
    with raw(pg) as conn:
        conn.execute(f"ALTER TABLE {s}.events DISABLE TRIGGER events_grow_at_head")
        conn.execute(f"INSERT INTO {s}.events (seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash) "
                     f"SELECT 12, stream, 99, type, time, actor, 'gap', causation, data, prev_hash, hash FROM {s}.events WHERE seq = 7")
        conn.execute(f"UPDATE {s}.head SET seq = 12")
        conn.execute(f"ALTER TABLE {s}.events ENABLE TRIGGER events_grow_at_head")
    assert [r[0] for r in pg.fold_rows(0, 12)] == [1, 2, 3, 4, 5, 6, 7, 12]
    assert [r[0] for r in pg.raw_rows(5, 12)] == [6, 7, 12]
    assert [e.seq for e in pg.read_all(after=5)] == [6, 7, 12]
    report = verify_store(pg)
    assert not report.ok and report.problem.reason == "seq is not contiguous: expected 8, found 12"


def test_a_migration_leaves_the_planner_statistics_for_the_events_it_loaded(pg, tmp_path):
    """After a bulk load the server's planner knows the table (ANALYZE): reads are planned for
    its size at once, not after autovacuum's next round (or never, where it is off)."""
    source = open_store(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        source.append("b/b", [NewEvent("note", {"text": str(i)}) for i in range(20)])
    finally:
        source.close()
    empty = f"{pg.url.split('schema=')[0]}schema={pg.schema}_to"
    result = CliRunner().invoke(cli, ["migrate", "--from", f"sqlite:///{tmp_path / 'ledger.db'}", "--to", empty])
    assert result.exit_code == 0, result.output
    with raw(pg) as conn:
        analyzed = conn.execute("SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables "
                                "WHERE schemaname = %s AND relname = 'events'", (f"{pg.schema}_to",)).fetchone()
        conn.execute(f'DROP SCHEMA "{pg.schema}_to" CASCADE')
    assert analyzed == (True,)
