"""The planner with placements and slices, pure: failover to the next choice, one probe per
stocked-out key, admission charging the choice, and a multislice TPU as one."""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.capacity import CapacityMemory
from ledger.events import format_time
from ledger.fold import JobState, evolve, initial
from ledger.spec.policy import parse_policy
from reconciler.model import HostObs, NodeObs, Observed, PlanConfig, QueuedObs
from reconciler.plan import plan, selected_workers, tpu_request

NOW = 1_800_000_000.0
CENTRAL, WEST = "us-central2-b", "us-west4-a"
FALLBACKS = [{"accelerator": "v5litepod-32", "zone": WEST, "pricing": "spot", "allocation_mode": "tpu-vm", "hosts": 8, "chips": 32},
             {"accelerator": "v4-32", "zone": CENTRAL, "pricing": "ondemand", "allocation_mode": "tpu-vm", "hosts": 4, "chips": 16}]


def spec(**tpu) -> dict:
    base = {"accelerator": "v4-32", "zone": CENTRAL, "pricing": "spot", "allocation_mode": "tpu-vm", "hosts": 4, "chips": 16}
    return {"job": {"name": "j"}, "tpu": {**base, **tpu}, "command": {"cmd": "train", "workers": "all"},
            "recovery": {"max_restarts": 3}}


def at(t: float) -> str:
    return format_time(datetime.fromtimestamp(t, UTC))


def job(job_id: str, s: dict, *events: tuple[str, dict], seq: int = 1) -> JobState:
    j = evolve(initial(job_id), "submitted", {"spec": s, "spec_hash": "h", "commit": "c"}, time=at(NOW - 60), seq=seq, version=1)
    for i, (t, d) in enumerate(events, start=2):
        j = evolve(j, t, d, time=at(NOW - 5), seq=seq + i, version=i)
    return j


def obs(*nodes: NodeObs, queued=()) -> Observed:
    return Observed(now=NOW, zones=frozenset({CENTRAL, WEST}), nodes={n.name: n for n in nodes}, queued={q.name: q for q in queued})


def recorded(action) -> list[tuple[str, dict]]:
    """What a `record` action appends, as (type, data) the fold reads."""
    return [(d.event_type, d.to_builtins()) for d in action.params["events"]]


def stockout(mem: CapacityMemory, job_id: str, zone: str, accelerator: str, pricing: str, index: int, t: float) -> None:
    mem.apply(job_id, "queued", at(t), {"api": {"code": "RESOURCE_EXHAUSTED", "kind": "stockout", "message": "no capacity"},
                                        "placement": {"zone": zone, "accelerator": accelerator, "pricing": pricing, "index": index}})


def test_the_first_stockout_sends_the_next_pass_to_the_next_choice():
    j = job("alice/a", spec(fallbacks=FALLBACKS))
    first = plan({j.id: j}, obs(), memory=CapacityMemory())[0]
    assert first.kind == "provision" and first.params["tpu"]["zone"] == CENTRAL and "placement" not in first.params["tpu"]
    mem = CapacityMemory()
    stockout(mem, j.id, CENTRAL, "v4-32", "spot", 0, NOW - 1)
    j = evolve(j, "queued", {"reason": "no capacity"}, time=at(NOW - 1), seq=9, version=9)
    a = plan({j.id: j}, obs(), memory=mem)[0]
    assert a.kind == "provision" and a.params["tpu"]["zone"] == WEST and a.params["tpu"]["placement"] == 1
    assert a.params["tpu"]["accelerator"] == "v5litepod-32" and a.params["tpu"]["pricing"] == "spot"
    assert a.reason.endswith("trying v5litepod-32 spot us-west4-a")


def test_fifty_jobs_on_a_stocked_out_zone_make_one_create_per_probe():
    jobs = {f"u{i}/j": job(f"u{i}/j", spec(), seq=10 * i + 1) for i in range(50)}
    mem = CapacityMemory()
    stockout(mem, "u0/j", CENTRAL, "v4-32", "spot", 0, NOW - 5)
    jobs = {k: evolve(j, "queued", {"reason": "no capacity"}, time=at(NOW - 5), seq=999, version=9) for k, j in jobs.items()}
    actions = plan(jobs, obs(), memory=mem)
    assert {a.kind for a in actions} == {"record"}  # each records once that it waits (then nothing)
    later = Observed(now=NOW + 6, zones=frozenset({CENTRAL}))
    waiting = {k: evolve(j, "queued", {"reason": "waiting for capacity: v4-32 spot us-central2-b"}, seq=1000, version=10)
               for k, j in jobs.items()}
    creates = [a for a in plan(waiting, later, memory=mem) if a.kind == "provision"]
    assert len(creates) == 1 and creates[0].job_id == "u0/j"  # the first in line probes
    # while that create is under way (its intent recorded), nobody else probes the key
    probing = evolve(waiting["u0/j"], "action_intent", {"action_id": "x", "action": "provision", "params": creates[0].params},
                     seq=1001, version=11)
    assert [a for a in plan({**waiting, "u0/j": probing}, later, memory=mem) if a.kind == "provision"] == []
    # the probe got its TPU: capacity is back, and every other job asks at once (no backoff of its own)
    mem.apply("u0/j", "provisioning", at(NOW + 7), {"attempt": 1, "tpu": creates[0].params["tpu"]})
    rest = {k: j for k, j in waiting.items() if k != "u0/j"}
    assert len([a for a in plan(rest, Observed(now=NOW + 8, zones=frozenset({CENTRAL})), memory=mem)
                if a.kind == "provision"]) == 49


