"""The planner is pure: these tests fold event sequences and read the actions, no server."""

from __future__ import annotations

from ledger.events import format_time
from ledger.fold import JobState, evolve, initial
from reconciler.model import HostObs, NodeObs, Observed, PlanConfig, QueuedObs
from reconciler.plan import plan, shared_lines, tpu_request

ZONE = "us-central2-b"
NOW = 1_800_000_000.0


def spec(**tpu_overrides) -> dict:
    tpu = {"accelerator": "v4-32", "zone": ZONE, "pricing": "spot", "allocation_mode": "tpu-vm", **tpu_overrides}
    return {"job": {"name": "bert"}, "tpu": tpu, "command": {"cmd": "python train.py", "workers": "all"},
            "recovery": {"max_restarts": 2}}


def job(events: list[tuple[str, dict]], *, at: float = NOW - 5, job_id: str = "alice/bert") -> JobState:
    j = initial(job_id)
    for i, (type_, data) in enumerate(events, start=1):
        j = evolve(j, type_, data, time=format_time_epoch(at), seq=i, version=i)
    return j


def format_time_epoch(t: float) -> str:
    from datetime import UTC, datetime

    return format_time(datetime.fromtimestamp(t, UTC))


def submitted(s: dict | None = None) -> tuple[str, dict]:
    return ("submitted", {"spec": s or spec(), "spec_hash": "h1", "commit": "c1"})


def observed(*nodes: NodeObs, hosts=None, queued=()) -> Observed:
    return Observed(now=NOW, zones=frozenset({ZONE}), nodes={n.name: n for n in nodes},
                    queued={q.name: q for q in queued}, hosts=hosts or {})


def ready(name: str, state: str = "READY", hosts: int = 4) -> NodeObs:
    return NodeObs(name, ZONE, state, {}, tuple({"worker": i, "address": "127.0.0.1", "port": 1000 + i} for i in range(hosts)))


def recorded(action) -> list[tuple[str, dict]]:
    """What a `record` action appends, as (type, data) the fold reads."""
    return [(d.event_type, d.to_builtins()) for d in action.params["events"]]


def only(actions):
    assert len(actions) == 1, actions
    return actions[0]


def running_job(**extra_spec) -> tuple[JobState, str]:
    j = job([submitted()])
    want = tpu_request(j)
    hosts = [{"worker": i} for i in range(4)]
    j = job([submitted(), ("provisioning", {"attempt": 1, "tpu": want}), ("provisioned", {"tpu": want, "hosts": hosts}),
             ("setup_started", {}), ("setup_done", {}), ("started", {"attempt": 1, "spec_hash": "h1"})])
    return j, want["name"]


def test_a_submitted_job_is_provisioned_with_a_deterministic_valid_name():
    j = job([submitted()])
    a = only(plan({j.id: j}, observed()))
    assert a.kind == "provision" and a.params["attempt"] == 1
    name = a.params["tpu"]["name"]
    assert name == tpu_request(j)["name"] and name.startswith("tl-alice-bert-") and len(name) <= 63
    assert a.params["tpu"]["kind"] == "node"


def test_queued_resource_mode_requests_a_queued_resource():
    j = job([submitted(spec(allocation_mode="queued-resources"))])
    assert only(plan({j.id: j}, observed())).params["tpu"]["kind"] == "queued_resource"


def test_ready_node_is_marked_provisioned_then_set_up_then_started():
    j = job([submitted()])
    want = tpu_request(j)
    j = job([submitted(), ("provisioning", {"attempt": 1, "tpu": want})])
    assert plan({j.id: j}, observed(ready(want["name"], "CREATING"))) == []
    assert only(plan({j.id: j}, observed(ready(want["name"])))).kind == "mark_provisioned"
    j = job([submitted(), ("provisioning", {"attempt": 1, "tpu": want}), ("provisioned", {"tpu": want, "hosts": []})])
    assert only(plan({j.id: j}, observed(ready(want["name"])))).kind == "setup"
    j = evolve(evolve(j, "setup_started", {}), "setup_done", {})
    a = only(plan({j.id: j}, observed(ready(want["name"]))))
    assert a.kind == "start" and a.params["resume"] is False


