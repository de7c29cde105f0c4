"""The shelf of settled jobs (reconciler.shelf): a job comes back as it went in, the
orphan collector's answers hold, a frozen shelf does not move, a snapshot saved from the
state and the shelf is the snapshot of every job, and a start from a snapshot shelves what a
start decoding every job whole does. No server (one test on a SQLite file)."""

from __future__ import annotations

import dataclasses

from ledger.events import NewEvent
from ledger.fold import LedgerState
from ledger.replay import load_state, save_snapshot
from ledger.shelf import settled
from ledger.snapshots.jobs import encode_state, job_text
from ledger.snapshots.lazy import decode_lazy, decode_state
from ledger.store.sqlite import SQLiteStore
from reconciler import naming
from reconciler.live import LiveJobs
from reconciler.shelf import Shelf
from tests.reconciler.test_live import at, folded
from tests.reconciler.test_live import events as live_events


def test_a_shelved_job_comes_back_as_it_went_in():
    state = folded()
    shelf = Shelf()
    ended = [j for j in state.jobs.values() if settled(j)]
    for job in ended:
        shelf.put(job)
    assert len(shelf) == len(ended) and all(j.id in shelf for j in ended)
    assert all(shelf.get(j.id) == j for j in ended)
    assert shelf.states == {"finished": 2, "cancelled": 1}
    back = shelf.take("bo/old")
    assert back == state.jobs["bo/old"] and "bo/old" not in shelf and shelf.get("bo/old") is None
    assert shelf.states == {"finished": 1, "cancelled": 1}
    shelf.put(state.jobs["cy/cancelled"])  # again: counted once
    assert shelf.states == {"finished": 1, "cancelled": 1} and len(shelf) == len(ended) - 1


def test_the_orphan_collectors_answers():
    state = folded()
    shelf = Shelf()
    for job in state.jobs.values():
        if settled(job):
            shelf.put(job)
    just = state.jobs["bo/just"]
    assert shelf.job_of_label(naming.job_label(just)) == "bo/just"
    assert shelf.job_of_label(naming.job_label(state.jobs["ana/running"])) is None  # not shelved
    assert shelf.released_since(at(60)) == ["tl-bo-just"]  # released 20 s ago; bo/old 2,900 s ago
    assert shelf.released_since(at(10)) == []
    assert sorted(shelf.released_since(at(3000))) == ["tl-bo-just", "tl-bo-old"]
    shelf.forget_releases(at(60))  # the cutoff only moves forward: older releases are never asked about
    assert shelf.released_since(at(3000)) == ["tl-bo-just"]
    shelf.take("bo/just")
    assert shelf.job_of_label(naming.job_label(just)) is None


def test_a_frozen_shelf_does_not_move_and_a_snapshot_from_it_holds_every_job():
    everything = folded()
    state = LedgerState(everything.position, dict(everything.jobs))
    shelf = Shelf()
    for job in list(state.jobs.values()):
        if settled(job):
            shelf.put(job)
            del state.jobs[job.id]
    frozen = shelf.frozen()
    shelf.take("bo/old")
    shelf.put(everything.jobs["ana/waiting"])
    assert [(j.id, text) for j, text in frozen.pieces()] == [(i, job_text(everything.jobs[i])) for i in sorted(everything.jobs)
                                                           if settled(everything.jobs[i])]
    encoded = encode_state(state, frozen.pieces())
    saved = decode_state(encoded.manifest, encoded.parts.get)
    assert saved is not None and saved.position == everything.position
    assert saved.jobs == everything.jobs


def test_jobs_shelved_where_a_snapshot_keeps_them_come_back_as_they_went_in():
    """A start from a snapshot shelves each settled job as it lies in the snapshot's chunk
    (InChunk), not compressed again; beside jobs shelved later, packed on their own, each
    comes back whole, and the shelf's texts stay in id order across chunks (150 settled
    jobs: three chunks)."""
    base = folded()
    jobs = dict(base.jobs)
    ended = [j for j in base.jobs.values() if settled(j)]
    for i in range(150):
        copy = dataclasses.replace(ended[i % len(ended)], id=f"zz/old-{i:03d}")
        jobs[copy.id] = copy
    encoded = encode_state(LedgerState(base.position, jobs))
    snapshot = decode_lazy(encoded.manifest, encoded.parts.get)
    shelf = Shelf()
    for job_id, _, where in snapshot.pieces():
        if settled(jobs[job_id]) and job_id != "bo/old":
            shelf.put(jobs[job_id], where)
    shelf.put(jobs["bo/old"])  # settled later: packed on its own
    on_shelf = sorted(i for i, j in jobs.items() if settled(j))
    assert [i for i, _ in shelf.texts()] == on_shelf
    assert all(text == job_text(jobs[i]) for i, text in shelf.texts())
    assert all(shelf.get(i) == jobs[i] for i in on_shelf)
    assert shelf.states == {"finished": 2 + 100, "cancelled": 1 + 50}
    assert shelf.take("zz/old-149") == jobs["zz/old-149"] and "zz/old-149" not in shelf
    frozen = shelf.frozen()
    assert [j for j, _ in frozen.pieces()] == [jobs[i] for i in on_shelf if i != "zz/old-149"]


def test_a_start_from_a_snapshot_reads_of_a_settled_job_only_what_the_shelf_keeps(tmp_path) -> None:
    """The reconciler's start (LiveJobs.load) decodes a settled job's piece as the fields
    `settled` and the shelf read (Shelf.PUT_READS), not whole: it keeps the same live jobs,
    and a shelf with the same jobs, texts, states, labels' owners and releases, as a start
    that decodes every job whole. A real SQLite file, a snapshot and a tail of events after it."""
    store = SQLiteStore(tmp_path / "ledger.db")
    try:
        for job_id, type_, data, ago in live_events():
            store.append(job_id, [NewEvent(type_, data, time=at(ago))])
        save_snapshot(store, load_state(store))
        store.append("ana/waiting", [NewEvent("queued", {"reason": "capacity"}, time=at(5))])
        store.append("bo/just", [NewEvent("rerun", {"rule": "manual", "attempt": 2, "restarts": 0}, time=at(4))])
        brief, whole = LiveJobs(), LiveJobs()
        brief.load(store, Shelf)

        class WholeShelf(Shelf):
            PUT_READS = None

        whole.load(store, WholeShelf)
        full = load_state(store, use_snapshot=False).jobs
        assert brief.jobs == whole.jobs == {i: j for i, j in full.items() if not settled(j)}
        assert sorted(brief.shelf.ids()) == sorted(whole.shelf.ids()) == ["bo/old", "cy/cancelled"]
        assert list(brief.shelf.texts()) == list(whole.shelf.texts())
        assert brief.shelf.states == whole.shelf.states == {"finished": 1, "cancelled": 1}
        old = full["bo/old"]
        assert brief.shelf.job_of_label(naming.job_label(old)) == "bo/old"
        assert brief.shelf.released_since(at(3600)) == whole.shelf.released_since(at(3600)) == ["tl-bo-old"]
    finally:
        store.close()
