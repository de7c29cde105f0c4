"""The store contract, run unchanged on SQLite and PostgreSQL (`store` is parametrised)."""

from __future__ import annotations

import threading
import time

import pytest

from ledger.errors import ConflictError, LedgerError, UsageError
from ledger.events import GENESIS_HASH, NewEvent, body_text, row_hash
from ledger.store.base import Snapshot


def ev(type_: str = "note", key: str | None = None, **data) -> NewEvent:
    return NewEvent(type_, data, key=key)


def submitted(spec: dict) -> NewEvent:
    return ev("submitted", spec=spec, spec_hash="ab" * 32, commit="c0ffee", path="jobs/a/b.yaml")


def chain_ok(store) -> int:
    seq, prev = 0, GENESIS_HASH
    for row in store.raw_rows(0):
        assert row[0] == seq + 1
        assert row[9] == prev
        assert row_hash(row[9], body_text(*row[:10])) == row[10]
        seq, prev = row[0], row[10]
    return seq


def test_append_assigns_positions_versions_and_a_verifiable_chain(store):
    r1 = store.append("alice/a", [submitted({}), ev(text="2")], expected_version=0)
    r2 = store.append("bob/b", [submitted({"text": "é\n\"日本\"\x01", "f": 0.1, "big": 10**20})])
    r3 = store.append("alice/a", [ev(text="3")], expected_version=2)
    assert (r1.positions, r1.version, r1.duplicate) == ((1, 2), 2, False)
    assert (r2.positions, r2.version) == ((3,), 1)
    assert (r3.positions, r3.version) == ((4,), 3)
    assert store.head() == 4
    assert chain_ok(store) == 4
    events = list(store.read_all())
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[2].data["spec"] == {"text": "é\n\"日本\"\x01", "f": 0.1, "big": 10**20}
    assert all(e.expected_hash() == e.hash for e in events)
    assert events[0].prev_hash == GENESIS_HASH and events[1].prev_hash == events[0].hash
    assert [e.version for e in store.read_stream("alice/a")] == [1, 2, 3]
    assert [e.version for e in store.read_stream("alice/a", after_version=2)] == [3]
    assert store.get_event(events[1].id) == events[1]
    assert store.get_event("no-such-id") is None


def test_wrong_expected_version_is_a_conflict_and_stores_nothing(store):
    store.append("alice/a", [ev()], expected_version=0)
    with pytest.raises(ConflictError) as info:
        store.append("alice/a", [ev(), ev()], expected_version=0)
    assert (info.value.stream, info.value.expected, info.value.actual) == ("alice/a", 0, 1)
    assert store.head() == 1 and store.stream_version("alice/a") == 1
    with pytest.raises(ConflictError):  # one event: the call on the connection's kept cursor
        store.append("alice/a", [ev()], expected_version=0)
    assert store.append("alice/a", [ev()], expected_version=1).version == 2  # that cursor serves the next one
    assert store.head() == 2


def test_a_retried_append_returns_the_original_positions(store):
    store.append("x/other", [ev()])
    first = store.append("alice/a", [ev(key="k1"), ev(key="k2")], expected_version=0)
    again = store.append("alice/a", [ev(key="k1"), ev(key="k2")], expected_version=0)
    assert again.duplicate and again.positions == first.positions == (2, 3) and again.version == 2
    assert store.head() == 3
    with pytest.raises(UsageError, match="stored already"):  # half a retry is not a retry
        store.append("alice/a", [ev(key="k2"), ev(key="k3")])
    assert store.head() == 3


def test_a_batch_repeating_a_key_is_refused(store):
    with pytest.raises(UsageError):
        store.append("alice/a", [ev(key="same"), ev(key="same")])
    assert store.head() == 0


def test_unknown_types_and_bad_streams_are_refused(store):
    with pytest.raises(UsageError):
        store.append("alice/a", [NewEvent("no_such_type", {})])
    with pytest.raises(UsageError):
        store.append("", [ev()])
    assert store.head() == 0


def test_append_many_is_one_transaction(store):
    store.append("bob/b", [ev()])
    results = store.append_many([("alice/a", [ev(), ev()], 0), ("bob/b", [ev()], 1), ("alice/a", [ev()], 2)])
    assert [r.positions for r in results] == [(2, 3), (4,), (5,)]
    assert [r.version for r in results] == [2, 2, 3]
    with pytest.raises(ConflictError):
        store.append_many([("carol/c", [ev()], 0), ("bob/b", [ev()], 0)])
    assert store.head() == 5 and store.stream_version("carol/c") == 0
    assert chain_ok(store) == 5


