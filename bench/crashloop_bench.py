"""Progress under a crash loop: release intent -> outcome while `ledger reconcile` (a real
process on a SQLite ledger, against the emulator) is kill -9'd every `--period` seconds and
started again at once under the same id.

Jobs are brought to RUNNING, then all end at once (two finish, one fails under `on_failure:
pass`), so their releases fall at random points of the kill cycle. Two modes:

- kill-loop:     only the periodic SIGKILL;
- crash-at-intent: besides, the process that records a release intent kills itself right
                 after it (LEDGER_FAULT_CRASH=release:intent): every release is carried on
                 by a later process, the worst case.

Times come from the ledger (event `time`, stamped at append): each release intent to its
outcome. Prints the median and the maximum per mode; the target is <= 10 s.

    python bench/crashloop_bench.py [--rounds 2] [--jobs 3] [--period 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulator import Emulator  # noqa: E402
from tests.reconciler.conftest import Harness  # noqa: E402
from tests.reconciler.crashloop import intent_outcome_times, run_crash_loop  # noqa: E402

MODES = {"kill-loop": "", "crash-at-intent": "release:intent"}


def one_round(jobs: int, period: float, crash_at: str) -> tuple[list[float], int, int]:
    """Release times (s), unresolved releases, kills."""
    with tempfile.TemporaryDirectory() as tmp, Emulator(state_dir=Path(tmp) / "emulator") as emu:
        h = Harness(emu, f"sqlite:///{Path(tmp) / 'ledger.db'}", Path(tmp))
        specs = {f"bench/j{i}": "exit 3" if i % 3 == 2 else "exit 0" for i in range(jobs)}
        loop = run_crash_loop(h, specs, period=period, crash_at=crash_at)
        times = intent_outcome_times(h.store_url, "release")
        return [t for _, t in times if t is not None], sum(t is None for _, t in times), loop.kills


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--period", type=float, default=3.0, help="seconds between kills")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = {}
    for mode, crash_at in MODES.items():
        times: list[float] = []
        unresolved = kills = 0
        for _ in range(args.rounds):
            t, u, k = one_round(args.jobs, args.period, crash_at)
            times += t
            unresolved += u
            kills += k
        results[mode] = {
            "releases": len(times), "unresolved": unresolved, "kills": kills, "period_s": args.period,
            "median_s": round(statistics.median(times), 2) if times else None,
            "max_s": round(max(times), 2) if times else None,
        }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for mode, r in results.items():
        print(f"{mode:16} release intent -> outcome: median {r['median_s']} s, max {r['max_s']} s "
              f"({r['releases']} releases, {r['unresolved']} unresolved, {r['kills']} kills every {r['period_s']} s)")


if __name__ == "__main__":
    main()
