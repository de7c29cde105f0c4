"""The capacity memory (a fold of stockouts) and the placement step (which choice now), pure."""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.capacity import CapacityMemory
from ledger.fold import JobState
from reconciler.placement import Hold, Try, choose

S = 1_000_000
T0 = 1_800_000_000 * S
V4 = {"zone": "us-central2-b", "accelerator": "v4-32", "pricing": "spot"}
V5 = {"zone": "us-west4-a", "accelerator": "v5litepod-32", "pricing": "spot"}
SPEC = {"tpu": {"accelerator": "v4-32", "zone": "us-central2-b", "pricing": "spot", "allocation_mode": "tpu-vm",
                "failover": {"stockouts": 1},
                "fallbacks": [{"accelerator": "v5litepod-32", "zone": "us-west4-a", "pricing": "spot", "allocation_mode": "tpu-vm"},
                              {"accelerator": "v4-32", "zone": "us-central2-b", "pricing": "ondemand", "allocation_mode": "tpu-vm"}]}}
ONE = {"tpu": {"accelerator": "v4-32", "zone": "us-central2-b", "pricing": "spot"}}


def at(us: int) -> str:
    return datetime.fromtimestamp(us / S, UTC).isoformat().replace("+00:00", "Z")


def stockout(mem: CapacityMemory, job: str, where: dict, index: int, t: int) -> None:
    mem.apply(job, "queued", at(t), {"reason": "no capacity", "api": {"code": "RESOURCE_EXHAUSTED", "kind": "stockout",
                                                                     "message": "There is no more capacity"},
                                     "placement": {**where, "index": index}})


def created(mem: CapacityMemory, job: str, where: dict, index: int, t: int) -> None:
    mem.apply(job, "provisioning", at(t), {"attempt": 1, "tpu": {"name": "n", **where, "placement": index}})


def test_stockouts_back_off_per_key_and_a_created_tpu_clears_them():
    mem = CapacityMemory()
    for i in range(50):  # a burst of creates asked before anyone knew: one step
        stockout(mem, f"u{i}/j", V4, 0, T0 + i * 1000)
    found = mem.stockouts(("us-central2-b", "v4-32", "spot"))
    assert (found.count, found.steps, found.next_us - T0) == (50, 1, 10 * S)
    t = T0
    for _ in range(3):  # probes when due: 10 s doubling
        t = mem.next_probe(("us-central2-b", "v4-32", "spot"))
        stockout(mem, "u0/j", V4, 0, t)
    found = mem.stockouts(("us-central2-b", "v4-32", "spot"))
    assert (found.steps, found.next_us - t) == (4, 80 * S)
    for _ in range(10):
        t = mem.next_probe(("us-central2-b", "v4-32", "spot"))
        stockout(mem, "u0/j", V4, 0, t)
    assert mem.next_probe(("us-central2-b", "v4-32", "spot")) - t == 300 * S  # capped
    assert mem.tally("u0/j")[0].count == 14
    created(mem, "bob/b", V4, 0, t + 60 * S)
    assert mem.stockouts(("us-central2-b", "v4-32", "spot")) is None and mem.ran_on["bob/b"] == 0
    # another pricing of the same type is another key
    stockout(mem, "alice/a", {**V4, "pricing": "ondemand"}, 2, T0)
    assert mem.next_probe(("us-central2-b", "v4-32", "spot")) == 0


def test_old_queued_events_without_api_fields_teach_nothing():
    mem = CapacityMemory()
    mem.apply("alice/a", "queued", at(T0), {"reason": "no capacity for v4-32 in us-central2-b: ..."})
    assert mem.keys == {} and mem.rounds == {}


