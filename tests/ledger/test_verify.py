"""`verify` finds the first bad position and says why, for each kind of damage."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import sqlite3
import threading
from collections.abc import Iterator

import pytest

from ledger import fold
from ledger.capacity_snapshot import load_capacity, save_capacity
from ledger.events import GENESIS_HASH, Event, NewEvent, random_id
from ledger.replay import load_state, save_snapshot, tied_snapshot
from ledger.shelf import settled
from ledger.usage.snapshot import code_version as usage_code
from ledger.usage.snapshot import encode, load_usage, save_usage, snapshot_name
from ledger.verify import (
    CHILD_SHARE,
    _Walk,
    verify_ledger,
    verify_rows,
    verify_snapshots,
    verify_store,
)
from tests.ledger.test_replay import finished, insert_encoded
from tests.reconciler.test_live import at
from tests.reconciler.test_live import events as live_events

SUBMIT = {"spec": {}, "spec_hash": "ab12cd34", "commit": "c0ffee", "path": "jobs/alice/a.yaml"}


def sample(store_factory):
    store = store_factory()
    store.append("alice/a", [NewEvent("submitted", SUBMIT), NewEvent("queued", {"reason": "capacity"})])
    store.append("bob/b", [NewEvent("submitted", SUBMIT)])
    store.append("alice/a", [NewEvent("provisioning", {"attempt": 1, "tpu": {"name": "t1"}})])
    return store


def forged(type_: str, data: dict, *, seq: int = 1, version: int = 1, prev_hash: str = GENESIS_HASH) -> Event:
    """An event no writer could make (NewEvent refuses its data), hashed as stored ones are:
    what a buggy older version or a hand-written import could have put in a ledger."""
    event = Event(seq, "alice/a", version, type_, "2026-01-01T00:00:00.000000Z", {"kind": "cli", "name": "x"},
                  random_id("alice/a"), None, data, prev_hash, "")
    return dataclasses.replace(event, hash=event.expected_hash())


def rows(store):
    return [list(r) for r in store.raw_rows()]


def test_sound_ledger_passes(store_factory):
    report = verify_store(sample(store_factory))
    assert report.ok and report.events == 4 and report.head == 4



def test_damage_kinds(store_factory):
    good = rows(sample(store_factory))

    def first_problem(mutate):
        damaged = [list(r) for r in good]
        mutate(damaged)
        return verify_rows(map(tuple, damaged)).problem

    p = first_problem(lambda r: r.pop(1))
    assert p.position == 2 and "seq is not contiguous" in p.reason
    p = first_problem(lambda r: r[2].__setitem__(9, "f" * 64))
    assert p.position == 3 and "prev_hash" in p.reason
    p = first_problem(lambda r: r[1].__setitem__(8, '{"reason":"other"}'))
    assert p.position == 2 and "hash mismatch" in p.reason


def test_verify_builds_the_jobs_with_the_folds_own_loop_and_stops_at_the_first_illegal_step(store_factory):
    store = sample(store_factory)
    walk = _Walk(transitions=True)
    assert walk.run(store.raw_rows()).ok
    assert walk.state.jobs == load_state(store, use_snapshot=False).jobs  # replay's fold, not a copy of it
    store.append("bob/b", [NewEvent("finished", {})])  # bob's job never started
    store.append("alice/a", [NewEvent("provisioned", {"tpu": {"name": "t1"}})])
    report = verify_store(store)
    assert report.problem.position == 5 and report.events == 5
    assert report.problem.reason == "illegal transition in bob/b: finished from state pending"


def test_version_gap_and_schema_and_transition(store_factory):
    store = store_factory()
    store.append("alice/a", [NewEvent("submitted", SUBMIT)])
    store.append("alice/a", [NewEvent("finished", {})])  # finished before started
    report = verify_store(store)
    assert not report.ok and report.problem.position == 2 and "illegal transition" in report.problem.reason
    assert verify_store(store, transitions=False).ok

    bad = store_factory()
    bad.import_events([forged("failed", {"kind": "gremlins"})])
    assert "schema" in verify_store(bad).problem.reason and "kind" in verify_store(bad).problem.reason


def test_final_failures_written_before_the_kinds_were_fixed_still_verify(store_factory):
    """0.1.0 recorded a final failure's rule as its kind ("pass", "exhausted"); such a ledger
    stays sound, though no writer can record those kinds any more."""
    store = store_factory()
    first = forged("submitted", SUBMIT)
    store.import_events([first, forged("failed", {"kind": "grpc"}, seq=2, version=2, prev_hash=first.hash)])
    last = store.get_event(next(store.read_all(after=1)).id)
    store.import_events([forged("failed", {"kind": "exhausted", "final": True}, seq=3, version=3, prev_hash=last.hash)])
    assert verify_store(store).ok


def test_rewritten_suffix_with_valid_hashes_is_caught_by_version_check(store_factory):
    # Someone rebuilds a consistent-looking chain but skips a version: still caught.
    store = sample(store_factory)
    good = rows(store)
    from ledger.events import GENESIS_HASH, body_text, row_hash

    prev = GENESIS_HASH
    rebuilt = []
    for r in good:
        r = list(r)
        if r[0] == 4:
            r[2] = 5  # version 3 skipped
        r[9] = prev
        r[10] = row_hash(prev, body_text(*r[:10]))
        prev = r[10]
        rebuilt.append(tuple(r))
    problem = verify_rows(rebuilt).problem
    assert problem.position == 4 and "version is not contiguous" in problem.reason


def test_verify_in_two_processes_finds_what_one_finds(tmp_path):
    """Above PARALLEL_FROM events a child checks the tail's hashes and schema: the same first
    problem, wherever the damage sits (the parent's range, the child's, the boundary)."""
    import sqlite3

    from workload import workload  # bench/workload.py, on the path by tests/ledger/conftest.py

    from ledger.store.sqlite import SQLiteStore

    path = tmp_path / "l.db"
    store = SQLiteStore(path)
    store.append_many([(job, events, 0) for job, events in workload(400, 20)])
    assert verify_store(store, parallel_from=1) == verify_store(store, parallel_from=0) and verify_store(store, parallel_from=1).ok
    head = store.head()
    mid = head - int(head * CHILD_SHARE)
    db = sqlite3.connect(path)
    db.execute("DROP TRIGGER events_no_update")
    for seq in (mid - 3, mid, mid + 1, head - 5, head):
        original = db.execute("SELECT data FROM events WHERE seq = ?", (seq,)).fetchone()[0]
        db.execute("UPDATE events SET data = '{\"reason\":\"forged\"}' WHERE seq = ?", (seq,))
        db.commit()
        two, one = verify_store(store, parallel_from=1), verify_store(store, parallel_from=0)
        assert two.problem == one.problem and two.problem.position == seq and "hash mismatch" in two.problem.reason
        db.execute("UPDATE events SET data = ? WHERE seq = ?", (original, seq))
        db.commit()
    assert verify_store(store, parallel_from=1).ok


def workload_store(path):
    from workload import workload  # bench/ (on the tests' path)

    from ledger.store.sqlite import SQLiteStore

    store = SQLiteStore(path)
    store.append_many([(job, events, 0) for job, events in workload(20_000, 200)])
    return store


@contextlib.contextmanager
def the_child_killed() -> Iterator[None]:
    """verify's child killed as soon as it runs (as the out-of-memory killer or a signal would)."""
    killed: list = []

    def kill_the_child() -> None:
        while not killed:
            for child in multiprocessing.active_children():
                child.kill()
                killed.append(child)

    killer = threading.Thread(target=kill_the_child, daemon=True)
    killer.start()
    yield
    killer.join(5)
    assert killed and killed[0].exitcode == -9


