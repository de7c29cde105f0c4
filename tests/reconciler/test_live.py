"""The live view of the jobs (reconciler.live): kept by the streams each fold touches, it
is always the state's jobs less the settled ones, which wait on the shelf (reconciler.shelf)
and come back when an event comes for them; a pass over it decides what a pass over every job
decides. Pure: no server."""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.events import format_time
from ledger.fold import LedgerState, apply
from ledger.shelf import settled
from reconciler import naming
from reconciler.live import LiveJobs
from reconciler.model import NodeObs, Observed, PlanConfig
from reconciler.plan import plan

NOW = 1_800_000_000.0
ZONE = "us-central2-b"
SPEC = {"job": {"name": "j"}, "command": {"cmd": "train", "workers": "all"}, "recovery": {"max_restarts": 3},
        "tpu": {"accelerator": "v4-8", "zone": ZONE, "pricing": "spot", "allocation_mode": "tpu-vm", "hosts": 1, "chips": 4}}


HASH = "ab12cd34"  # the spec's hash, as the events carry it


def at(seconds_ago: float) -> str:
    return format_time(datetime.fromtimestamp(NOW - seconds_ago, UTC))


def tpu(name: str) -> dict:
    return {"name": name, "zone": ZONE, "kind": "node", "accelerator": "v4-8", "shared": False}


def lives() -> dict[str, list[tuple[str, dict, float]]]:
    """Jobs in every situation that matters: waiting, running, finished long ago, finished
    with its TPU released a moment ago, ended while still holding its TPU, ended with an
    intent left without its outcome, and run again after it had ended. Events any writer
    could record (verify's tests append them to a ledger)."""
    submitted = ("submitted", {"spec": SPEC, "spec_hash": HASH, "commit": "c0ffee", "path": "jobs/j.yaml"}, 3600)
    up = [("provisioning", {"attempt": 1, "tpu": tpu("{}")}, 3500),
          ("provisioned", {"tpu": tpu("{}"), "hosts": [{"worker": 0, "address": "10.0.0.1", "port": 22}]}, 3400),
          ("setup_started", {"attempt": 1}, 3300), ("setup_done", {"attempt": 1}, 3200),
          ("started", {"attempt": 1, "workers": [0], "spec_hash": HASH}, 3100)]
    return {
        "ana/waiting": [submitted],
        "ana/running": [submitted, *up],
        "bo/old": [submitted, *up, ("finished", {}, 3000), ("released", {"tpu": tpu("{}"), "reason": "job ended"}, 2900)],
        "bo/just": [submitted, *up, ("finished", {}, 30), ("released", {"tpu": tpu("{}"), "reason": "job ended"}, 20)],
        "cy/holding": [submitted, *up, ("finished", {}, 10)],
        "cy/cancelled": [submitted, ("cancel_requested", {}, 100), ("cancelled", {"reason": "asked"}, 90)],
        "cy/intent": [submitted, ("cancel_requested", {}, 100), ("cancelled", {"reason": "asked"}, 90),
                      ("action_intent", {"action_id": "a1", "action": "release", "params": {}, "holder": "r"}, 80)],
        "dee/again": [submitted, *up, ("finished", {}, 2800), ("released", {"tpu": tpu("{}"), "reason": "job ended"}, 2700),
                      ("rerun", {"rule": "manual", "attempt": 2, "restarts": 0}, 50)],
    }


def events() -> list[tuple[str, str, dict, float]]:
    """Every job's events, interleaved by time as a ledger would hold them."""
    out = [(job_id, t, {k: (tpu(f"tl-{job_id.replace('/', '-')}") if v == tpu("{}") else v) for k, v in d.items()}, ago)
           for job_id, life in lives().items() for t, d, ago in life]
    return sorted(out, key=lambda e: -e[3])


