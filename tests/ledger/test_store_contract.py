"""The store contract, written once: every backend in ./backends/ must pass it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger.errors import ConflictError, UsageError
from ledger.events import GENESIS_HASH, NewEvent, actor, event_id
from ledger.replay import load_state, save_snapshot
from ledger.store import open_leases
from ledger.store.base import AppendWaiter, Cursors, Reader, Recorder, Snapshot, Snapshots, Store
from ledger.store.leases import Leases
from ledger.verify import verify_store

REPO = Path(__file__).resolve().parents[2]
WHO = actor("cli", "tester")


def note(text: str, key: str | None = None) -> NewEvent:
    return NewEvent("note", {"text": text}, WHO, key=key)


def spawn_writer(url: str, name: str, count: int, batch: int, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ledger.writer", url, name, str(count), str(batch), mode],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def check_sound(store) -> None:
    report = verify_store(store, transitions=False)
    assert report.ok, report.problem


def members(protocol: type) -> set[str]:
    """The methods and attributes a Protocol (and the protocols it extends) asks for."""
    return {
        name for klass in protocol.__mro__ if getattr(klass, "_is_protocol", False)
        for name in (*vars(klass), *getattr(klass, "__annotations__", {})) if not name.startswith("_")
    }


def test_every_backend_offers_each_interface(store_factory):
    store = store_factory()
    for protocol in (Reader, Recorder, Snapshots, Cursors, AppendWaiter, Store):
        missing = sorted(n for n in members(protocol) if not hasattr(store, n))
        assert not missing, f"{type(store).__name__} lacks {protocol.__name__}.{missing}"
    for leases in (store.leases(), open_leases(store.url)):
        try:
            assert not sorted(n for n in members(Leases) if not hasattr(leases, n))
            assert leases.acquire("job:a/a", "me", 30) and leases.get("job:a/a").holder == "me"
        finally:
            leases.close()
    assert members(Reader) >= {"head", "read_all", "raw_rows", "fold_rows", "hash_at", "url"}


# -- basics --------------------------------------------------------------------------------
def test_append_assigns_contiguous_positions_and_chains_hashes(store_factory):
    store = store_factory()
    first = store.append("alice/a", [note("1"), note("2")], expected_version=0)
    second = store.append("bob/b", [note("3")], expected_version=0)
    third = store.append("alice/a", [note("4")], expected_version=2)
    assert (first.positions, first.version) == ((1, 2), 2)
    assert (second.positions, second.version) == ((3,), 1)
    assert (third.positions, third.version) == ((4,), 3)
    events = list(store.read_all())
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[0].prev_hash == GENESIS_HASH
    assert all(b.prev_hash == a.hash for a, b in zip(events, events[1:], strict=False))
    assert all(e.expected_hash() == e.hash for e in events)
    assert [e.version for e in store.read_stream("alice/a")] == [1, 2, 3]
    assert [e.seq for e in store.read_stream("alice/a", after_version=1)] == [2, 4]
    assert [e.seq for e in store.read_all(after=2, limit=1)] == [3]
    assert store.head() == 4 and store.stream_version("alice/a") == 3 and store.stream_version("nobody/x") == 0
    assert store.streams() == ["alice/a", "bob/b"]
    assert store.get_event(events[2].id) == events[2]
    check_sound(store)


def test_stored_event_reads_back_exactly(store_factory):
    store = store_factory()
    spec = {"text": "héllo \"quoted\" \n", "nested": {"b": [1, 2.5, None, True], "a": {}}, "big": 2**53 + 1}
    data = {"spec": spec, "spec_hash": "ab" * 32, "commit": "c0ffee", "path": "jobs/alice/a.yaml"}
    store.append("alice/a", [NewEvent("submitted", data, actor("git", "ålice", approvers=["bob"]), causation="c0ffee")])
    event = next(store.read_all())
    assert event.data == data and event.actor["approvers"] == ["bob"] and event.causation == "c0ffee"
    check_sound(store)


def test_retried_append_is_a_no_op_returning_original_positions(store_factory):
    store = store_factory()
    batch = [note("a", key="k1"), note("b", key="k2")]
    first = store.append("alice/a", batch)
    store.append("bob/b", [note("other")])
    again = store.append("alice/a", batch)
    assert again.positions == first.positions and again.duplicate and not first.duplicate
    assert store.head() == 3
    assert store.get_event(event_id("alice/a", "k1")).seq == 1
    # The id is per stream: the same key on another stream is another event.
    assert not store.append("bob/b", [note("a", key="k1")]).duplicate


def test_expected_version_conflict(store_factory):
    store = store_factory()
    store.append("alice/a", [note("1")], expected_version=0)
    with pytest.raises(ConflictError) as info:
        store.append("alice/a", [note("2")], expected_version=0)
    assert (info.value.expected, info.value.actual) == (0, 1)
    assert "alice/a" in str(info.value)
    assert store.head() == 1


def test_append_many_is_atomic(store_factory):
    store = store_factory()
    store.append("alice/a", [note("1")])
    with pytest.raises(ConflictError):
        store.append_many([("bob/b", [note("2")], 0), ("alice/a", [note("3")], 0)])
    assert store.head() == 1 and store.stream_version("bob/b") == 0
    results = store.append_many([("bob/b", [note("2")], 0), ("alice/a", [note("3")], 1)])
    assert [r.positions for r in results] == [(2,), (3,)]


def test_unknown_type_and_bad_stream_are_refused(store_factory):
    store = store_factory()
    with pytest.raises(UsageError):
        store.append("alice/a", [NewEvent("exploded", {})])
    with pytest.raises(UsageError):
        store.append("", [note("x")])
    assert store.head() == 0


def test_database_refuses_update_and_delete(store_factory):
    store = store_factory()
    store.append("alice/a", [note("1"), note("2")])
    store.close()
    for sql in ("UPDATE events SET type = 'finished' WHERE seq = 1", "DELETE FROM events WHERE seq = 2"):
        with pytest.raises(Exception, match="append-only"):
            store_factory.raw_execute(store.url, sql)
    reopened = store_factory.reopen(store.url)
    assert [e.type for e in reopened.read_all()] == ["note", "note"]
    check_sound(reopened)


def test_database_refuses_inserts_that_do_not_extend_the_head(store_factory):
    store = store_factory()
    store.append("alice/a", [note("1")])
    e = next(store.read_all())
    forged = (
        "INSERT INTO events (seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash) "
        f"VALUES (5, 'alice/a', 2, 'note', '{e.time}', '{{}}', 'x-1', NULL, '{{}}', '{e.hash}', '{'0' * 64}')"
    )
    with pytest.raises(Exception, match="only grows at its head"):
        store_factory.raw_execute(store.url, forged)


def test_hand_edit_is_detected_by_verify(store_factory):
    store = store_factory()
    store.append("alice/a", [note("one"), note("two"), note("three")])
    check_sound(store)
    store_factory.tamper(store.url, 2, '{"text":"TWO"}')
    report = verify_store(store_factory.reopen(store.url))
    assert not report.ok
    assert report.problem.position == 2 and "hash mismatch" in report.problem.reason


def test_big_batches_are_stored_whole_and_in_order(store_factory):
    """Batches past the SQLite recorder's rows per INSERT statement (100), not a multiple of
    it: every event at its seq and version, chained, and a refused one stores none of them."""
    store = store_factory()
    store.append("a/a", [note("first")])
    result = store.append_many([("b/b", [note(f"b{i}") for i in range(250)], 0), ("c/c", [note("c")], None)])
    assert result[0].positions == tuple(range(2, 252)) and result[0].version == 250
    assert result[1].positions == (252,)
    assert [e.data["text"] for e in store.read_stream("b/b")] == [f"b{i}" for i in range(250)]
    with pytest.raises(ConflictError):
        store.append_many([("d/d", [note(f"d{i}") for i in range(150)], None), ("b/b", [note("late")], 3)])
    assert store.head() == 252 and store.stream_version("d/d") == 0
    copy = store_factory()
    copy.import_events(list(store.read_all()))
    assert [e.hash for e in copy.read_all()] == [e.hash for e in store.read_all()]
    check_sound(store)
    check_sound(copy)


def test_two_connections_taking_turns_with_single_events_stay_exact(store_factory):
    """Each writer's view of the head goes stale at every turn of the other: a lone event
    (SQLite: one autocommit INSERT from the cache) is refused by the database, then redone
    with every lookup, never written at a stale seq or version."""
    url = store_factory.new_url()
    a, b = store_factory.reopen(url), store_factory.reopen(url)
    for n in range(6):
        result = (a if n % 2 == 0 else b).append("s/s", [note(str(n), key=str(n))], expected_version=n)
        assert result.positions == (n + 1,) and result.version == n + 1 and not result.duplicate
    with pytest.raises(ConflictError):  # a last saw version 5; b wrote the 6th
        a.append("s/s", [note("stale")], expected_version=5)
    retried = a.append("s/s", [note("5", key="5")])  # b stored it: the original position returns
    assert retried.duplicate and retried.positions == (6,) and retried.version == 6
    assert a.append("t/t", [note("other stream")]).positions == (7,)
    assert b.append("s/s", [note("6")], expected_version=6).positions == (8,)
    assert [e.seq for e in a.read_all()] == list(range(1, 9))
    check_sound(a)


# -- several real processes ----------------------------------------------------------------
def test_concurrent_appends_from_processes_leave_no_gap_or_duplicate(store_factory):
    url = store_factory.new_url()
    store = store_factory.reopen(url)  # created before the children race to create it
    writers = [spawn_writer(url, f"w{i}", 30, 3, "free") for i in range(4)]
    for w in writers:
        out, err = w.communicate(timeout=240)
        assert w.returncode == 0, err
        assert out.count("ack") == 30
    assert store.head() == 4 * 30 * 3
    events = list(store.read_all())
    assert [e.seq for e in events] == list(range(1, 361))
    assert len({e.id for e in events}) == 360
    shared = store.read_stream("shared/stream")
    assert [e.version for e in shared] == list(range(1, 4 * 15 * 3 + 1))
    # A batch is contiguous in seq: appends from other processes never interleave inside it.
    batches: dict[tuple[str, int], list[int]] = {}
    for e in events:
        batches.setdefault((e.actor["name"], int(e.data["text"].split()[1])), []).append(e.seq)
    assert len(batches) == 120
    assert all(seqs == list(range(seqs[0], seqs[0] + 3)) for seqs in batches.values())
    check_sound(store)


def test_optimistic_writers_serialise_through_expected_version(store_factory):
    url = store_factory.new_url()
    store = store_factory.reopen(url)
    writers = [spawn_writer(url, f"o{i}", 25, 1, "optimistic") for i in range(3)]
    for w in writers:
        _, err = w.communicate(timeout=240)
        assert w.returncode == 0, err
    counter = store.read_stream("shared/counter")
    assert [e.version for e in counter] == list(range(1, 76))
    assert sorted(e.data["text"] for e in counter) == sorted(f"o{i}-{n}" for i in range(3) for n in range(25))


def test_kill_9_mid_append_loses_nothing_acknowledged(store_factory):
    url = store_factory.new_url()
    store_factory.reopen(url)  # the ledger exists before the child starts
    child = spawn_writer(url, "k", 0, 40, "forever")
    acked: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + 120
    try:
        while len(acked) < 15 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            _, n, first, last = line.split()
            acked.append((int(n), int(first), int(last)))
        os.kill(child.pid, signal.SIGKILL)  # very likely inside an append by now: it loops on them
    finally:
        child.kill()
        child.wait(timeout=60)
    assert len(acked) >= 15, child.stderr.read()
    reopened = store_factory.reopen(url)
    check_sound(reopened)
    events = reopened.read_stream("k/own")
    by_batch: dict[int, list[int]] = {}
    for e in events:
        by_batch.setdefault(int(e.data["text"].split()[1]), []).append(e.seq)
    for n, first, last in acked:  # everything acknowledged is there, where it was reported
        assert by_batch[n] == list(range(first, last + 1))
    assert all(len(seqs) == 40 for seqs in by_batch.values())  # no batch half-written
    assert reopened.head() == len(events)


# -- snapshots and cursors -----------------------------------------------------------------
def test_snapshots_are_tied_to_code_version(store_factory):
    store = store_factory()
    store.save_snapshot(Snapshot.seal("ledger", "code-a", 10, "h10", b"A10"))
    store.save_snapshot(Snapshot.seal("ledger", "code-a", 20, "h20", b"A20"))
    store.save_snapshot(Snapshot.seal("ledger", "code-b", 30, "h30", b"B30"))
    assert store.load_snapshot("ledger", "code-a").state == b"A20"
    assert store.load_snapshot("ledger", "code-a", at_most=15).state == b"A10"
    assert store.load_snapshot("ledger", "code-a", at_most=5) is None
    assert store.load_snapshot("ledger", "code-c") is None


def test_snapshot_from_other_code_is_ignored_by_replay(store_factory):
    store = store_factory()
    store.append("alice/a", [NewEvent("submitted", {"spec": {}, "spec_hash": "ab" * 8, "commit": "c1", "path": "jobs/alice/a.yaml"})])
    store.save_snapshot(Snapshot.seal("ledger", "not-this-code", 1, "h1", b"garbage that must not be read"))
    assert load_state(store).jobs["alice/a"].state == "pending"
    save_snapshot(store, load_state(store))
    assert load_state(store).jobs["alice/a"].state == "pending"


def test_cursors_only_move_forward(store_factory):
    store = store_factory()
    assert store.get_cursor("fanout") == 0
    store.set_cursor("fanout", 5)
    store.set_cursor("fanout", 3)
    assert store.get_cursor("fanout") == 5
    store.set_cursor("fanout", 9)
    assert store_factory.reopen(store.url).get_cursor("fanout") == 9


def test_position_at_time_and_wait_for_append(store_factory):
    store = store_factory()
    store.append("alice/a", [
        NewEvent("note", {}, time="2026-01-01T00:00:00.000000Z"),
        NewEvent("note", {}, time="2026-01-02T00:00:00.000000Z"),
    ])
    assert store.position_at_time("2025-12-31T00:00:00.000000Z") == 0
    assert store.position_at_time("2026-01-01T12:00:00.000000Z") == 1
    assert store.position_at_time("2027-01-01T00:00:00.000000Z") == 2
    assert store.wait_for_append(2, timeout=0.05) == 2
    child = spawn_writer(store.url, "late", 1, 1, "free")
    try:
        assert store.wait_for_append(2, timeout=120) >= 3
    finally:
        child.communicate(timeout=120)


def test_fold_and_raw_rows_agree_with_read_all(store_factory):
    from ledger.events import body_text, dumps, row_hash

    store = store_factory()
    store.append("alice/a", [note("x"), note("y")])
    store.append("bob/b", [note("z")])
    events = list(store.read_all())
    rows = list(store.raw_rows())
    assert [r[0] for r in rows] == [1, 2, 3]
    for e, r in zip(events, rows, strict=True):
        assert r[5] == dumps(e.actor) and r[8] == dumps(e.data)
        assert row_hash(r[9], body_text(*r[:10])) == e.hash
    assert list(store.fold_rows(1, 2)) == [(2, "alice/a", 2, "note", events[1].time, dumps(events[1].data))]


def test_stream_rows_are_those_streams_events_of_those_types_up_to_a_seq(store_factory):
    """What `ledger tpus` reads its TPUs' health from: fold rows, one query, in seq order."""
    from ledger.events import NewEvent, dumps

    store = store_factory()
    store.append("alice/a", [note("x"), NewEvent("queued", {"reason": "r"})])
    store.append("bob/b", [note("y"), NewEvent("queued", {"reason": "s"})])
    store.append("alice/a", [NewEvent("queued", {"reason": "t"})])
    store.append("carol/c", [NewEvent("queued", {"reason": "u"})])
    by_seq = {e.seq: e for e in store.read_all()}

    def fold_row(seq: int) -> tuple:
        e = by_seq[seq]
        return (e.seq, e.stream, e.version, e.type, e.time, dumps(e.data))

    assert store.stream_rows({"alice/a", "bob/b"}, {"queued"}, 99) == [fold_row(2), fold_row(4), fold_row(5)]
    assert store.stream_rows(["alice/a", "bob/b"], ["queued", "note"], 4) == [fold_row(s) for s in (1, 2, 3, 4)]
    assert store.stream_rows({"alice/a"}, {"queued"}, 1) == []
    assert store.stream_rows(set(), {"queued"}, 99) == [] and store.stream_rows({"nobody/x"}, {"queued"}, 99) == []


def test_partly_stored_batch_is_refused(store_factory):
    store = store_factory()
    store.append("alice/a", [note("a", key="k1")])
    with pytest.raises(UsageError, match="stored already"):
        store.append("alice/a", [note("a", key="k1"), note("b", key="k2")])
    assert store.head() == 1