def test_a_child_killed_mid_check_leaves_its_range_to_the_parent(tmp_path):
    """The child may die without answering (the kernel's out-of-memory killer, a signal):
    the parent checks the child's range itself and finds what one process finds, with no
    traceback (it used to raise EOFError)."""
    path = tmp_path / "l.db"
    store = workload_store(path)
    head = store.head()
    damaged = head - 10  # in the child's range
    db = sqlite3.connect(path)
    db.execute("DROP TRIGGER events_no_update")
    db.execute("UPDATE events SET data = '{\"reason\":\"forged\"}' WHERE seq = ?", (damaged,))
    db.commit()
    with the_child_killed():
        report = verify_store(store, parallel_from=1)
    assert report.problem == verify_store(store, parallel_from=0).problem
    assert report.problem.position == damaged and "hash mismatch" in report.problem.reason


def snapshotted(store_factory):
    """A ledger with a snapshot of each kind at its own position before the head, and a job
    state (at seq 3) and a usage fold (at seq 4) forged with consistent hashes (what a
    forger with database access writes)."""
    store = sample(store_factory)  # 4 events
    store.append("bob/b", [NewEvent("queued", {"reason": "capacity"})])
    save_snapshot(store, load_state(store, until=2, use_snapshot=False))
    save_usage(store, *load_usage(store, 168.0, until=3, use_snapshot=False), now=None)
    save_capacity(store, load_capacity(store, 4, use_snapshot=False))
    insert_encoded(store_factory, store, finished(load_state(store, until=3, use_snapshot=False), "alice/a"), position=3)
    meter, usage = load_usage(store, 168.0, until=4, use_snapshot=False)
    meter.acc["alice"] = 3600.0  # alice's fair share charged for an hour she never held
    store.save_snapshot(tied_snapshot(store, snapshot_name(168.0), usage_code(), 4, encode(meter, usage)))
    return store