def test_an_unobserved_zone_decides_nothing():
    j, name = running_job()
    obs = observed(ready(name))
    obs.zones = frozenset()
    assert plan({j.id: j}, obs) == []


def test_preempted_node_is_recorded_then_reapplied_with_the_next_attempt():
    j, name = running_job()
    a = only(plan({j.id: j}, observed(ready(name, "PREEMPTED"))))
    assert a.kind == "record" and recorded(a)[0][0] == "preempted"
    j = evolve(j, "preempted", recorded(a)[0][1])
    a = only(plan({j.id: j}, observed(ready(name, "PREEMPTED"))))
    assert a.kind == "recover" and a.params["reapply"] and a.params["resume"]
    assert a.params["attempt"] == 2 and a.params["restarts"] == 1


def test_after_reapply_the_job_provisions_a_new_node_and_starts_resuming():
    j, name = running_job()
    j = evolve(j, "preempted", {})
    j = evolve(j, "released", {"tpu": j.tpu})
    j = evolve(j, "resumed", {"attempt": 2, "restarts": 1, "rule": "reapply", "reapply": True})
    a = only(plan({j.id: j}, observed(ready(name, "PREEMPTED"))))
    assert a.kind == "provision" and a.params["tpu"]["name"] != name and a.params["attempt"] == 2
    new = a.params["tpu"]
    j = evolve(evolve(j, "provisioning", {"attempt": 2, "tpu": new}), "provisioned", {"tpu": new, "hosts": []})
    j = evolve(evolve(j, "setup_started", {}), "setup_done", {})
    a = only(plan({j.id: j}, observed(ready(new["name"]))))
    assert a.kind == "start" and a.params["resume"] is True and a.params["attempt"] == 2


def test_grpc_pattern_fails_the_attempt_and_resumes_on_the_same_tpu():
    j, name = running_job()
    hosts = {j.id: {0: HostObs("running", matches=("grpc",)), 1: HostObs("running")}}
    a = only(plan({j.id: j}, observed(ready(name), hosts=hosts)))
    assert recorded(a)[0] == ("failed", {"kind": "grpc", "message": "GRPC error in the job's output", "attempt": 1})
    j = evolve(j, "failed", recorded(a)[0][1])
    a = only(plan({j.id: j}, observed(ready(name))))
    assert a.kind == "recover" and a.params["rule"] == "resume" and not a.params["reapply"]


def test_all_workers_exiting_zero_finishes_and_then_releases():
    j, name = running_job()
    hosts = {j.id: {w: HostObs("exited", 0) for w in range(4)}}
    a = only(plan({j.id: j}, observed(ready(name), hosts=hosts)))
    assert recorded(a)[0][0] == "finished"
    j = evolve(j, "finished", {})
    a = only(plan({j.id: j}, observed(ready(name))))
    assert a.kind == "release"


def test_one_worker_still_running_is_not_finished():
    j, name = running_job()
    hosts = {j.id: {0: HostObs("exited", 0), 1: HostObs("running"), 2: HostObs("exited", 0), 3: HostObs("exited", 0)}}
    assert plan({j.id: j}, observed(ready(name), hosts=hosts)) == []


def test_non_zero_exit_with_pass_rule_fails_for_good():
    j, name = running_job()
    hosts = {j.id: {0: HostObs("exited", 3), 1: HostObs("running")}}
    a = only(plan({j.id: j}, observed(ready(name), hosts=hosts)))
    assert recorded(a)[0][1]["exit_code"] == 3
    j = evolve(j, "failed", recorded(a)[0][1])
    a = only(plan({j.id: j}, observed(ready(name))))
    (type_, data), = recorded(a)
    assert type_ == "failed" and data["final"] and data["kind"] == "exit" and data["rule"] == "pass"