def test_admission_charges_the_choice_the_job_will_take():
    policy = parse_policy("quotas:\n  lab:\n    chips: {v4: 16, v5litepod: 64}\n").policy
    assert policy.quotas.lab is not None
    holder = job("bob/h", spec(), ("provisioning", {"attempt": 1, "tpu": {"name": "h", "zone": CENTRAL, "accelerator": "v4-32"}}))
    mem = CapacityMemory()
    waiting = job("alice/a", spec(fallbacks=FALLBACKS), seq=50)
    blocked = plan({holder.id: holder, waiting.id: waiting}, obs(), config=PlanConfig(policy=policy), memory=mem)
    assert [a.kind for a in blocked if a.job_id == waiting.id] == ["record"]  # v4 chips are the lab's limit
    stockout(mem, "carol/c", CENTRAL, "v4-32", "spot", 0, NOW - 1)  # its first choice is out: it goes to v5e
    moved = plan({holder.id: holder, waiting.id: waiting}, obs(), config=PlanConfig(policy=policy), memory=mem)
    a = next(a for a in moved if a.job_id == waiting.id)
    assert a.kind == "provision" and a.params["tpu"]["accelerator"] == "v5litepod-32"


MS = spec(accelerator="v5litepod-16", zone=WEST, allocation_mode="queued-resources", slices=2, hosts=4, chips=16)


def ms_running() -> tuple[JobState, dict]:
    j = job("alice/ms", MS)
    want = tpu_request(j)
    assert want["slices"] == 2 and want["kind"] == "queued_resource"
    hosts = [{"worker": w, "slice": s, "address": "10.0.0.1", "port": 22} for s in range(2) for w in range(4)]
    j = job("alice/ms", MS, ("provisioning", {"attempt": 1, "tpu": want}), ("provisioned", {"tpu": want, "hosts": hosts}),
            ("setup_started", {}), ("setup_done", {}), ("started", {"attempt": 1, "spec_hash": "h"}))
    return j, want


def node(name: str, state: str = "READY") -> NodeObs:
    return NodeObs(name, WEST, state, {}, tuple({"worker": i, "address": "10.0.0.1", "port": 22} for i in range(4)))


def test_a_multislice_tpu_is_ready_when_every_slice_is():
    j = job("alice/ms", MS)
    want = tpu_request(j)
    j = evolve(j, "provisioning", {"attempt": 1, "tpu": want}, time=at(NOW - 5), seq=5, version=5)
    name = want["name"]
    qr = QueuedObs(name, WEST, "ACTIVE")
    assert plan({j.id: j}, obs(node(f"{name}-0"), queued=[qr])) == []  # slice 1 not there yet
    assert plan({j.id: j}, obs(node(f"{name}-0"), node(f"{name}-1", "CREATING"), queued=[qr])) == []
    a = plan({j.id: j}, obs(node(f"{name}-0"), node(f"{name}-1"), queued=[qr]))[0]
    assert a.kind == "mark_provisioned"


def test_one_slice_preempted_recovers_the_whole_job_stopping_the_survivors():
    j, want = ms_running()
    name = want["name"]
    assert selected_workers(j) == list(range(8))
    a = plan({j.id: j}, obs(node(f"{name}-0"), node(f"{name}-1", "PREEMPTED")))[0]
    event = a.params["events"][0]
    assert (event.event_type, event.slice, event.tpu_state) == ("preempted", 1, "PREEMPTED")
    j = evolve(j, "preempted", event.to_builtins(), seq=20, version=20)
    r = plan({j.id: j}, obs(node(f"{name}-0"), node(f"{name}-1", "PREEMPTED")))[0]
    assert r.kind == "recover" and r.params["reapply"] and r.params["stop"] and r.params["stop_slices"] == [0]


def test_workers_select_within_each_slice_and_events_name_the_slice():
    s = {**MS, "command": {"cmd": "x", "workers": [0]}}
    j, want = ms_running()
    j.spec = s
    assert selected_workers(j) == [0, 4]  # worker 0 of slice 0 and of slice 1
    hosts = {0: HostObs("running"), 4: HostObs("exited", 3)}
    o = obs(node(f"{want['name']}-0"), node(f"{want['name']}-1"))
    o.hosts = {j.id: hosts}
    failed = plan({j.id: j}, o)[0].params["events"][0]
    assert (failed.kind, failed.worker, failed.slice, failed.exit_code) == ("exit", 0, 1, 3)
    assert failed.message == "slice 1 worker 0 exited with code 3"


