"""What PostgreSQL itself enforces, whoever writes: append-only, growth at the head only, a
writer role without UPDATE/DELETE; and how the store opens."""

from __future__ import annotations

from urllib.parse import quote

import psycopg
import pytest

from ledger.errors import LedgerError, StoreError
from ledger.events import NewEvent
from ledger.store import open_store
from ledger.store.postgres import WRITER_ROLE, PostgresStore, split_url


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
        assert as_writer.acquire_lease("job:a/a", "me", 5)
        # ... and rewriting is refused by privileges, before any trigger runs.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_writer.execute("UPDATE {s}.events SET type = 'x'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_writer.execute("DELETE FROM {s}.events")
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
    import time

    reads = []
    head = pg.head
    pg.head = lambda: reads.append(1) or head()  # count the head reads while waiting
    assert pg.wait_for_append(3, timeout=1.0) == 3
    assert len(reads) <= 3  # a poller would have read the head dozens of times in 1 s

    reads.clear()
    writer = open_store(pg_url)
    timer = threading.Timer(0.5, lambda: writer.append("a/a", [NewEvent("note", {})]))
    started = time.monotonic()
    timer.start()
    try:
        assert pg.wait_for_append(3, timeout=30) == 4
    finally:
        timer.join()
        writer.close()
    assert time.monotonic() - started < 10 and len(reads) <= 4  # woken by the NOTIFY