def test_restart_budget_exhausted_fails_for_good_with_history():
    j, name = running_job()
    for attempt in (2, 3):
        j = evolve(j, "failed", {"kind": "grpc"})
        j = evolve(j, "resumed", {"attempt": attempt, "restarts": attempt - 1})
        j = evolve(j, "setup_started", {})
        j = evolve(j, "setup_done", {})
        j = evolve(j, "started", {"spec_hash": "h1"})
    j = evolve(j, "failed", {"kind": "grpc"})
    a = only(plan({j.id: j}, observed(ready(name))))
    data = recorded(a)[0][1]
    assert data["final"] and data["kind"] == "grpc" and data["rule"] == "exhausted" and len(data["history"]) == 3


def test_a_release_refused_for_good_names_the_permission_and_waits_for_its_retry_time():
    j, name = running_job()
    j = evolve(j, "cancel_requested", {"reason": "spec deleted"})
    a = only(plan({j.id: j}, observed(ready(name))))
    intent = {"action_id": "a1", "action": a.kind, "params": {}, "holder": "reconciler"}
    refusal = {"action_id": "a1", "action": "cancel", "ok": False, "error": "PERMISSION_DENIED: tpu.nodes.delete",
               "api": {"code": "PERMISSION_DENIED", "kind": "permanent", "permission": "tpu.nodes.delete"}}
    j = evolve(evolve(j, "action_intent", intent), "action_outcome", refusal, time=format_time_epoch(NOW - 5))
    assert j.state == "cancelling" and j.tpu is not None
    assert j.last_error == {"kind": "release", "message": refusal["error"], "code": "PERMISSION_DENIED",
                            "permission": "tpu.nodes.delete"}
    config = PlanConfig(release_refused_retry_s=60)
    assert plan({j.id: j}, observed(ready(name)), config=config) == []  # 5 s after the refusal: wait
    later = Observed(now=NOW + 60, zones=frozenset({ZONE}), nodes={name: ready(name)})
    assert only(plan({j.id: j}, later, config=config)).kind == "cancel"  # its retry time: try again
    gone = evolve(evolve(j, "released", {"tpu": j.tpu}), "cancelled", {})
    assert gone.last_error is None and gone.tpu is None  # deleted at last: no error left


def test_a_transient_release_failure_is_not_a_refusal_for_good():
    j, name = running_job()
    j = evolve(j, "cancel_requested", {"reason": "spec deleted"})
    outcome = {"action_id": "a1", "action": "cancel", "ok": False, "error": "UNAVAILABLE",
               "api": {"code": "UNAVAILABLE", "kind": "transient"}}
    j = evolve(j, "action_outcome", outcome, time=format_time_epoch(NOW - 5))
    assert j.last_error is None
    assert only(plan({j.id: j}, observed(ready(name)), config=PlanConfig(release_refused_retry_s=60))).kind == "cancel"


def test_cancel_requested_cancels_whatever_the_state():
    j, name = running_job()
    j = evolve(j, "cancel_requested", {"reason": "spec deleted"})
    a = only(plan({j.id: j}, observed(ready(name))))
    assert a.kind == "cancel" and a.params["tpu"]["name"] == name


def test_shared_tpu_is_held_by_one_job_and_the_next_waits_queued():
    shared = spec(shared=True, name="lab-v4-32-1")
    a_job = job([submitted(shared)], job_id="alice/a")
    b_job = job([submitted(shared)], job_id="bob/b")
    b_job.submitted_seq = 10
    a_job.submitted_seq = 5
    acts = {x.job_id: x for x in plan({a_job.id: a_job, b_job.id: b_job}, observed())}
    assert recorded(acts["alice/a"])[0][0] == "provisioning"
    assert recorded(acts["bob/b"])[0][0] == "queued"
    a_job = evolve(a_job, "provisioning", recorded(acts["alice/a"])[0][1])
    acts = {x.job_id: x for x in plan({a_job.id: a_job, b_job.id: b_job}, observed())}
    assert "held by alice/a" in recorded(acts["bob/b"])[0][1]["reason"]
    # alice's job is cancelled and hands the TPU back: bob's job takes it
    a_job = evolve(evolve(a_job, "cancelled", {}), "released", {"tpu": a_job.tpu})
    b_job = evolve(b_job, "queued", recorded(acts["bob/b"])[0][1])
    acts = {x.job_id: x for x in plan({a_job.id: a_job, b_job.id: b_job}, observed())}
    assert recorded(acts["bob/b"])[0][0] == "provisioning"


