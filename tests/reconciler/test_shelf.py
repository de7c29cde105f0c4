"""The shelf of settled jobs (reconciler.shelf): a job comes back as it went in, the
orphan collector's answers hold, a frozen shelf does not move, and a snapshot saved from the
state and the shelf is the snapshot of every job. Pure: no server."""

from __future__ import annotations

from ledger.fold import LedgerState
from ledger.replay import decode_state, encode_state, job_text
from ledger.shelf import settled
from reconciler import naming
from reconciler.shelf import Shelf
from tests.reconciler.test_live import at, folded


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
