"""Watcher figures: push -> `submitted` latency, a 1,000-commit backlog, one commit in a big repo.

    python bench/watch_bench.py [--pushes 40] [--json]

Targets (issue 4): push -> submitted p50 <= 300 ms and p99 <= 1 s with `ledger watch`
running; 1,000 commits ingested in <= 10 s; one commit in a repository of 10,000 job files
ingested in <= 100 ms. Everything is real: a bare hub, a clone, `git push`, SQLite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledger.gitops import Watcher, ingest, install_hook  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402

ALICE = ("Alice Ng", "alice@lab.org")
BOB = ("Bob Li", "bob@lab.org")
POLICY = "approval:\n  mode: trailers\n  required: 1\n  approvers: codeowners\n"
CODEOWNERS = "* @alice\n/jobs/ @bob\n"
SPEC = "tpu:\n  accelerator: v4-8\n  zone: us-central2-b\ncommand:\n  run: python train.py --seed {i}\n"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_AUTHOR_NAME": ALICE[0], "GIT_AUTHOR_EMAIL": ALICE[1], "GIT_COMMITTER_NAME": ALICE[0],
                "GIT_COMMITTER_EMAIL": ALICE[1], "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull})
    return env


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, env=_env(), input=input)
    if proc.returncode:
        raise SystemExit(f"git {' '.join(args)}: {proc.stderr.decode()}")
    return proc.stdout.decode()


def make_hub(root: Path, extra_files: int = 0) -> tuple[Path, Path]:
    bare, work = root / "hub.git", root / "work"
    git(root, "init", "-q", "--bare", "-b", "main", str(bare))
    git(root, "clone", "-q", str(bare), str(work))
    git(work, "checkout", "-q", "-b", "main")
    (work / ".ledger").mkdir()
    (work / ".ledger/policy.yaml").write_text(POLICY)
    (work / "CODEOWNERS").write_text(CODEOWNERS)
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "set up")
    if extra_files:
        fast_import(work, [(f"jobs/u{i % 100:03d}/big{i:05d}.yaml", SPEC.format(i=i)) for i in range(extra_files)],
                    one_commit=True)
    git(work, "push", "-q", "-u", "origin", "main")
    return bare, work


def fast_import(work: Path, files: list[tuple[str, str]], *, one_commit: bool = False) -> None:
    """Commits made by `git fast-import`: one per file, or all files in one commit."""
    parent = git(work, "rev-parse", "HEAD").strip()
    out: list[bytes] = []
    groups = [files] if one_commit else [[f] for f in files]
    for n, group in enumerate(groups):
        msg = f"add {len(group)} job(s)\n\nApproved-by: {BOB[0]} <{BOB[1]}>\n".encode()
        out += [b"commit refs/heads/main\n", f"mark :{n + 1}\n".encode(),
                f"author {ALICE[0]} <{ALICE[1]}> {1_700_000_000 + n} +0000\n".encode(),
                f"committer {ALICE[0]} <{ALICE[1]}> {1_700_000_000 + n} +0000\n".encode(),
                f"data {len(msg)}\n".encode(), msg,
                (f"from {parent}\n" if n == 0 else f"from :{n}\n").encode()]
        for path, text in group:
            data = text.encode()
            out += [f"M 100644 inline {path}\n".encode(), f"data {len(data)}\n".encode(), data, b"\n"]
    git(work, "fast-import", "--quiet", "--force", input=b"".join(out))
    git(work, "reset", "-q", "--hard", "main")


def commit_one(work: Path, i: int, prefix: str = "lat") -> str:
    path = work / f"jobs/bench/{prefix}{i:04d}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SPEC.format(i=i))
    git(work, "add", str(path.relative_to(work)))
    git(work, "commit", "-q", "-m", f"{prefix} {i}\n\nApproved-by: {BOB[0]} <{BOB[1]}>")
    return f"bench/{prefix}{i:04d}"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def bench_latency(root: Path, pushes: int, *, hook: bool) -> dict:
    bare, work = make_hub(root)
    db = root / "ledger.db"
    store = SQLiteStore(db)
    ingest(bare, store, "main")  # the set-up commit, and `ledger.spec` imported
    watcher = thread = None
    if hook:
        install_hook(bare, f"sqlite:///{db}", "main")
    else:
        watcher = Watcher(str(bare), store, "main", interval=5.0)
        thread = threading.Thread(target=watcher.run, daemon=True)
        thread.start()
        time.sleep(0.5)
    reader = SQLiteStore(db)
    from_start, from_return = [], []
    try:
        for i in range(pushes):
            job = commit_one(work, i, "hook" if hook else "lat")
            t0 = time.perf_counter()
            git(work, "push", "-q", "origin", "main")
            t1 = time.perf_counter()
            deadline = t1 + 30
            while reader.stream_version(job) == 0:
                if time.perf_counter() > deadline:
                    raise SystemExit(f"{job} never appeared")
                time.sleep(0.002)
            t2 = time.perf_counter()
            from_start.append((t2 - t0) * 1000)
            from_return.append((t2 - t1) * 1000)
    finally:
        if watcher is not None:
            watcher.stop()
            thread.join(timeout=10)
        reader.close()
        store.close()
    return {
        "pushes": pushes,
        "p50_ms": round(statistics.median(from_start), 1), "p99_ms": round(pct(from_start, 0.99), 1),
        "max_ms": round(max(from_start), 1),
        "after_push_returned_p50_ms": round(statistics.median(from_return), 1),
        "after_push_returned_p99_ms": round(pct(from_return, 0.99), 1),
        "push_itself_p50_ms": round(statistics.median([a - b for a, b in zip(from_start, from_return, strict=True)]), 1),
    }


def bench_backlog(root: Path, commits: int, runs: int) -> dict:
    bare, work = make_hub(root)
    fast_import(work, [(f"jobs/backlog/j{i:05d}.yaml", SPEC.format(i=i)) for i in range(commits)])
    git(work, "push", "-q", "origin", "main")
    times = []
    for r in range(runs):
        store = SQLiteStore(root / f"backlog{r}.db")
        report = ingest(bare, store, "main")
        assert report.counts.get("submitted") == commits, report.counts
        times.append(report.seconds)
        store.close()
    return {"commits": commits, "runs": runs, "median_s": round(statistics.median(times), 3),
            "all_s": [round(t, 3) for t in times]}


def bench_big_repo(root: Path, files: int, commits: int) -> dict:
    bare, work = make_hub(root, extra_files=files)
    store = SQLiteStore(root / "big.db")
    t0 = time.perf_counter()
    ingest(bare, store, "main")
    first = time.perf_counter() - t0
    times = []
    for i in range(commits):
        commit_one(work, i, "big")
        git(work, "push", "-q", "origin", "main")
        report = ingest(bare, store, "main")
        assert report.commits == 1 and report.counts == {"submitted": 1}, report.to_dict()
        times.append(report.seconds * 1000)
    store.close()
    return {"files": files, "commits": commits, "median_ms": round(statistics.median(times), 1),
            "p90_ms": round(pct(times, 0.9), 1), "initial_ingest_s": round(first, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pushes", type=int, default=100)
    ap.add_argument("--backlog", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--big-commits", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        parts = {}
        for name, fn in (
            ("watch_latency", lambda d: bench_latency(d, args.pushes, hook=False)),
            ("hook_latency", lambda d: bench_latency(d, args.pushes, hook=True)),
            ("backlog", lambda d: bench_backlog(d, args.backlog, args.runs)),
            ("big_repo", lambda d: bench_big_repo(d, args.files, args.big_commits)),
        ):
            d = root / name
            d.mkdir()
            parts[name] = fn(d)
    result = {
        "bench": "watch", "load": os.getloadavg()[0], **parts,
        "targets": {"push_p50_ms": 300, "push_p99_ms": 1000, "backlog_s": 10, "big_repo_one_commit_ms": 100},
    }
    if args.json:
        print(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table("figure", "measured", "target")
    w, h, b, g = parts["watch_latency"], parts["hook_latency"], parts["backlog"], parts["big_repo"]
    t.add_row(f"push -> submitted, watcher running ({w['pushes']} pushes) p50", f"{w['p50_ms']} ms", "<= 300 ms")
    t.add_row("  p99 / max", f"{w['p99_ms']} / {w['max_ms']} ms", "<= 1000 ms")
    t.add_row("  after `git push` returned, p50 / p99",
              f"{w['after_push_returned_p50_ms']} / {w['after_push_returned_p99_ms']} ms", "")
    t.add_row("  `git push` itself, p50", f"{w['push_itself_p50_ms']} ms", "")
    t.add_row("push -> submitted, post-receive hook p50 / p99", f"{h['p50_ms']} / {h['p99_ms']} ms", "")
    t.add_row(f"backlog of {b['commits']} commits (median of {b['runs']})", f"{b['median_s']} s", "<= 10 s")
    t.add_row(f"one commit in a repo of {g['files']} job files (median)", f"{g['median_ms']} ms", "<= 100 ms")
    t.add_row("  p90", f"{g['p90_ms']} ms", "")
    Console().print(t)
    print(f"load average at the end: {result['load']:.2f} (2 cores)")


if __name__ == "__main__":
    main()
