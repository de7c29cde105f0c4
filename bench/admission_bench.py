"""Admission figures: one admission pass (reconciler.admission.admit) and one whole plan()
with a sharing policy, over W waiting jobs and R running ones (default 10,000 and 500), 50
owners in 6 weighted teams (the fair tree), with quotas per user (chips and chip-hours per
week), team and lab, a preemption rule. Median of runs.

The waiting jobs mix priorities and sizes; most of them are held back (the lab is full, half
the owners have spent their week), which is the expensive case: every one is placed and
given its own first blocker. Also: plan() over the same jobs without a policy, for the cost
admission adds, `ledger queue`'s read model (admission.explain), and **quiet waiting**: an
hour of passes (one every --every seconds) while the week's figures and the decayed usage
move at every pass and no job's cause changes: the `queued` events written (0 expected).

With --ledger-events N: what `ledger queue` (and a reconciler's first pass) reads besides
the jobs: the fair-share input (queueview.recent_usage) folded from the whole ledger and from
a usage snapshot SNAPSHOT_EVERY - 1 events behind the head, beside
the jobs' state from snapshot + tail (load_state), over bench/workload.py's ledger of N
events in a SQLite file (--db keeps it for the next run).

    python bench/admission_bench.py [--waiting 10000] [--running 500] [--runs 9] [--every 10] [--json]
    python bench/admission_bench.py --ledger-events 200000 --db /tmp/admission-200k.db --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from usage_bench import build  # noqa: E402

from ledger.app.queueview import recent_usage  # noqa: E402
from ledger.events import format_time  # noqa: E402
from ledger.fold import evolve, initial  # noqa: E402
from ledger.replay import SNAPSHOT_EVERY, load_state, save_snapshot  # noqa: E402
from ledger.spec.policy import parse_policy  # noqa: E402
from ledger.usage.snapshot import load_usage, save_usage  # noqa: E402
from reconciler.admission import Usage, admit, explain  # noqa: E402
from reconciler.model import HostObs, NodeObs, Observed, PlanConfig  # noqa: E402
from reconciler.plan import plan, tpu_request  # noqa: E402

ZONE = "us-central2-b"
OWNERS = [f"user{i}" for i in range(50)]
TEAMS = {f"@lab/t{t}": [o for i, o in enumerate(OWNERS) if i % 6 == t] for t in range(6)}
POLICY = "\n".join([
    "teams:", *(f'  "{t}": [{", ".join(m)}]' for t, m in TEAMS.items()),
    "quotas:",
    "  lab: {chips: {v4: 8192}}",
    "  teams:", *(f'    "{t}": {{chips: {{v4: 2048}}}}' for t in TEAMS),
    "  default_user: {chips: {v4: 256}, chip_hours_per_week: {v4: 5000}}",
    "priorities:",
    "  classes: {low: 100, normal: 500, urgent: 900}",
    "  preempt: {urgent: [low]}",
    "fair_share:",
    "  half_life_hours: 168",
    "  teams: {" + ", ".join(f'"{t}": {i + 1}' for i, t in enumerate(TEAMS)) + "}",
]) + "\n"
SIZES = ("v4-8", "v4-16", "v4-32", "v4-64")


def lab(waiting: int, running: int):
    jobs, nodes, hosts = {}, {}, {}
    for seq, i in enumerate(range(running + waiting), start=1):
        owner = OWNERS[i % len(OWNERS)]
        spec = {"job": {"name": f"j{i}"}, "tpu": {"accelerator": SIZES[i % 4], "zone": ZONE, "pricing": "spot"},
                "command": {"cmd": "python train.py", "workers": "all"}, "priority": (100, 500, 500, 900)[i % 4]}
        j = evolve(initial(f"{owner}/job{i}"), "submitted", {"spec": spec, "spec_hash": "h", "commit": f"c{i}"}, seq=seq)
        if i < running:
            want = tpu_request(j)
            j = evolve(j, "provisioning", {"attempt": 1, "tpu": want})
            j = evolve(j, "provisioned", {"tpu": want, "hosts": [{"worker": 0}]})
            j = evolve(evolve(evolve(j, "setup_started", {}), "setup_done", {}), "started", {"spec_hash": "h"})
            nodes[want["name"]] = NodeObs(want["name"], ZONE, "READY", {"managed-by": "tpu-ledger"}, create_time=time.time())
            hosts[j.id] = {0: HostObs("running")}
        jobs[j.id] = j
    obs = Observed(now=time.time(), zones=frozenset({ZONE}), nodes=nodes, hosts=hosts)
    return jobs, obs


def median_ms(fn, runs: int) -> tuple[float, float]:
    """(wall, CPU) medians in ms: on a shared machine the CPU time is the steadier figure."""
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def usage_at_hour(hours: float) -> Usage:
    """The figures a pass sees `hours` into the bench: every owner's decayed usage and week
    grow with what they run (half the owners are over their 5,000 chip-hours)."""
    return Usage(decayed={o: float(i) + hours * (i % 7) for i, o in enumerate(OWNERS)},
                 week={(o, "v4"): 200.0 * i + hours * 64 for i, o in enumerate(OWNERS)})


def quiet_hour(jobs: dict, obs: Observed, policy, every: float) -> dict[str, int]:
    """An hour of passes, one every `every` seconds, the figures moving at each: the `queued`
    events recorded after the first pass (which records every wait once); other events
    (`quota_spent` of a running job over its week: once per attempt) apart."""
    config = PlanConfig(policy=policy)
    jobs = dict(jobs)
    written = {"first_pass": 0, "after": 0, "passes": 0, "other_events": 0}
    steps = int(3600 / every)
    for n in range(steps + 1):
        when = format_time(datetime.fromtimestamp(obs.now + n * every, UTC))
        for action in plan(jobs, obs, config=config, usage=usage_at_hour(n * every / 3600)):
            if action.kind != "record":
                continue
            for event in action.params["events"]:
                jobs[action.job_id] = evolve(jobs[action.job_id], event.event_type, event.to_builtins(), time=when)
                key = "other_events" if event.event_type != "queued" else "first_pass" if n == 0 else "after"
                written[key] += 1
        written["passes"] += 1
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waiting", type=int, default=10_000)
    ap.add_argument("--running", type=int, default=500)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between passes in the quiet hour")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ledger-events", type=int, default=0, help="also time the reads of ledger queue over a ledger this big")
    ap.add_argument("--db", type=Path, default=None, help="the SQLite file of that ledger (built once, kept)")
    args = ap.parse_args()
    policy, errors = parse_policy(POLICY)
    assert not errors, errors
    if args.ledger_events:
        ledger_reads(args, policy)
        return
    jobs, obs = lab(args.waiting, args.running)
    usage = usage_at_hour(0)
    decision = admit(jobs, policy, usage)
    config = PlanConfig(policy=policy)
    first_pass = median_ms(lambda: plan(jobs, obs, config=config, usage=usage), args.runs)
    # Steady state: every job held back has its reason recorded already (one `queued` per change).
    for job_id, wait in decision.waits.items():
        jobs[job_id] = evolve(jobs[job_id], "queued", wait.event().to_builtins())
    causes: dict[str, int] = {}
    for wait in decision.waits.values():
        key = f"{wait.cause} {wait.scope.split()[0]}" + (f" ({wait.detail or wait.unit})" if wait.cause == "quota" else "")
        causes[key] = causes.get(key, 0) + 1
    figures = {
        "waiting": args.waiting, "running": args.running, "owners": len(OWNERS), "teams": len(TEAMS),
        "admitted": len(decision.admitted), "held_back": len(decision.waits), "victims": len(decision.preempt),
        "causes": causes,
        "admit_ms": median_ms(lambda: admit(jobs, policy, usage), args.runs),
        "plan_first_pass_ms": first_pass,
        "plan_with_policy_ms": median_ms(lambda: plan(jobs, obs, config=config, usage=usage), args.runs),
        "plan_without_policy_ms": median_ms(lambda: plan(jobs, obs, config=PlanConfig()), args.runs),
        "explain_ms": median_ms(lambda: explain(jobs, policy, usage), args.runs),
        "quiet_hour": quiet_hour(jobs, obs, policy, args.every),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"{args.waiting} waiting, {args.running} running, {len(OWNERS)} owners in {len(TEAMS)} teams: "
          f"{figures['admitted']} admitted, {figures['held_back']} held back, {figures['victims']} victims chosen")
    print("  held back by: " + ", ".join(f"{k} {v}" for k, v in sorted(causes.items())))
    for key, label in (("admit_ms", "admission pass (admit), target <= 50 ms"), ("plan_first_pass_ms", "plan(), first pass: records every wait"),
                       ("plan_with_policy_ms", "plan() with the policy, reasons recorded"),
                       ("plan_without_policy_ms", "plan() without a policy"), ("explain_ms", "ledger queue's read model")):
        wall, cpu = figures[key]
        print(f"{label:42s} median {wall:7.1f} ms wall, {cpu:7.1f} ms CPU")
    quiet = figures["quiet_hour"]
    print(f"quiet hour: {quiet['passes']} passes, one every {args.every:g} s, figures moving: "
          f"{quiet['first_pass']} queued events at the first pass, {quiet['after']} after (target 0); "
          f"{quiet['other_events']} other events (quota_spent, once per running attempt)")


def ledger_reads(args, policy) -> None:
    """The usage fold `ledger queue` makes from seq 0, beside the state it reads."""
    db = args.db or Path(f"/tmp/admission-{args.ledger_events}.db")
    store = build(db, args.ledger_events, max(1, args.ledger_events // 100), lambda text: print(text, file=sys.stderr))
    try:
        for snap in store.list_snapshots():  # from seq 0 first: no snapshot of either kind
            store.delete_snapshot(snap)
        figures = {"events": store.head(),
                   "recent_usage_ms": median_ms(lambda: recent_usage(store, policy), args.runs),
                   "load_state_no_snapshot_ms": median_ms(lambda: load_state(store, use_snapshot=False), args.runs)}
        save_snapshot(store, load_state(store))  # as the reconciler keeps one (every SNAPSHOT_EVERY events)
        figures["load_state_ms"] = median_ms(lambda: load_state(store), args.runs)
        # The usage snapshot as the reconciler keeps one, at its stalest (SNAPSHOT_EVERY - 1 behind).
        save_usage(store, *load_usage(store, policy.fair_share.half_life_hours,
                                      until=max(0, store.head() - SNAPSHOT_EVERY + 1)), now=None)
        figures["recent_usage_snapshot_ms"] = median_ms(lambda: recent_usage(store, policy), args.runs)
    finally:
        store.close()
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for key, label in (("recent_usage_ms", "fair-share input, folded from seq 0"),
                       ("recent_usage_snapshot_ms", "fair-share input, usage snapshot 9,999 old"),
                       ("load_state_no_snapshot_ms", "jobs' state, replayed from seq 0"),
                       ("load_state_ms", "jobs' state from a snapshot at the head")):
        wall, cpu = figures[key]
        print(f"{figures['events']:,} events: {label:38s} median {wall:8.1f} ms wall, {cpu:8.1f} ms CPU")


if __name__ == "__main__":
    main()