def test_each_shared_tpu_goes_to_the_first_of_its_own_line_priority_then_submission():
    jobs = {}
    for i, (pool, priority) in enumerate([("p1", 500), ("p2", 500), ("p1", 900), ("p2", 500), ("p1", 900)]):
        s = {**spec(shared=True, name=pool), "priority": priority}
        j = job([submitted(s)], job_id=f"u{i}/j")
        j.submitted_seq = 10 - i  # later jobs were submitted earlier
        jobs[j.id] = j
    lines = shared_lines(jobs)
    assert [j.id for j in lines["p1"]] == ["u4/j", "u2/j", "u0/j"] and [j.id for j in lines["p2"]] == ["u3/j", "u1/j"]
    acts = {a.job_id: recorded(a)[0] for a in plan(jobs, observed())}
    assert {k for k, (t, _) in acts.items() if t == "provisioning"} == {"u4/j", "u3/j"}
    assert acts["u2/j"][1]["reason"] == "shared TPU p1 goes to u4/j first"
    assert acts["u1/j"][1]["reason"] == "shared TPU p2 goes to u3/j first"


def test_queued_retry_waits_with_backoff():
    j = job([submitted(), ("queued", {"reason": "RESOURCE_EXHAUSTED"})], at=NOW - 3)
    assert plan({j.id: j}, observed(), config=PlanConfig(queued_retry_s=10)) == []
    j = job([submitted(), ("queued", {"reason": "RESOURCE_EXHAUSTED"})], at=NOW - 11)
    assert only(plan({j.id: j}, observed(), config=PlanConfig(queued_retry_s=10))).kind == "provision"


def test_waiting_queued_resource_is_recorded_once():
    j = job([submitted(spec(allocation_mode="queued-resources"))])
    want = tpu_request(j)
    j = evolve(j, "provisioning", {"attempt": 1, "tpu": want})
    qr = QueuedObs(want["name"], ZONE, "WAITING_FOR_RESOURCES")
    a = only(plan({j.id: j}, observed(queued=[qr])))
    assert recorded(a)[0][0] == "queued"
    j = evolve(j, "queued", recorded(a)[0][1])
    assert plan({j.id: j}, observed(queued=[qr])) == []
    active = QueuedObs(want["name"], ZONE, "ACTIVE")
    assert only(plan({j.id: j}, observed(ready(want["name"]), queued=[active]))).kind == "mark_provisioned"


def test_a_queued_resource_preempted_while_its_job_waits_in_queued_is_recorded_and_recovered():
    """Chaos found it: a job waiting in `queued` on its queued resource, whose node is then
    preempted, had `preempted` refused by the transition table at every pass, forever."""
    j = job([submitted(spec(allocation_mode="queued-resources"))])
    want = tpu_request(j)
    j = evolve(j, "provisioning", {"attempt": 1, "tpu": want})
    waiting = QueuedObs(want["name"], ZONE, "WAITING_FOR_RESOURCES")
    j = evolve(j, "queued", recorded(only(plan({j.id: j}, observed(queued=[waiting]))))[0][1])
    assert j.state == "queued" and j.tpu is not None
    gone = observed(ready(want["name"], state="PREEMPTED"), queued=[QueuedObs(want["name"], ZONE, "ACTIVE")])
    a = only(plan({j.id: j}, gone))
    assert recorded(a)[0][0] == "preempted"
    j = evolve(j, *recorded(a)[0])
    assert j.state == "preempted" and j.anomalies == []  # the table allows it from queued
    assert only(plan({j.id: j}, gone)).kind in ("release", "recover")  # and the job recovers


