"""Dashboard benchmark: `ledger dashboard` over a 10,000-job SQLite ledger, one job of 1,000 events.

    python bench/dashboard_bench.py                    # 10,000 jobs x 20 events + one 1,000-event job
    python bench/dashboard_bench.py --db /tmp/dash-10k.db --requests 50 --json

The ledger is bench/workload.py's (jobs provisioned, preempted and recovered over and over,
with reconciler intents and outcomes), in a real SQLite file (built once; `--db` keeps it).
The dashboard runs as users run it, `ledger dashboard` in its own process; this script is
its HTTP client on loopback (one keep-alive connection, requests one after another).
Printed: medians (and p90) of the wall time of whole responses, as the client sees them:

- the jobs page (the first 100 of 10,000 jobs, sorted by id; and sorted by last change),
  target <= 200 ms (issue 17);
- the job page of the 1,000-event job (timeline picture, 200 events of the list with their
  chain status, log tail), target <= 100 ms;
- /api/jobs and the 1,000 events as JSON;
- the queue page and /api/queue under a recorded sharing policy (quotas, fair share): the
  first request folds the ledger once for the fair-share meter, the next ones do not;
- live: an event appended -> its Server-Sent Event at the client (the same tail the pages use),
  target: a new event on the page within 1 s.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from workload import job_events, workload  # noqa: E402

from ledger.app.queueview import record_policy  # noqa: E402
from ledger.events import NewEvent, actor  # noqa: E402
from ledger.spec.policy import parse_policy  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402

JOBS = 10_000
PER_JOB = 20
BIG_JOB = "zoe/long-run"
BIG_EVENTS = 1_000
JOBS_PER_TX = 200
TARGETS_MS = {"jobs_page": 200.0, "job_page": 100.0, "append_to_sse": 1000.0}


def build(path: Path, progress) -> None:
    if path.exists():
        store = SQLiteStore(path)
        try:
            if store.stream_version(BIG_JOB) >= BIG_EVENTS:
                progress(f"reusing {path} ({store.head():,} events)")
                return
        finally:
            store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    progress(f"building {path}: {JOBS:,} jobs x {PER_JOB} events + one job of {BIG_EVENTS:,}")
    data = list(workload(JOBS * PER_JOB, JOBS))
    store = SQLiteStore(path)
    try:
        for i in range(0, len(data), JOBS_PER_TX):
            store.append_many([(job, evs, 0) for job, evs in data[i:i + JOBS_PER_TX]])
        store.append(BIG_JOB, job_events(BIG_JOB, BIG_EVENTS, JOBS))
    finally:
        store.close()


# Quotas make admission active (and the queue page fold usage); fair share decays it.
SHARING = "quotas:\n  default_user: {chips: {v4: 256}}\nfair_share: {half_life_hours: 168}\n"


def record_sharing(path: Path) -> None:
    """The rules a reconciler records from its --policy file (once: the same rules again are not)."""
    policy, errors = parse_policy(SHARING)
    assert not errors, errors
    store = SQLiteStore(path)
    try:
        record_policy(store, policy, source="bench", holder="bench")
    finally:
        store.close()


def start(url: str) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "--store", url, "dashboard", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE.parent)
    line = proc.stdout.readline()
    if not line.startswith("dashboard of"):
        proc.kill()
        raise SystemExit(f"the dashboard did not start: {line}{proc.stderr.read()}")
    address = line.split(": ", 1)[1].split()[0].removeprefix("http://").rstrip("/")
    return proc, address, line.strip()


def timed_get(conn: http.client.HTTPConnection, path: str) -> tuple[float, int, int]:
    t = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    return time.perf_counter() - t, response.status, len(body)


def measure(address: str, path: str, requests: int) -> dict:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        first, status, size = timed_get(conn, path)
        assert status == 200, (path, status)
        times = [timed_get(conn, path)[0] for _ in range(requests)]
    finally:
        conn.close()
    times.sort()
    return {"first_ms": first * 1000, "p50_ms": statistics.median(times) * 1000,
            "p90_ms": times[int(len(times) * 0.9) - 1] * 1000, "bytes": size}


def sse_latency(address: str, db: Path, samples: int) -> dict:
    """Append one event at a time; the time until the stream announces it."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/api/stream")
    response = conn.getresponse()
    store = SQLiteStore(db)
    times = []
    try:
        for i in range(samples):
            t = time.perf_counter()
            seq = store.append(BIG_JOB, [NewEvent("note", {"text": f"bench {i}"}, actor("cli", "bench"))]).positions[0]
            while True:
                message = b"".join(iter(response.readline, b"\n")).decode()
                if f"id: {seq}\n" in message and "event: ledger" in message:
                    break
            times.append(time.perf_counter() - t)
            time.sleep(0.05)
    finally:
        store.close()
        conn.close()
    return {"p50_ms": statistics.median(times) * 1000, "max_ms": max(times) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=None, help="SQLite file to build or reuse")
    parser.add_argument("--requests", type=int, default=30, help="requests per page (after a first one)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    say = (lambda _: None) if args.json else (lambda m: print(m, file=sys.stderr))
    db = args.db or Path(tempfile.mkdtemp(prefix="dashboard-bench-")) / "ledger.db"
    build(db, say)
    record_sharing(db)
    proc, address, banner = start(f"sqlite:///{db}")
    say(banner)
    owner, name = BIG_JOB.split("/")
    try:
        pages = {
            "jobs_page": "/jobs",
            "jobs_page_by_change": "/jobs?sort=changed&order=desc",
            "jobs_page_search": "/jobs?q=job-0099",
            "api_jobs": "/api/jobs",
            "job_page": f"/jobs/{owner}/{name}",
            "api_events": f"/api/jobs/{owner}/{name}/events",
            "tpus_page": "/tpus",
            "usage_page": "/usage",
            "queue_page": "/queue",
            "api_queue": "/api/queue",
        }
        figures = {key: measure(address, path, args.requests) for key, path in pages.items()}
        figures["append_to_sse"] = sse_latency(address, db, 20)
    finally:
        proc.terminate()
        proc.wait(30)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, load {os.getloadavg()[0]:.1f}",
        "ledger": banner, "figures": figures,
        "targets_ms": TARGETS_MS,
        "met": {k: figures[k]["p50_ms"] <= v for k, v in TARGETS_MS.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['ledger']}\n{result['machine']}, {args.requests} requests per page after a first one")
    for key, f in figures.items():
        extra = f"first {f['first_ms']:7.1f} ms, {f['bytes'] / 1024:6.0f} KiB" if "first_ms" in f else f"max {f['max_ms']:.1f} ms"
        target = f"   target <= {TARGETS_MS[key]:.0f} ms: {'met' if result['met'][key] else 'MISSED'}" if key in TARGETS_MS else ""
        p90 = f", p90 {f['p90_ms']:7.1f}" if "p90_ms" in f else ""
        print(f"  {key:<22} p50 {f['p50_ms']:7.1f} ms{p90}   ({extra}){target}")


if __name__ == "__main__":
    main()
