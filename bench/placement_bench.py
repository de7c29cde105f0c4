"""The planner with placements, pure: `plan` over many waiting jobs with 3 choices each.

10,000 jobs (by default) wait for a TPU, each with a `tpu` block and two fallbacks across
three zones and three types; the capacity memory knows one key out of capacity (a third of
the jobs' first choice: the placement step moves them on, or holds those with one choice).
One pass of `plan` (the placement step for every waiting job, admission under a lab quota
charging the choices picked, every job's action) is timed in the steady state (each waiting
job's reason already recorded, as after the first pass); the median of `--repeat` passes is
printed, with the same pass without fallbacks (one choice each) measured in the same run
for the ratio.

    python bench/placement_bench.py [--jobs 10000] [--repeat 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledger.capacity import CapacityMemory  # noqa: E402
from ledger.events import format_time  # noqa: E402
from ledger.fold import evolve, initial  # noqa: E402
from ledger.spec.policy import parse_policy  # noqa: E402
from reconciler.model import Observed, PlanConfig  # noqa: E402
from reconciler.plan import plan  # noqa: E402

NOW = 1_800_000_000.0
ZONES = ("us-central2-b", "us-west4-a", "us-east1-d")
CHOICES = [("v4-32", "us-central2-b", "spot"), ("v5litepod-32", "us-west4-a", "spot"), ("v6e-32", "us-east1-d", "spot")]
POLICY = parse_policy("quotas:\n  lab:\n    chips: {v4: 4096, v5litepod: 4096, v6e: 4096}\n").policy


def spec(i: int, fallbacks: bool) -> dict:
    first, *rest = CHOICES[i % 3:] + CHOICES[: i % 3]
    tpu = {"accelerator": first[0], "zone": first[1], "pricing": first[2], "allocation_mode": "tpu-vm"}
    if fallbacks:
        tpu["fallbacks"] = [{"accelerator": a, "zone": z, "pricing": p, "allocation_mode": "tpu-vm"} for a, z, p in rest]
    return {"job": {"name": f"j{i}"}, "tpu": tpu, "command": {"cmd": "train", "workers": "all"}, "recovery": {"max_restarts": 3}}


def jobs(n: int, fallbacks: bool) -> dict:
    when = format_time(datetime.fromtimestamp(NOW - 60, UTC))
    out = {}
    for i in range(n):
        job_id = f"u{i % 97}/j{i}"
        out[job_id] = evolve(initial(job_id), "submitted", {"spec": spec(i, fallbacks), "spec_hash": "h", "commit": f"c{i}"},
                             time=when, seq=i + 1, version=1)
    return out


def memory() -> CapacityMemory:
    mem = CapacityMemory()
    a, z, p = CHOICES[0]
    when = format_time(datetime.fromtimestamp(NOW - 2, UTC))
    mem.apply("u0/j0", "queued", when, {"api": {"code": "RESOURCE_EXHAUSTED", "kind": "stockout"},
                                        "placement": {"zone": z, "accelerator": a, "pricing": p, "index": 0}})
    return mem


def settled(state: dict, mem: CapacityMemory) -> dict:
    """The jobs after a first pass's records (each waiting job's reason, once): the steady
    state every later pass plans over."""
    obs = Observed(now=NOW, zones=frozenset(ZONES))
    out = dict(state)
    for action in plan(state, obs, config=PlanConfig(policy=POLICY), memory=mem):
        if action.kind == "record":
            job = out[action.job_id]
            for d in action.params["events"]:
                job = evolve(job, d.event_type, d.to_builtins(), seq=job.position + 1, version=job.version + 1)
            out[action.job_id] = job
    return out


def timed(state: dict, mem: CapacityMemory, repeat: int) -> tuple[float, int]:
    obs = Observed(now=NOW, zones=frozenset(ZONES))
    config = PlanConfig(policy=POLICY)
    state = settled(state, mem)
    times, actions = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        actions = len(plan(state, obs, config=config, memory=mem))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), actions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    mem = memory()
    with_fb, n_fb = timed(jobs(args.jobs, True), mem, args.repeat)
    without, n_one = timed(jobs(args.jobs, False), mem, args.repeat)
    out = {"jobs": args.jobs, "choices": 3, "plan_ms": round(with_fb * 1000, 1), "actions": n_fb,
           "plan_one_choice_ms": round(without * 1000, 1), "actions_one_choice": n_one,
           "ratio": round(with_fb / without, 2) if without else None}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"plan over {args.jobs:,} waiting jobs with 3 choices each: median {out['plan_ms']} ms "
          f"({n_fb:,} actions; target <= 50 ms)")
    print(f"  the same jobs with one choice each: {out['plan_one_choice_ms']} ms ({n_one:,} actions); ratio {out['ratio']}")


if __name__ == "__main__":
    main()
