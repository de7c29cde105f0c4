"""Fan-out figures through the official Pub/Sub emulator.

- publish throughput: a backlog of N events over J jobs drained by the outbox publisher
  (store read + encode + Publish RPC + cursor), events/s, median of R runs after a
  5,000-event warm-up run;
- append -> receipt latency: events appended one at a time while a publisher thread runs,
  received by a Pub/Sub subscriber (StreamingPull), and by a store-tailing subscriber.

Usage: python bench/fanout_bench.py [--events 50000] [--jobs 1000] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EMULATOR = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"


@contextlib.contextmanager
def emulator(workdir: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(workdir / "emulator.log", "wb") as log:
        proc = subprocess.Popen([EMULATOR, "--host=127.0.0.1", f"--port={port}"], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/projects/x/topics", timeout=1)
                break
            except OSError as exc:
                if hasattr(exc, "code"):
                    break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the Pub/Sub emulator did not start") from exc
                time.sleep(0.1)
        os.environ["PUBSUB_EMULATOR_HOST"] = f"127.0.0.1:{port}"
        yield
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def throughput(workdir: Path, events: int, jobs: int, run: int) -> float:
    from ledger.events import NewEvent
    from ledger.fanout.publisher import drain
    from ledger.store import open_store

    url = f"sqlite:///{workdir / f'throughput-{run}.db'}"
    store = open_store(url)
    batches = [(f"user{i % jobs}/job{i % jobs}", [NewEvent("note", {"text": f"{i} " + "x" * 40})], None)
               for i in range(events)]
    for k in range(0, events, 5000):
        store.append_many(batches[k : k + 5000])
    started = time.perf_counter()
    stats = drain(store, topic=f"bench-throughput-{run + 1}", timeout=600)
    elapsed = time.perf_counter() - started
    assert stats.position == events, stats
    store.close()
    return events / elapsed


def latency(workdir: Path, count: int, via_pubsub: bool) -> list[float]:
    from ledger.events import NewEvent, parse_time
    from ledger.fanout.publisher import start_publisher_thread
    from ledger.fanout.subscriber import PubSubSubscriber, StoreSubscriber
    from ledger.store import open_store

    kind = "pubsub" if via_pubsub else "store"
    url = f"sqlite:///{workdir / f'latency-{kind}.db'}"
    store = open_store(url)
    topic, sub_name = f"bench-latency-{kind}", f"bench-latency-{kind}-sub"
    thread = stop = None
    if via_pubsub:
        sub = PubSubSubscriber(sub_name, topic=topic)
        thread, stop = start_publisher_thread(url, None, topic, subscriptions=(sub_name,))
    else:
        sub = StoreSubscriber(url)
    samples: list[float] = []
    try:
        # warm-up: connections, JIT of the emulator
        for i in range(20):
            store.append(f"warm/j{i % 3}", [NewEvent("note")])
        warm_deadline = time.monotonic() + 60
        got = 0
        while got < 20 and time.monotonic() < warm_deadline:
            got += len(sub.receive(1.0))
        for i in range(count):
            store.append(f"user{i % 10}/job", [NewEvent("note", {"text": str(i)})])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                received = sub.receive(1.0)
                now = datetime.now(UTC)
                samples += [(now - parse_time(e.time)).total_seconds() * 1000 for e in received]
                if received:
                    break
            time.sleep(0.02)  # appends spaced like a busy ledger, not a tight loop
    finally:
        if stop is not None:
            stop.set()
            thread.join(timeout=30)
        sub.close()
        store.close()
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, emulator(Path(tmp)):
        throughput(Path(tmp), 5000, args.jobs, -1)  # warm-up: the emulator's JIT, connections
        rates = [throughput(Path(tmp), args.events, args.jobs, run) for run in range(args.runs)]
        pubsub_ms = latency(Path(tmp), args.latency_samples, via_pubsub=True)
        store_ms = latency(Path(tmp), args.latency_samples, via_pubsub=False)
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "events": args.events,
        "jobs": args.jobs,
        "publish_events_per_s_median": round(statistics.median(rates)),
        "publish_events_per_s_runs": [round(r) for r in rates],
        "pubsub_latency_ms_p50": round(statistics.median(pubsub_ms), 1),
        "pubsub_latency_ms_p95": round(percentile(pubsub_ms, 0.95), 1),
        "store_tail_latency_ms_p50": round(statistics.median(store_ms), 1),
        "store_tail_latency_ms_p95": round(percentile(store_ms, 0.95), 1),
        "latency_samples": len(pubsub_ms),
    }
    if args.json:
        print(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"fan-out ({args.events} events, {args.jobs} jobs, {os.cpu_count()} cpus)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row("publish throughput, median (events/s)", str(result["publish_events_per_s_median"]), ">= 5000")
    table.add_row("append -> Pub/Sub receipt p50 (ms)", str(result["pubsub_latency_ms_p50"]), "<= 200")
    table.add_row("append -> Pub/Sub receipt p95 (ms)", str(result["pubsub_latency_ms_p95"]), "")
    table.add_row("append -> store-tail receipt p50 (ms)", str(result["store_tail_latency_ms_p50"]), "")
    table.add_row("append -> store-tail receipt p95 (ms)", str(result["store_tail_latency_ms_p95"]), "")
    Console().print(table)


if __name__ == "__main__":
    main()