def test_first_stockout_moves_to_the_next_choice_in_the_same_round():
    mem, job = CapacityMemory(), JobState(id="alice/a", spec=SPEC)
    first = choose(job, mem, T0)
    assert isinstance(first, Try) and first.choice.index == 0 and first.reason == ""
    stockout(mem, "alice/a", V4, 0, T0)
    second = choose(job, mem, T0 + S)
    assert isinstance(second, Try) and second.choice.index == 1
    assert second.reason.startswith("v4-32 spot us-central2-b: out of capacity once, next probe ")
    assert second.reason.endswith("; trying v5litepod-32 spot us-west4-a")


def test_a_zone_another_job_found_empty_is_skipped_and_probed_by_one_job_only():
    mem = CapacityMemory()
    stockout(mem, "carol/c", V4, 0, T0)
    with_fallbacks = choose(JobState(id="alice/a", spec=SPEC), mem, T0 + S)
    assert isinstance(with_fallbacks, Try) and with_fallbacks.choice.index == 1
    # jobs with the one choice wait for its probe; when it is due exactly one probes it
    waiting = [JobState(id=f"u{i}/j", spec=ONE) for i in range(50)]
    before = [choose(j, mem, T0 + S) for j in waiting]
    assert all(isinstance(h, Hold) and h.reason == "waiting for capacity: v4-32 spot us-central2-b" for h in before)
    probing: set = set()
    tries = []
    for j in waiting:
        got = choose(j, mem, T0 + 11 * S, probing)
        if isinstance(got, Try):
            tries.append(got)
            if got.probe:
                probing.add(got.choice.key)
    assert len(tries) == 1 and tries[0].probe


def test_every_choice_spent_probes_the_first_due_then_waits_for_the_soonest():
    mem, job = CapacityMemory(), JobState(id="alice/a", spec=SPEC)
    stockout(mem, "alice/a", V4, 0, T0)
    stockout(mem, "alice/a", V5, 1, T0 + 1 * S)
    stockout(mem, "alice/a", {**V4, "pricing": "ondemand"}, 2, T0 + 2 * S)
    held = choose(job, mem, T0 + 3 * S)
    assert isinstance(held, Hold) and held.reason == "waiting for capacity: every choice" and held.until_us == T0 + 10 * S
    assert "v5litepod-32 spot us-west4-a: out of capacity once" in held.detail
    due = choose(job, mem, T0 + 10 * S)
    assert isinstance(due, Try) and due.choice.index == 0 and due.probe and "probing v4-32 spot us-central2-b" in due.reason


def test_stockouts_and_wait_s_decide_how_long_a_choice_is_kept():
    spec = {"tpu": {**SPEC["tpu"], "failover": {"stockouts": 3, "wait_s": 60}}}
    mem, job = CapacityMemory(), JobState(id="alice/a", spec=spec)
    stockout(mem, "alice/a", V4, 0, T0)
    kept = choose(job, mem, T0 + S)
    assert isinstance(kept, Hold)  # its own first choice again, at the next probe
    assert isinstance(choose(job, mem, T0 + 10 * S), Try) and choose(job, mem, T0 + 10 * S).choice.index == 0
    stockout(mem, "alice/a", V4, 0, T0 + 10 * S)
    assert choose(job, mem, T0 + 61 * S).choice.index == 1  # wait_s since its first stockout


def test_recovery_starts_where_it_ran_unless_it_prefers_the_first():
    mem = CapacityMemory()
    created(mem, "alice/a", V5, 1, T0)
    mem.apply("alice/a", "resumed", at(T0 + S), {"attempt": 2, "restarts": 1})
    assert choose(JobState(id="alice/a", spec=SPEC), mem, T0 + 2 * S).choice.index == 1
    first = {"tpu": {**SPEC["tpu"], "failover": {"prefer_first": True}}}
    assert choose(JobState(id="alice/a", spec=first), mem, T0 + 2 * S).choice.index == 0


def test_a_shared_tpu_has_no_choices():
    assert choose(JobState(id="a/b", spec={"tpu": {"shared": True, "name": "x"}}), CapacityMemory(), T0) is None