def test_reads_after_limit_until_and_streams(store):
    for i in range(25):
        store.append(f"u/j{i % 4}", [ev(text=str(i), type_="note")])
    assert [e.seq for e in store.read_all(after=20)] == [21, 22, 23, 24, 25]
    assert [e.seq for e in store.read_all(after=3, limit=4)] == [4, 5, 6, 7]
    assert [r[0] for r in store.raw_rows(10, 13)] == [11, 12, 13]
    folds = list(store.fold_rows(0, 2))
    assert [r[:4] for r in folds] == [(1, "u/j0", 1, "note"), (2, "u/j1", 1, "note")]
    assert folds[1][5] == '{"text":"1"}'
    assert store.streams() == ["u/j0", "u/j1", "u/j2", "u/j3"]
    assert store.stream_version("u/j1") == 6 and store.stream_version("nobody/x") == 0


def test_position_at_time(store):
    store.append("a/a", [NewEvent("note", {}, time="2026-01-01T00:00:00.000000Z")])
    store.append("a/a", [NewEvent("note", {}, time="2026-01-02T00:00:00.000000Z")])
    store.append("a/a", [NewEvent("note", {}, time="2026-01-03T00:00:00.000000Z")])
    assert store.position_at_time("2025-12-31T00:00:00.000000Z") == 0
    assert store.position_at_time("2026-01-02T00:00:00.000000Z") == 2
    assert store.position_at_time("2027-01-01T00:00:00.000000Z") == 3


def test_snapshots_keep_the_newest_and_respect_at_most(store):
    for pos in (10, 20, 30, 40):
        store.save_snapshot(Snapshot.seal("ledger", "v1", pos, f"h{pos}", f"state{pos}".encode()))
    store.save_snapshot(Snapshot.seal("ledger", "v2", 5, "h5", b"other code"))
    assert store.load_snapshot("ledger", "v1").state == b"state40"
    assert store.load_snapshot("ledger", "v1", at_most=35).position == 30
    assert store.load_snapshot("ledger", "v1", at_most=15) is None  # pruned: newest few kept
    assert store.load_snapshot("ledger", "v3") is None
    store.save_snapshot(again := Snapshot.seal("ledger", "v1", 40, "h40", b"again"))
    assert store.load_snapshot("ledger", "v1") == again and again.intact


def test_cursors_only_move_forward(store):
    assert store.get_cursor("fanout") == 0
    store.set_cursor("fanout", 7)
    store.set_cursor("fanout", 3)
    assert store.get_cursor("fanout") == 7
    store.set_cursor("fanout", 9)
    assert store.get_cursor("fanout") == 9


def test_import_copies_sealed_events_and_refuses_a_broken_chain(store, new_ledger_url):
    from ledger.store import open_store

    store.append("a/a", [ev(text=str(i)) for i in range(5)])
    events = list(store.read_all())
    other = open_store(new_ledger_url())
    try:
        other.import_events(events[:3])
        with pytest.raises(LedgerError):
            other.import_events(events[4:])  # skips seq 4
        forged = events[3].__class__(**{**events[3].to_dict(), "data": {"text": "99"}})
        with pytest.raises(LedgerError):
            other.import_events([forged])
        other.import_events(events[3:])
        assert list(other.read_all()) == events
    finally:
        other.close()


def test_a_second_handle_sees_appends_and_wait_for_append_wakes(store_factory):
    writer, reader = store_factory(), store_factory()
    assert reader.wait_for_append(0, timeout=0.2) == 0  # times out, nothing there
    woke: list[int] = []

    def wait() -> None:
        woke.append(reader.wait_for_append(0, timeout=3600))

    # The waiter would sleep an hour: returning at all means the append woke it. (How fast:
    # bench/lease_bench.py, append -> wait_for_append wakes.)
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    time.sleep(0.2)  # let the waiter block first: this is what the test is about
    writer.append("a/a", [ev()])
    thread.join(timeout=120)
    assert not thread.is_alive(), "the append did not wake the waiter"
    assert woke == [1]
    assert reader.wait_for_append(0, timeout=5) == 1  # already past: returns at once


def test_open_without_create_refuses_a_missing_ledger(store_factory):
    with pytest.raises(LedgerError):
        store_factory(create=False)
