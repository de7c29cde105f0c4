"""What hostile input costs: the issue's reference bomb and a 12 MB file, refused.

    python bench/hostile_bench.py [--repeat 7] [--json]

Prints, for the 1.4 KB bomb of issue 22 (seven env values, each ten copies of the one
before) and for larger bombs: the median time and peak traced memory of `validate_text`
beside a plain spec's (a ratio from the same run), the wall time and maximum resident size
of `ledger validate` on the file (a fresh process, so interpreter start-up is included) next
to the same command on a plain file, and what `ledger watch` makes of a commit holding the
bomb: ingest time, the `rejected` event's size and the ledger's growth. The bounds to compare
with are 100 ms and 50 MB (the issue: 34 s and 236 MB for validate, 38.6 s, 587 MB and a
111 MB event for watch, before the limits).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ledger.gitops import ingest  # noqa: E402
from ledger.spec.config import load_repo_config  # noqa: E402
from ledger.spec.normalize import validate_text  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402

PLAIN = "tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand:\n  cmd: python train.py\n  env: {A: '1'}\n"
POLICY = "approval:\n  mode: trailers\n  approvers: [c@x]\n"
APPROVED = "\n\nApproved-by: Carol <c@x>"


def bomb(levels: int = 7, fanout: int = 10) -> str:
    lines = ["tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand:\n  cmd: echo $E7\n  env:\n", '    E0: "0123456789"\n']
    for i in range(1, levels + 1):
        lines.append(f'    E{i}: "' + ("${command.env.E" + str(i - 1) + "}") * fanout + '"\n')
    return "".join(lines)


def in_process(text: str, repeat: int) -> tuple[float, int, str]:
    """(median seconds, peak traced bytes, first error) of validate_text."""
    config = load_repo_config()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = validate_text(text, "jobs/alice/x.yaml", config)
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    validate_text(text, "jobs/alice/x.yaml", config)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return statistics.median(times), peak, (result.errors[0].format().splitlines()[0] if result.errors else "ok")


def cli(path: Path, repeat: int) -> tuple[float, int]:
    """(median wall seconds, max RSS in KiB) of `ledger validate <path>` in a fresh process."""
    times, rss = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "validate", str(path)], cwd=path.parent,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
        _, _, usage = os.wait4(proc.pid, 0)
        times.append(time.perf_counter() - t0)
        rss = max(rss, usage.ru_maxrss)
    return statistics.median(times), rss


def git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@x", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, env=env)


def watch(tmp: Path, text: str) -> dict:
    """Ingest one commit holding the bomb, then one plain job: time, event size, ledger growth."""
    repo = tmp / "repo"
    (repo / "jobs" / "alice").mkdir(parents=True)
    (repo / ".ledger").mkdir()
    (repo / ".ledger" / "policy.yaml").write_text(POLICY)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "policy")
    store = SQLiteStore(str(tmp / "ledger.db"))
    ingest(repo, store, "main")
    before = (tmp / "ledger.db").stat().st_size
    (repo / "jobs" / "alice" / "bomb.yaml").write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bomb" + APPROVED)
    (repo / "jobs" / "alice" / "good.yaml").write_text(PLAIN)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "good" + APPROVED)
    t0 = time.perf_counter()
    report = ingest(repo, store, "main")
    seconds = time.perf_counter() - t0
    events = [e for e in store.read_all() if e.stream.startswith("alice/")]
    rejected = next(e for e in events if e.type == "rejected")
    store.close()
    return {"ingest_s": seconds, "counts": report.counts, "rejected_bytes": len(json.dumps(rejected.data)),
            "ledger_growth_bytes": (tmp / "ledger.db").stat().st_size - before,
            "good_submitted": any(e.stream == "alice/good" and e.type == "submitted" for e in events)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out: dict = {"in_process": {}, "cli": {}}
    cases = {"plain": PLAIN, "issue bomb (7x10)": bomb(), "bomb 10x10": bomb(10, 10), "bomb 5x100": bomb(5, 100)}
    for name, text in cases.items():
        s, peak, first = in_process(text, a.repeat)
        out["in_process"][name] = {"bytes": len(text), "median_ms": s * 1000, "peak_mb": peak / 2**20, "verdict": first}
    with tempfile.TemporaryDirectory(prefix="hostile-bench-") as d:
        tmp = Path(d)
        (tmp / ".git").mkdir()
        jobs = tmp / "jobs" / "alice"
        jobs.mkdir(parents=True)
        files = {"plain": PLAIN.encode(), "issue bomb (7x10)": bomb().encode(), "12 MB file": b"#" * 12_000_000 + b"\n"}
        for name, data in files.items():
            path = jobs / (name.split()[0] + ".yaml")
            path.write_bytes(data)
            s, rss = cli(path, max(3, a.repeat // 2))
            out["cli"][name] = {"median_ms": s * 1000, "max_rss_mb": rss / 1024}
        out["watch"] = watch(tmp / "w", bomb())
    if a.json:
        print(json.dumps(out, indent=2))
        return
    plain = out["in_process"]["plain"]["median_ms"]
    print("validate_text (in process, median of", a.repeat, "runs):")
    for name, r in out["in_process"].items():
        print(f"  {name:<20} {r['bytes']:>6} B  {r['median_ms']:8.2f} ms ({r['median_ms'] / plain:5.1f}x plain)  "
              f"peak {r['peak_mb']:6.2f} MB  {r['verdict'][:90]}")
    print("ledger validate FILE (fresh process, interpreter start-up included):")
    for name, r in out["cli"].items():
        print(f"  {name:<20} {r['median_ms']:8.1f} ms  max RSS {r['max_rss_mb']:6.1f} MB")
    w = out["watch"]
    print(f"ledger watch (ingest of bomb commit + good commit): {w['ingest_s'] * 1000:.1f} ms, {w['counts']}, "
          f"rejected event {w['rejected_bytes']:,} B, ledger grew {w['ledger_growth_bytes']:,} B, "
          f"next good job submitted: {w['good_submitted']}")


if __name__ == "__main__":
    main()