def verdicts_of(verdicts):
    return [(v.snapshot.name, v.snapshot.position, v.rebuilt, v.problem) for v in verdicts]


def test_verify_ledger_checks_each_snapshot_where_its_walk_passes_in_one_process_or_two(store_factory):
    """One read: the walk pauses at each snapshot's position and compares it with its own
    fold (and the usage and capacity folds fed its rows): the verdicts are those of a fold of
    the events made apart (verify_snapshots), the forged one named, in one process or two."""
    store = snapshotted(store_factory)
    apart = verdicts_of(verify_snapshots(store))
    seen: list[int] = []
    for parallel_from, progress in ((0, None), (1, seen.append)):
        report, verdicts = verify_ledger(store, parallel_from=parallel_from, progress=progress)
        assert report.ok and report.head == 5 and verdicts_of(verdicts) == apart
    assert seen[-1] == 5  # two processes show progress too
    forged = [v for v in apart if v[3] is not None]
    assert [v[:3] for v in forged] == [("ledger", 3, True), ("usage/168.0h", 4, True)]
    assert forged[0][3].startswith("job alice/a: state is 'finished' in it, ")
    assert forged[1][3] == "its meter's decayed sums differ from the events'"  # in two processes, found by the child
    assert all(rebuilt for name, _, rebuilt, _ in apart if name in ("ledger", "usage/168.0h", "capacity"))


def test_verify_ledger_gives_no_verdict_on_unsound_events(store_factory):
    store = snapshotted(store_factory)
    damaged = rows(store)
    damaged[3][8] = '{"attempt":2,"tpu":{"name":"t1"}}'  # seq 4 altered after it was written

    class Damaged:  # the store as read, its seq 4 altered
        def __getattr__(self, name):
            return getattr(store, name)

        def raw_rows(self, after=0, until=None):
            return (tuple(r) for r in damaged if r[0] > after and (until is None or r[0] <= until))

    report, verdicts = verify_ledger(Damaged(), parallel_from=0)
    assert report.problem.position == 4 and "hash mismatch" in report.problem.reason and verdicts == []


