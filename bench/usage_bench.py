"""Usage accounting benchmark: `ledger usage` over a 1M-event, 10k-job SQLite ledger.

    python bench/usage_bench.py                      # 1,000,000 events, 10,000 jobs, 3 runs
    python bench/usage_bench.py --db /tmp/usage-1m.db --runs 5 --json

The ledger is bench/workload.py's (jobs that are provisioned, preempted and recovered over
and over, with reconciler intents and outcomes), stored in a real SQLite file (built once;
`--db` keeps it for the next run). Measured (medians, wall time with CPU time beside it, the
machine may be shared):

- the whole report as `ledger usage` makes it with no usage snapshot: scan the ledger, fold,
  group by owner, save a usage snapshot (target from issue 15: <= 3 s); and the same
  report with `--until` the head, which saves nothing;
- the same from a usage snapshot 9,999 events behind the head (the stalest the snapshot
  rule keeps): decode it, fold the tail, report;
- the parts: scanning the rows alone (the floor), and the fold over rows already in memory;
- `--until` halfway (time travel folds half the ledger);
- a dashboard that keeps one fold current: the last 1,000 events folded in and the report
  asked again;
- the report alone (10,000 jobs' accounts grouped by owner and by job);
- the fold with prices that change ten times over the ledger (`policy_changed` events):
  each change splits every open interval and settles every account's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from workload import workload  # noqa: E402

from ledger.app.commands.usage import fold_usage  # noqa: E402
from ledger.app.queueview import half_life_of  # noqa: E402
from ledger.replay import SNAPSHOT_EVERY, fold_rows  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402
from ledger.usage import UsageFold, summarize, to_us  # noqa: E402
from ledger.usage.snapshot import load_usage, save_usage, usable  # noqa: E402

TARGET_S = 3.0
JOBS_PER_TX = 100
TAIL = 1000


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - w, time.process_time() - c, result


def build(path: Path, events: int, jobs: int, progress) -> SQLiteStore:
    if path.exists():
        store = SQLiteStore(path)
        if store.head() >= events:
            progress(f"reusing {path} ({store.head():,} events)")
            return store
        store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    progress(f"building {path}: {events:,} events over {jobs:,} jobs")
    data = list(workload(events, jobs))
    store = SQLiteStore(path)
    for i in range(0, len(data), JOBS_PER_TX):
        store.append_many([(job, evs, 0) for job, evs in data[i:i + JOBS_PER_TX]])
    return store


def with_price_changes(rows: list[tuple], changes: int) -> list[tuple]:
    """`rows` with `changes` policy_changed events spread evenly among them (seqs renumbered)."""
    every = max(1, len(rows) // changes)
    out: list[tuple] = []
    for i, row in enumerate(rows):
        if i % every == 0:
            prices = [{"family": "v4", "pricing": "spot", "usd_per_chip_hour": 1.0 + i / len(rows)},
                      {"family": "v4", "pricing": "ondemand", "usd_per_chip_hour": 3.0}]
            out.append((0, "_policy", 0, "policy_changed", row[4], json.dumps({"commit": f"c{i}", "prices": prices})))
        out.append(row)
    return [(seq, *row[1:]) for seq, row in enumerate(out, 1)]


def run(store: SQLiteStore, runs: int, progress) -> dict:
    head = store.head()
    m: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        m.setdefault(name, []).append(value)

    rows = list(fold_rows(store, 0, None))
    priced = with_price_changes(rows, 10)
    half_life = half_life_of(store)
    stale = max(0, head - SNAPSHOT_EVERY + 1)  # the stalest usage snapshot the rule keeps
    for r in range(runs):
        progress(f"run {r + 1}/{runs}")
        for snap in store.list_snapshots():  # the full scan: no usage snapshot yet (it saves one)
            store.delete_snapshot(snap)
        # --until the head: the same report, folded from seq 0, but nothing saved (nor a meter fed).
        w0, c0, (fold0, now0) = timed(lambda: fold_usage(store, None, str(head)))
        w1, c1, _ = timed(lambda fold0=fold0, now0=now0: summarize(fold0.figures(now0), "owner"))
        add("usage_nosave_s", w0 + w1)
        add("usage_nosave_cpu_s", c0 + c1)
        wall, cpu, (fold, now) = timed(lambda: fold_usage(store, None, None))
        assert usable(store, half_life, head) is not None
        # Kept current: a usage snapshot SNAPSHOT_EVERY - 1 events old, and the tail after it.
        save_usage(store, *load_usage(store, half_life, until=stale), now=None)
        w3, c3, (fold3, now3) = timed(lambda: fold_usage(store, None, None))
        w4, c4, _ = timed(lambda fold3=fold3, now3=now3: summarize(fold3.figures(now3), "owner"))
        add("usage_snapshot_s", w3 + w4)
        add("usage_snapshot_cpu_s", c3 + c4)
        w2, c2, report = timed(lambda fold=fold, now=now: summarize(fold.figures(now), "owner"))
        add("usage_s", wall + w2)
        add("usage_cpu_s", cpu + c2)
        assert report.total.preemptions > 0 and fold.position == head

        wall, cpu, _ = timed(lambda: sum(1 for _ in fold_rows(store, 0, None)))
        add("scan_s", wall)
        add("scan_cpu_s", cpu)
        wall, cpu, _ = timed(lambda: UsageFold().apply_rows(rows))
        add("fold_in_memory_s", wall)
        add("fold_in_memory_cpu_s", cpu)

        wall, cpu, _ = timed(lambda: UsageFold().apply_rows(priced))
        add("fold_priced_s", wall)
        add("fold_priced_cpu_s", cpu)

        wall, cpu, _ = timed(lambda: fold_usage(store, None, str(head // 2)))
        add("until_half_s", wall)

        # A dashboard: one fold kept current; 1,000 events arrive; it folds them and asks.
        live = UsageFold().apply_rows(rows[:-TAIL])
        now = to_us(rows[-1][4])
        wall, cpu, _ = timed(lambda live=live, now=now: summarize(live.apply_rows(rows[-TAIL:]).figures(now), "owner"))
        add("tail_1000_s", wall)

        figures = fold.figures(now)
        add("report_owner_s", timed(lambda figures=figures: summarize(figures, "owner"))[0])
        add("report_job_s", timed(lambda figures=figures: summarize(figures, "job"))[0])

    medians = {k: statistics.median(v) for k, v in m.items()}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {sys.platform}, Python {sys.version.split()[0]}, load {os.getloadavg()[0]:.1f}",
        "events": head, "jobs": len({r[1] for r in rows}), "runs": runs,
        "medians": medians, "all": m,
        "target": {"usage_s": TARGET_S, "met": medians["usage_s"] <= TARGET_S},
    }


ROWS = [
    ("ledger usage (scan + fold + report by owner), s", "usage_s", "usage_cpu_s"),
    ("  the same, --until the head (no snapshot saved), s", "usage_nosave_s", "usage_nosave_cpu_s"),
    ("ledger usage from a snapshot 9,999 events old, s", "usage_snapshot_s", "usage_snapshot_cpu_s"),
    ("  scan of the rows alone, s", "scan_s", "scan_cpu_s"),
    ("  fold of rows in memory, s", "fold_in_memory_s", "fold_in_memory_cpu_s"),
    ("  the same with 10 price changes, s", "fold_priced_s", "fold_priced_cpu_s"),
    ("ledger usage --until halfway, s", "until_half_s", None),
    ("dashboard: 1,000 more events + report, ms", "tail_1000_s", None),
    ("report by owner (10k jobs' accounts), ms", "report_owner_s", None),
    ("report by job, ms", "report_job_s", None),
]


def print_table(result: dict) -> None:
    med = result["medians"]
    print(f"{result['events']:,} events, {result['jobs']:,} jobs, median of {result['runs']} run(s); {result['machine']}")
    for label, key, cpu in ROWS:
        ms = label.endswith("ms")
        scale, spec = (1000, "{:8.1f}") if ms else (1, "{:8.2f}")
        line = f"  {label:<52} {spec.format(med[key] * scale)}"
        if cpu:
            line += f"   (CPU {spec.format(med[cpu] * scale).strip()})"
        print(line)
    verdict = "met" if result["target"]["met"] else "MISSED"
    print(f"  target: ledger usage over the ledger <= {TARGET_S:.0f} s: {verdict}")


def ledger_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a benchmark over a built ledger (`build`): its size, runs, reuse, output."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the ledger (default 1,000,000)")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs they are spread over (default 10,000)")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are reported (default 3)")
    parser.add_argument("--db", type=Path, default=None, help="keep the ledger in this file and reuse it next time")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def main() -> None:
    args = ledger_arguments(__doc__.split("\n\n")[0]).parse_args()

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        store = build(args.db or Path(tmp) / "usage.db", args.events, args.jobs, progress)
        try:
            result = run(store, args.runs, progress)
        finally:
            store.close()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
