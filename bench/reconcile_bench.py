"""Reconciler figures.

- plan(): time to plan over N jobs (default 10,000, 100 of them running), median of runs;
  once with finished jobs that never held a TPU, once with finished jobs that each
  released one an hour ago (what a real ledger holds: the orphan check reads those).
- Preemption reaction (bench/reconcile_preemption.py, real emulator + SQLite + reconciler
  thread): the emulator preempts a running job's node; preemption -> `preempted` in the
  ledger -> the re-create request, and TPU API calls per idle pass vs zones in use.
  `--preemptions 0` skips it (plan only, a few seconds).

    python bench/reconcile_bench.py [--jobs 10000] [--runs 7] [--preemptions 5]
                                    [--interval 1.0 2.0] [--race] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledger.events import format_time  # noqa: E402
from ledger.fold import evolve, initial  # noqa: E402
from reconciler.model import HostObs, NodeObs, Observed  # noqa: E402
from reconciler.plan import plan, tpu_request  # noqa: E402

ZONES = ("us-central2-b", "us-east1-d", "europe-west4-a")


def synthetic_jobs(n: int, running: int, *, history: bool = False):
    """`n` jobs, the first `running` of them running on 4-host TPUs, the rest finished. With
    `history`, a finished job went through a whole attempt and released its TPU an hour ago,
    as finished jobs in a real ledger did (without it they never held a TPU)."""
    jobs, nodes, hosts = {}, {}, {}
    released_at = format_time(datetime.now(UTC) - timedelta(hours=1))
    for i in range(n):
        zone = ZONES[i % len(ZONES)]
        spec = {"job": {"name": f"j{i}"}, "tpu": {"accelerator": "v4-32", "zone": zone, "pricing": "spot"},
                "command": {"cmd": "python train.py", "workers": "all"}}
        j = evolve(initial(f"user{i % 97}/job{i}"), "submitted", {"spec": spec, "spec_hash": "h", "commit": f"c{i}"}, seq=i + 1)
        if i < running or history:
            want = tpu_request(j)
            j = evolve(j, "provisioning", {"attempt": 1, "tpu": want})
            j = evolve(j, "provisioned", {"tpu": want, "hosts": [{"worker": w} for w in range(4)]})
            j = evolve(evolve(j, "setup_started", {}), "setup_done", {})
            j = evolve(j, "started", {"spec_hash": "h"})
        if i < running:
            nodes[want["name"]] = NodeObs(want["name"], zone, "READY", {"managed-by": "tpu-ledger"}, create_time=time.time())
            hosts[j.id] = {w: HostObs("running") for w in range(4)}
        elif history:
            j = evolve(evolve(j, "finished", {}), "released", {"tpu": want}, time=released_at)
        else:
            j = evolve(j, "finished", {})
        jobs[j.id] = j
    return jobs, Observed(now=time.time(), zones=frozenset(ZONES), nodes=nodes, hosts=hosts)


def bench_plan(n: int, running: int, runs: int, *, history: bool = False) -> dict:
    jobs, obs = synthetic_jobs(n, running, history=history)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        plan(jobs, obs)
        times.append(time.perf_counter() - t)
    return {"jobs": n, "running": running, "history": history, "plan_ms_median": round(statistics.median(times) * 1000, 2),
            "plan_ms_min": round(min(times) * 1000, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--running", type=int, default=100)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--preemptions", type=int, default=5, help="preemptions per interval on the emulator (0 = skip)")
    ap.add_argument("--interval", type=float, nargs="+", default=[None],
                    help="reconcile interval(s) in seconds, one preemption run each (default: Settings' 2.0)")
    ap.add_argument("--race", action="store_true", help="also replay the preempted-during-probe race")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = {"plan": bench_plan(args.jobs, args.running, args.runs),
              "plan_with_history": bench_plan(args.jobs, args.running, args.runs, history=True)}
    if args.preemptions:
        # needs the emulator and the SSH runner: imported only when asked for
        from bench.reconcile_preemption import measure, race, table

        result["preemption"] = [
            measure(args.preemptions, interval=iv, zones=i == 0) for i, iv in enumerate(args.interval)]
        if args.race:
            result["race"] = race()
    if args.json:
        print(json.dumps(result))
        return
    for p in (result["plan"], result["plan_with_history"]):
        finished = "finished jobs released a TPU an hour ago" if p["history"] else "finished jobs never held a TPU"
        print(f"plan over {p['jobs']} jobs ({p['running']} running; {finished}): "
              f"median {p['plan_ms_median']} ms, min {p['plan_ms_min']} ms (target <= 50 ms)")
    if "preemption" in result:
        print(table(result["preemption"]))
    if "race" in result:
        print(f"race: {result['race']}")


if __name__ == "__main__":
    main()
