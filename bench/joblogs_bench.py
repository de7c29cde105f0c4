"""What collecting job logs costs a reconciler: one collection pass over a log directory of
many past attempts (over and collected) and a few running ones.

    .venv/bin/python bench/joblogs_bench.py                  # 10,000 past attempts, 20 running
    .venv/bin/python bench/joblogs_bench.py --past 1000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reconciler.joblogs import Collector, DirArchive  # noqa: E402
from reconciler.remote.layout import local_attempt_dir  # noqa: E402

LINE = b"step 1234 loss 0.4321 tokens/s 98765\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--past", type=int, default=10_000, help="attempts that are over (default 10,000)")
    parser.add_argument("--running", type=int, default=20, help="attempts under way (default 20)")
    parser.add_argument("--runs", type=int, default=9, help="passes measured; the median is reported (default 9)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        for j in range(args.past):
            d = local_attempt_dir(logs, f"u{j % 30}/past-{j}", 1)
            d.mkdir(parents=True)
            (d / "setup_worker_0.log").write_bytes(LINE * 10)
            (d / "output_worker_0.log").write_bytes(LINE * 100)
            (d / "status_worker_0.json").write_bytes(b'{"state": "exited", "exit_code": 0}')
        running = []
        for j in range(args.running):
            d = local_attempt_dir(logs, f"u{j % 30}/run-{j}", 1)
            d.mkdir(parents=True)
            running.append(d / "output_worker_0.log")
        collector = Collector(logs, DirArchive(Path(tmp) / "archive"))
        started = time.perf_counter()
        collector.run_pass()
        first = time.perf_counter() - started
        collector.run_pass()  # the past attempts settle
        walls, cpus = [], []
        for _ in range(args.runs):
            for path in running:  # what a probe fetches between two passes
                with open(path, "ab") as f:
                    f.write(LINE * 50)
            w, c = time.perf_counter(), time.process_time()
            collector.run_pass()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
    print(f"{args.past:,} past attempts (3 files each), {args.running} running; load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"  first pass (collects everything)        {first:7.2f} s")
    print(f"  steady pass, median of {args.runs}             {statistics.median(walls) * 1000:7.1f} ms"
          f"   (CPU {statistics.median(cpus) * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
