"""Checkpoint reporting, the pure part: the planner records a `checkpointed` event when the
probe saw a newer step than the last one recorded for the attempt, at most once per
`job.checkpoints.every_s`, and never in place of a failure it must record."""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.events import format_time
from ledger.fold import evolve
from reconciler.model import HostObs
from reconciler.plan import plan
from reconciler.remote.patterns import checkpoint_rx, newest_step
from tests.reconciler.test_plan import (
    NOW,
    job,
    observed,
    only,
    ready,
    recorded,
    running_job,
    spec,
    submitted,
    tpu_request,
)


def hosts(step: int | None, *, worker0: str = "running", matches=()) -> dict:
    return {"alice/bert": {0: HostObs(worker0, checkpoint=step, matches=matches),
                           **{w: HostObs("running") for w in (1, 2, 3)}}}


def at(seconds_ago: float) -> str:
    return format_time(datetime.fromtimestamp(NOW - seconds_ago, UTC))


def record(j, data: dict, seconds_ago: float):
    return evolve(j, "checkpointed", data, time=at(seconds_ago), seq=j.position + 1, version=j.version + 1)


def test_a_new_step_is_recorded_with_its_attempt_and_worker():
    j, name = running_job()
    a = only(plan({j.id: j}, observed(ready(name), hosts=hosts(200))))
    assert a.kind == "record" and recorded(a) == [("checkpointed", {"attempt": 1, "step": 200, "worker": 0})]
    j = record(j, recorded(a)[0][1], 0)
    assert j.checkpoint == {"attempt": 1, "step": 200}


def test_no_line_no_event_and_an_old_step_no_event():
    j, name = running_job()
    assert plan({j.id: j}, observed(ready(name), hosts=hosts(None))) == []
    j = record(j, {"attempt": 1, "step": 300}, 600)
    assert plan({j.id: j}, observed(ready(name), hosts=hosts(300))) == []  # the same step again
    assert plan({j.id: j}, observed(ready(name), hosts=hosts(250))) == []  # an older one


def test_throttled_to_one_per_interval_default_60_s():
    j, name = running_job()
    j = record(j, {"attempt": 1, "step": 300}, 30)
    assert plan({j.id: j}, observed(ready(name), hosts=hosts(400))) == []  # 30 s ago: wait
    j = record(running_job()[0], {"attempt": 1, "step": 300}, 61)
    assert recorded(only(plan({j.id: j}, observed(ready(name), hosts=hosts(400)))))[0][1]["step"] == 400


def test_the_spec_sets_the_interval():
    s = spec()
    s["job"]["checkpoints"] = {"pattern": r"ckpt (\d+)", "every_s": 5.0}
    want = tpu_request(job([submitted(s)]))
    j = job([submitted(s), ("provisioning", {"attempt": 1, "tpu": want}), ("provisioned", {"tpu": want, "hosts": [{"worker": i} for i in range(4)]}),
             ("setup_started", {}), ("setup_done", {}), ("started", {"attempt": 1, "spec_hash": "h1"})])
    j = record(j, {"attempt": 1, "step": 1}, 6)
    assert only(plan({j.id: j}, observed(ready(want["name"]), hosts=hosts(2)))).kind == "record"


def test_a_new_attempt_records_even_a_step_the_last_attempt_reached():
    j, name = running_job()
    j = record(j, {"attempt": 0, "step": 900}, 120)  # an older attempt's checkpoint
    assert recorded(only(plan({j.id: j}, observed(ready(name), hosts=hosts(300)))))[0][1]["step"] == 300


def test_a_failure_is_recorded_first():
    j, name = running_job()
    a = only(plan({j.id: j}, observed(ready(name), hosts=hosts(500, matches=("grpc",)))))
    assert [t for t, _ in recorded(a)] == ["failed"]


def test_the_probe_reads_the_newest_matching_line():
    rx = checkpoint_rx(None)
    text = "step 1\nLEDGER_CHECKPOINT step=10\nnoise LEDGER_CHECKPOINT step=20 saved\nstep 21\n"
    assert newest_step(text, rx) == 20
    assert newest_step("nothing here\n", rx) is None
    assert newest_step("saved ckpt-7\n", checkpoint_rx(r"ckpt-(\d+)")) == 7
    assert newest_step("LEDGER_CHECKPOINT step=" + "9" * 40 + "\n", rx) is None  # absurd steps are not steps
