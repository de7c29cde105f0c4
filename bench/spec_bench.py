"""Validation speed of a generated jobs repository (target: 10,000 files in < 10 s).

    python bench/spec_bench.py [--files 10000] [--repeat 3] [--json]

Generates a repository from the template with FILES job specs spread over 100 owners,
mixing every kind of example (single host, pod, queued resource, docker, conda, venv,
shared TPU), then times `validate_paths` over it (files read from disk, config loaded,
every spec parsed, checked and normalized).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledger.app.commands.init import lay_template  # noqa: E402
from ledger.resources import template_dir  # noqa: E402
from ledger.spec.files import validate_paths  # noqa: E402


def generate(root: Path, files: int, owners: int = 100) -> None:
    """A jobs repository with `files` valid job specs (variations of the template examples)."""
    lay_template(root)
    examples = sorted(Path(str(template_dir())).joinpath("jobs", "examples").glob("*.yaml"))
    bodies = [p.read_text(encoding="utf-8") for p in examples]
    for i in range(files):
        owner = f"user-{i % owners:03d}"
        d = root / "jobs" / owner
        d.mkdir(parents=True, exist_ok=True)
        body = bodies[i % len(bodies)]
        body = body.replace("name: ", f"name: run-{i}-", 1)  # the job's name: every file differs
        (d / f"job-{i:05d}.yaml").write_text(body, encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="spec-bench-") as tmp:
        root = Path(tmp)
        generate(root, args.files)
        times, cpu = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            results = validate_paths([root / "jobs"], root)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            bad = [r for r in results if not r.ok]
            if bad:
                raise SystemExit(f"{len(bad)} invalid: {bad[0].errors[0].format()}")
    median = statistics.median(times)
    row = {"files": args.files, "runs": len(times), "median_s": round(median, 3), "min_s": round(min(times), 3),
           "max_s": round(max(times), 3), "per_file_ms": round(median / args.files * 1000, 3),
           "cpu_median_s": round(statistics.median(cpu), 3)}
    if args.json:
        print(json.dumps(row))
        return
    print(f"{'files':>8} {'runs':>5} {'median s':>9} {'min s':>7} {'max s':>7} {'ms/file':>8} {'cpu s':>7}")
    print(f"{row['files']:>8} {row['runs']:>5} {row['median_s']:>9} {row['min_s']:>7} {row['max_s']:>7} {row['per_file_ms']:>8} {row['cpu_median_s']:>7}")


if __name__ == "__main__":
    main()