def test_the_view_kept_fold_by_fold_is_the_state_less_its_settled_jobs():
    live = LiveJobs()
    state = live.state
    everything = LedgerState()  # the same events folded with nothing shelved
    versions: dict[str, int] = {}
    for seq, (job_id, type_, data, ago) in enumerate(events(), start=1):
        versions[job_id] = versions.get(job_id, 0) + 1
        touched: set[str] = set()
        for row in live.folding([(seq, job_id, versions[job_id], type_, at(ago), data)], touched):
            apply(state, row[1], row[3], row[5], time=row[4], seq=row[0], version=row[2])
        apply(everything, job_id, type_, data, time=at(ago), seq=seq, version=versions[job_id])
        live.refresh(touched)
        if seq % 3 == 0:
            state.detached()  # as the snapshot saver does: the next fold of a job copies it
        fresh = LiveJobs()
        fresh.rebuild(LedgerState(everything.position, dict(everything.jobs)))
        assert live.jobs == fresh.jobs == state.jobs
        assert all(live.jobs[j] is state.jobs[j] for j in live.jobs)  # the state's own objects, not stale copies
        on_shelf = sorted(j for j in everything.jobs if j not in state.jobs)
        assert on_shelf == sorted(j for j, job in everything.jobs.items() if settled(job))
        assert all(live.find(j) == everything.jobs[j] for j in everything.jobs)  # shelved: as they were
    assert [job for job, _ in live.shelf.frozen().pieces()] == [everything.jobs[j] for j in on_shelf]
    assert on_shelf == ["bo/just", "bo/old", "cy/cancelled"]
    assert live.shelf.states == {"finished": 2, "cancelled": 1}
    # cy/holding: a TPU still held; cy/intent: an intent without its outcome; dee/again: back from the shelf
    assert {"cy/holding", "cy/intent", "dee/again"} <= set(live.jobs)
    assert live.jobs["dee/again"].state == "recovering" and live.jobs["dee/again"].attempt == 2


def folded() -> LedgerState:
    state = LedgerState()
    versions: dict[str, int] = {}
    for seq, (job_id, type_, data, ago) in enumerate(events(), start=1):
        versions[job_id] = versions.get(job_id, 0) + 1
        apply(state, job_id, type_, data, time=at(ago), seq=seq, version=versions[job_id])
    return state


def test_a_pass_over_the_live_jobs_decides_what_a_pass_over_every_job_does():
    """The settled jobs still answer the orphan collector: a node a finished job released a
    moment ago is being deleted, not an orphan; an orphan is recorded on the job its label names."""
    state = folded()
    live = LiveJobs()
    live.rebuild(LedgerState(state.position, dict(state.jobs)))
    assert len(live.jobs) < len(state.jobs)
    managed = {"managed-by": "tpu-ledger"}
    old = state.jobs["bo/old"]
    nodes = [
        NodeObs("tl-bo-just", ZONE, "READY", managed, create_time=NOW - 3500),  # released 20 s ago
        NodeObs("tl-bo-old", ZONE, "READY", {**managed, naming.LABEL_JOB_HASH: naming.job_hash(old.id, old.commit)},
                create_time=NOW - 3500),  # released 2,900 s ago: an orphan of bo/old
        NodeObs("tl-ana-running", ZONE, "READY", managed, create_time=NOW - 3500),
        NodeObs("tl-cy-holding", ZONE, "READY", managed, create_time=NOW - 3500),
    ]
    config = PlanConfig(orphan_grace_s=300)

    def observed() -> Observed:
        return Observed(now=NOW, zones=frozenset({ZONE}), nodes={n.name: n for n in nodes})

    everyone = plan(state.jobs, observed(), config=config)
    from_live = plan(live.jobs, observed(), config=config, settled=live.shelf)
    assert [(a.kind, a.job_id, a.params) for a in from_live] == [(a.kind, a.job_id, a.params) for a in everyone]
    orphans = [(a.job_id, a.params["tpu"]["name"]) for a in from_live if a.kind == "collect_orphan"]
    assert orphans == [("bo/old", "tl-bo-old")]
