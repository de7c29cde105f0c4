"""Metrics figures (issue 30): what /metrics costs a reconciler.

- scrape: one GET /metrics of a reconciler holding 10,000 jobs (100 running on v4-32, 1,000
  waiting, the rest finished), over HTTP on loopback, median of runs; the registry is the
  one `ledger reconcile --metrics-address` serves (jobs by state, chips held, the queue
  summary, the tail of the ledger, readiness checks).
- overhead: the median reconcile pass over those jobs without metrics, and with them (the
  hooks installed and a scrape every second in another thread, 15x Prometheus's default
  rate), in alternating blocks of the same run; the ratio is the overhead.

The reconciler is the real one (`ledger.app.wiring.build`) on a real SQLite ledger, with
its TPU API endpoint on a port nobody serves: after the first pass its zones back off, so
a pass is the fold, the plan over 10,000 jobs and the admission of the waiting ones.

    flock /tmp/tpu-ledger-heavy.lock .venv/bin/python bench/metrics_bench.py [--jobs 10000] [--runs 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.reconcile_bench import synthetic_jobs  # noqa: E402
from ledger.app.observability.reconciler import observe_reconciler  # noqa: E402
from ledger.app.observability.service import Service  # noqa: E402
from ledger.app.wiring import Settings, build  # noqa: E402
from ledger.events import NewEvent  # noqa: E402
from ledger.fold import evolve, initial  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402

WAITING = 1_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reconciler(tmp: Path, jobs: int):
    url = f"sqlite:///{tmp / 'ledger.db'}"
    store = SQLiteStore(tmp / "ledger.db")
    store.append("_system", [NewEvent("note", {"text": "metrics bench"})])
    store.close()
    settings = Settings(store_url=url, tpu_endpoint=f"127.0.0.1:{free_port()}", ssh_key=tmp / "key", log_dir=tmp / "logs",
                        lease_ttl_s=0, interval=1.0, host_checks=False)
    rec = build(settings)
    held, _ = synthetic_jobs(jobs - WAITING, 100)
    for i in range(WAITING):  # submitted, waiting for their first TPU
        spec = {"job": {"name": f"w{i}"}, "tpu": {"accelerator": "v4-8", "zone": "us-central2-b", "pricing": "spot"},
                "command": {"cmd": "python train.py", "workers": "all"}}
        j = evolve(initial(f"waiter{i % 31}/w{i}"), "submitted", {"spec": spec, "spec_hash": "h", "commit": f"w{i}"},
                   seq=jobs + i, time="2026-11-25T00:00:00.000000Z")
        held[j.id] = j
    rec.step()  # loads the (tiny) ledger: then the jobs are swapped in, as if folded
    rec.state.jobs.clear()
    rec.state.jobs.update(held)
    for _ in range(3):  # the zones fail and back off; the waiting jobs' first creates fail too
        rec.step()
        rec.drain(30)
    return url, rec


def median_pass(rec, passes: int) -> float:
    times = []
    for _ in range(passes):
        t = time.perf_counter()
        rec.step()
        times.append(time.perf_counter() - t)
        rec.drain(30)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=15, help="scrapes, and passes per block")
    ap.add_argument("--blocks", type=int, default=4, help="alternating blocks without / with metrics")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        url, rec = reconciler(Path(d), args.jobs)
        port = free_port()
        service = Service("reconcile", url, f"127.0.0.1:{port}", heartbeat=False)
        observers = (list(rec.pass_observers), list(rec.tpu.observers))
        observe_reconciler(service, rec, 1.0)
        with_hooks = (list(rec.pass_observers), list(rec.tpu.observers))
        service.start()
        target = f"http://127.0.0.1:{port}/metrics"
        scrapes, size = [], 0
        for _ in range(args.runs + 1):
            t = time.perf_counter()
            with urllib.request.urlopen(target, timeout=30) as resp:
                size = len(resp.read())
            scrapes.append(time.perf_counter() - t)
        scrapes = scrapes[1:]  # the first one reads the ledger's tail from the start

        stop = threading.Event()

        def scraper() -> None:
            while not stop.wait(1.0):
                with urllib.request.urlopen(target, timeout=30) as resp:
                    resp.read()

        without, with_ = [], []
        for _ in range(args.blocks):
            rec.pass_observers[:], rec.tpu.observers[:] = observers[0], observers[1]
            without.append(median_pass(rec, args.runs))
            rec.pass_observers[:], rec.tpu.observers[:] = with_hooks[0], with_hooks[1]
            stop.clear()
            thread = threading.Thread(target=scraper, daemon=True)
            thread.start()
            with_.append(median_pass(rec, args.runs))
            stop.set()
            thread.join(30)
        service.close()
        rec.close()
    base, metered = statistics.median(without), statistics.median(with_)
    result = {
        "jobs": args.jobs, "waiting": WAITING, "running": 100,
        "scrape_ms_median": round(statistics.median(scrapes) * 1000, 2), "scrape_ms_max": round(max(scrapes) * 1000, 2),
        "scrape_bytes": size,
        "pass_ms_without_metrics": round(base * 1000, 2), "pass_ms_with_metrics": round(metered * 1000, 2),
        "overhead_ratio": round(metered / base, 4),
        "blocks_ms": {"without": [round(x * 1000, 2) for x in without], "with": [round(x * 1000, 2) for x in with_]},
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"/metrics with {args.jobs:,} jobs: median {result['scrape_ms_median']} ms "
              f"(max {result['scrape_ms_max']} ms, {size:,} bytes), target <= 50 ms")
        print(f"reconcile pass: {result['pass_ms_without_metrics']} ms without metrics, {result['pass_ms_with_metrics']} ms "
              f"with (hooks + a scrape every second): x{result['overhead_ratio']}, target <= x1.05")
        print(f"blocks (ms): without {result['blocks_ms']['without']}, with {result['blocks_ms']['with']}")
        print(f"load average: {' '.join(result['loadavg'])}")


if __name__ == "__main__":
    main()