def test_a_child_killed_before_it_compares_leaves_its_snapshots_to_the_parent(tmp_path):
    """In two processes the child folds the usage and the capacity memory that snapshots are
    compared with; when it dies without answering, the parent compares them itself."""
    store = workload_store(tmp_path / "l.db")
    save_snapshot(store, load_state(store, until=15_000, use_snapshot=False))
    save_usage(store, *load_usage(store, 168.0, until=12_000, use_snapshot=False), now=None)
    save_capacity(store, load_capacity(store, 18_000, use_snapshot=False))
    with the_child_killed():
        report, verdicts = verify_ledger(store, parallel_from=1)
    assert report.ok and verdicts_of(verdicts) == verdicts_of(verify_snapshots(store))
    assert [(name, rebuilt, problem) for name, _, rebuilt, problem in verdicts_of(verdicts)] == [
        ("usage/168.0h", True, None), ("ledger", True, None), ("ledger.pieces", False, None),
        ("ledger.rows", False, None), ("capacity", True, None)]


def test_a_progress_callback_that_raises_stops_verify_and_its_child(tmp_path):
    """The dashboard stops its verify when it closes by raising from the progress callback:
    the child is not left checking a million rows behind it."""
    store = workload_store(tmp_path / "l.db")

    def stop(_walked: int) -> None:
        raise KeyboardInterrupt

    others = set(multiprocessing.active_children())  # of other tests in this worker, if any
    with pytest.raises(KeyboardInterrupt):
        verify_store(store, parallel_from=1, progress=stop)
    assert set(multiprocessing.active_children()) <= others


def lab_of_lives(store_factory):
    """A ledger of jobs in every situation (tests/reconciler/test_live.py's lives): waiting,
    running, settled long ago and a moment ago, ended and still holding a TPU, ended with an
    intent left open, and settled then run again."""
    store = store_factory()
    for job_id, type_, data, ago in live_events():
        store.append(job_id, [NewEvent(type_, data, time=at(ago))])
    return store


def test_the_walk_shelves_settled_jobs_and_brings_a_revived_one_back(store_factory):
    """A lab's history is mostly settled jobs: the walk keeps them on a shelf (ledger.shelf),
    small, until an event comes for one; its verdicts and its fold are what a walk holding
    every job as a state gives."""
    store = lab_of_lives(store_factory)
    walk = _Walk(transitions=True)
    assert walk.run(store.raw_rows()).ok
    replayed = load_state(store, use_snapshot=False).jobs
    assert sorted(walk.shelf.ids()) == ["bo/just", "bo/old", "cy/cancelled"]
    assert "dee/again" in walk.state.jobs and replayed["dee/again"].state != "finished"  # revived, off the shelf
    assert not any(settled(j) for j in walk.state.jobs.values() if j.id != "cy/cancelled")
    assert dict(walk.every_job()) == replayed

    store.append("bo/old", [NewEvent("started", {"attempt": 1, "workers": [0], "spec_hash": "h"}, time=at(5))])
    report = verify_store(store)  # a shelved job's illegal step is found as any other
    assert report.problem.reason == "illegal transition in bo/old: started from state finished"


def test_a_snapshot_is_compared_with_the_shelved_jobs_too(store_factory):
    store = lab_of_lives(store_factory)
    real = load_state(store, use_snapshot=False)
    for job_id in ("bo/old", "ana/running"):  # one the walk shelves, one it holds
        lie = dataclasses.replace(real.jobs[job_id], restarts=7)
        save_snapshot(store, fold.LedgerState(real.position, {**real.jobs, job_id: lie}))
        _, verdicts = verify_ledger(store, parallel_from=0)
        [verdict] = [v for v in verdicts if v.snapshot.name == "ledger"]
        assert verdict.problem == f"job {job_id}: restarts is 7 in it, 0 from the events"
        store.delete_snapshot(verdict.snapshot)