def test_slice_nodes_are_never_orphans():
    j, want = ms_running()
    old = NodeObs(f"{want['name']}-1", WEST, "READY", {"managed-by": "tpu-ledger"}, create_time=NOW - 10_000)
    stray = NodeObs("tl-stray", WEST, "READY", {"managed-by": "tpu-ledger"}, create_time=NOW - 10_000)
    actions = plan({j.id: j}, obs(node(f"{want['name']}-0"), old, stray))
    assert [a.params["tpu"]["name"] for a in actions if a.kind == "collect_orphan"] == ["tl-stray"]


def test_a_queued_choice_waits_up_to_its_deadline_then_gives_way():
    s = spec(allocation_mode="queued-resources", fallbacks=FALLBACKS, failover={"wait_s": 60})
    j = job("alice/q", s)
    a = plan({j.id: j}, obs(), memory=CapacityMemory())[0]
    assert a.params["wait_s"] == 60.0  # asked with valid_until
    want = a.params["tpu"]
    j = evolve(j, "provisioning", {"attempt": 1, "tpu": want}, time=at(NOW - 30), seq=5, version=5)
    waiting = QueuedObs(want["name"], CENTRAL, "WAITING_FOR_RESOURCES")
    assert [x.kind for x in plan({j.id: j}, obs(queued=[waiting]))] == ["record"]  # queued: waiting for resources
    late = Observed(now=NOW + 60, zones=frozenset({CENTRAL, WEST}), queued={want["name"]: waiting})
    r = plan({j.id: j}, late)[0]
    # given back as the stockout it is: recorded with the API's code and its placement
    assert r.kind == "release" and r.params["next"] == "retry" and r.params["refused"]["code"] == "RESOURCE_EXHAUSTED"


def test_an_orphaned_multislice_queued_resource_is_collected_whole_once():
    """Every slice of a queued resource no job holds is one orphan: its queued resource,
    deleted with force (its nodes go with it), never slice by slice, which would leave it."""
    labels = {"managed-by": "tpu-ledger"}
    slices = [NodeObs(f"tl-gone-{i}", WEST, "READY", labels, create_time=NOW - 10_000, queued_resource="tl-gone")
              for i in range(3)]
    actions = [a for a in plan({}, obs(*slices)) if a.kind == "collect_orphan"]
    assert [a.params["tpu"] for a in actions] == [
        {"name": "tl-gone", "zone": WEST, "kind": "queued_resource", "shared": False}]


def test_waiting_while_the_lab_is_out_of_capacity_grows_no_retry_backoff_of_its_own():
    """Chaos found it (seeds 61 and 64): a job whose creates failed three times (INTERNAL:
    nothing the capacity memory paces), held between them by the memory while other jobs'
    creates found no capacity, waited 300 s to try again: each hold had counted as a failed try
    of its own (10 s doubled five times, the cap), and so did each of its own stockouts, which
    the memory counts and paces it by. Only the failures the memory does not pace count: the
    job tries again 40 s after the third."""
    j = job("alice/a", spec())
    mem = CapacityMemory()
    stockout(mem, "bob/b", CENTRAL, "v4-32", "spot", 0, NOW - 1)
    hold = recorded(plan({j.id: j}, obs(), memory=mem)[0])
    assert [t for t, _ in hold] == ["queued"] and hold[0][1]["reason"].startswith("waiting for capacity")
    tpu = tpu_request(j)
    failed = {"reason": f"TPU {tpu['name']} was not created (INTERNAL: the TPU could not be created); retrying"}
    no_capacity = {"reason": "no capacity for v4-32 in us-central2-b", "placement": {"zone": CENTRAL, "accelerator": "v4-32",
                   "pricing": "spot", "index": 0}, "api": {"code": "RESOURCE_EXHAUSTED", "kind": "stockout", "message": "none"}}
    for _ in range(3):
        j = evolve(j, "queued", no_capacity, time=at(NOW - 100), seq=j.position + 1, version=j.version + 1)
        j = evolve(j, *hold[0], time=at(NOW - 100), seq=j.position + 1, version=j.version + 1)
        j = evolve(j, "provisioning", {"attempt": 1, "tpu": tpu}, time=at(NOW - 100), seq=j.position + 1, version=j.version + 1)
        j = evolve(j, "released", {"tpu": tpu, "reason": "the create failed", "existed": False}, time=at(NOW - 100),
                   seq=j.position + 1, version=j.version + 1)
        j = evolve(j, "queued", failed, time=at(NOW - 100), seq=j.position + 1, version=j.version + 1)
    assert j.state == "queued" and j.queued_count == 3
    config = PlanConfig(queued_retry_s=10, queued_retry_max_s=300)
    assert plan({j.id: j}, Observed(now=NOW - 100 + 39, zones=frozenset({CENTRAL})), config=config) == []
    again = plan({j.id: j}, Observed(now=NOW - 100 + 41, zones=frozenset({CENTRAL})), config=config)
    assert [a.kind for a in again] == ["provision"]