def test_orphan_nodes_with_our_labels_are_collected_after_grace_only():
    labels = {"managed-by": "tpu-ledger"}
    old = NodeObs("tl-x", ZONE, "READY", labels, create_time=NOW - 120)
    fresh = NodeObs("tl-y", ZONE, "READY", labels, create_time=NOW - 5)
    foreign = NodeObs("someone-elses", ZONE, "READY", {}, create_time=NOW - 9999)
    acts = plan({}, observed(old, fresh, foreign), config=PlanConfig(orphan_grace_s=60))
    assert [a.params["tpu"]["name"] for a in acts] == ["tl-x"]


def test_someone_elses_fresh_intent_is_left_alone_but_ours_is_resolved():
    j, name = running_job()
    j = evolve(j, "action_intent", {"action_id": "x", "action": "start", "holder": "peer"})
    j.times["action_intent"] = format_time_epoch(NOW - 1)
    assert plan({j.id: j}, observed(ready(name)), config=PlanConfig(holder="me")) == []
    assert only(plan({j.id: j}, observed(ready(name)), config=PlanConfig(holder="peer"))).kind == "resolve"
    j.times["action_intent"] = format_time_epoch(NOW - 700)
    assert only(plan({j.id: j}, observed(ready(name)), config=PlanConfig(holder="me"))).kind == "resolve"


def test_a_changed_spec_while_running_restarts_resuming():
    j, name = running_job()
    j = evolve(j, "spec_updated", {"spec": spec(), "spec_hash": "h2"})
    a = only(plan({j.id: j}, observed(ready(name))))
    assert a.kind == "restart" and a.params["rule"] == "spec_updated" and not a.params["reapply"]


def test_plan_over_ten_thousand_finished_jobs_has_nothing_to_do():
    # how fast is a figure, not a check: bench/reconcile_bench.py plans over 10,000 jobs
    jobs = {}
    for i in range(10_000):
        j = job([submitted(), ("finished", {})], job_id=f"u{i % 100}/j{i}")
        jobs[j.id] = j
    assert plan(jobs, observed()) == []


def test_a_host_lost_because_the_tpu_was_preempted_is_recovered_as_a_preemption():
    """The probe can see the host vanish before the TPU API says PREEMPTED: the next pass,
    with the node PREEMPTED, must apply the preemption rule (reapply), not on_failure (pass)."""
    j, name = running_job()
    j = evolve(j, "failed", {"kind": "lost_host", "worker": 0, "message": "worker 0 lost"})
    a = only(plan({j.id: j}, observed(ready(name, "PREEMPTED"))))
    assert a.kind == "recover" and a.params["kind"] == "preempted" and a.params["reapply"]


def test_a_command_killed_by_a_signal_on_a_vanished_tpu_is_a_preemption_too():
    j, name = running_job()
    j = evolve(j, "failed", {"kind": "exit", "exit_code": 137})
    a = only(plan({j.id: j}, observed()))  # the node is gone from the listing
    assert a.kind == "recover" and a.params["kind"] == "preempted"


def test_a_plain_non_zero_exit_stays_a_failure_even_if_the_tpu_went_away():
    j, name = running_job()
    j = evolve(j, "failed", {"kind": "exit", "exit_code": 3})
    a = only(plan({j.id: j}, observed(ready(name, "PREEMPTED"))))
    assert recorded(a)[0][1]["kind"] == "exit" and recorded(a)[0][1]["rule"] == "pass"


def test_queued_resources_are_listed_only_where_a_job_uses_them():
    from reconciler.plan import queued_resource_zones, zones_in_use

    node_job = job([submitted()], job_id="a/node")
    qr_job = job([submitted(spec(allocation_mode="queued-resources", zone="us-east1-d"))], job_id="b/qr")
    jobs = {node_job.id: node_job, qr_job.id: qr_job}
    assert zones_in_use(jobs) == {ZONE, "us-east1-d"}
    assert queued_resource_zones(jobs) == {"us-east1-d"}
