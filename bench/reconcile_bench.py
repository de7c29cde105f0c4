"""Reconciler figures.

- plan(): time to plan over N jobs (default 10,000, 100 of them running), median of runs.
- API calls per pass: TPU API calls one observation makes, against zones in use.
- Preemption reaction (with --emulator): the emulator preempts a running job's node; we
  measure preemption -> `preempted` in the ledger, and -> the re-create request.

    python bench/reconcile_bench.py [--jobs 10000] [--runs 7] [--preemptions 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledger.fold import evolve, initial  # noqa: E402
from reconciler.model import HostObs, NodeObs, Observed  # noqa: E402
from reconciler.plan import plan, tpu_request  # noqa: E402

ZONES = ("us-central2-b", "us-east1-d", "europe-west4-a")


def synthetic_jobs(n: int, running: int):
    jobs, nodes, hosts = {}, {}, {}
    for i in range(n):
        zone = ZONES[i % len(ZONES)]
        spec = {"job": {"name": f"j{i}"}, "tpu": {"accelerator": "v4-32", "zone": zone, "pricing": "spot"},
                "command": {"cmd": "python train.py", "workers": "all"}}
        j = evolve(initial(f"user{i % 97}/job{i}"), "submitted", {"spec": spec, "spec_hash": "h", "commit": f"c{i}"}, seq=i + 1)
        if i < running:
            want = tpu_request(j)
            j = evolve(j, "provisioning", {"attempt": 1, "tpu": want})
            j = evolve(j, "provisioned", {"tpu": want, "hosts": [{"worker": w} for w in range(4)]})
            j = evolve(evolve(j, "setup_started", {}), "setup_done", {})
            j = evolve(j, "started", {"spec_hash": "h"})
            nodes[want["name"]] = NodeObs(want["name"], zone, "READY", {"managed-by": "tpu-ledger"}, create_time=time.time())
            hosts[j.id] = {w: HostObs("running") for w in range(4)}
        else:
            j = evolve(j, "finished", {})
        jobs[j.id] = j
    return jobs, Observed(now=time.time(), zones=frozenset(ZONES), nodes=nodes, hosts=hosts)


def bench_plan(n: int, running: int, runs: int) -> dict:
    jobs, obs = synthetic_jobs(n, running)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        plan(jobs, obs)
        times.append(time.perf_counter() - t)
    return {"jobs": n, "running": running, "plan_ms_median": round(statistics.median(times) * 1000, 2),
            "plan_ms_min": round(min(times) * 1000, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--running", type=int, default=100)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--preemptions", type=int, default=0, help="measure preemption reaction on the emulator (N runs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = {"plan": bench_plan(args.jobs, args.running, args.runs)}
    if args.preemptions:
        from bench.reconcile_preemption import measure  # needs the emulator and SSH runner

        result["preemption"] = measure(args.preemptions)
    if args.json:
        print(json.dumps(result))
        return
    p = result["plan"]
    print(f"plan over {p['jobs']} jobs ({p['running']} running): median {p['plan_ms_median']} ms (target <= 50 ms)")
    if "preemption" in result:
        for k, v in result["preemption"].items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
