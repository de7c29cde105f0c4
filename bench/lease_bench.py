"""Store liveness figures: how fast a waiter wakes after an append, and how fast a dead
holder's lease changes hands, on SQLite and PostgreSQL.

    python bench/lease_bench.py [--rounds 10] [--ttl 1.0] [--backends sqlite postgres] [--json]

These used to be upper bounds asserted in tests (test_pg_contract, test_pg_database_rules,
test_pg_leases, test_pg_ha); on 2 shared cores they are figures, printed here. Per backend:
- wake:     one handle appends, another blocked in wait_for_append returns (ms; PostgreSQL
            sleeps on LISTEN/NOTIFY, SQLite polls);
- takeover: a process holding a lease through a LeaseKeeper is SIGKILLed; time until a second
            keeper's claim succeeds (expected: at most the ttl after its last renewal, plus
            polling). A dead reconciler's jobs change hands the same way;
- cut-off:  a keeper whose renewals fail: claim -> holds() turns False (expected ttl - margin),
            and claim -> another holder gets the lease (expected ttl: the keeper must stop first).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from ledger.errors import StoreError  # noqa: E402
from ledger.events import NewEvent, actor  # noqa: E402
from ledger.store import open_store  # noqa: E402
from ledger.store.leases import LeaseKeeper, open_leases  # noqa: E402

HOLDER = """
import sys, time
from ledger.store.leases import LeaseKeeper, open_leases
url, ttl = sys.argv[1], float(sys.argv[2])
keeper = LeaseKeeper(lambda: open_leases(url), "doomed", ttl)
print("held" if keeper.claim("job:bench/x") else "refused", flush=True)
time.sleep(3600)
"""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "p99": round(pct(values, 0.99), 1),
            "max": round(max(values), 1), "n": len(values)}


def bench_wake(url: str, rounds: int) -> dict[str, float]:
    writer, reader = open_store(url), open_store(url)
    latencies: list[float] = []
    try:
        for i in range(rounds):
            after = reader.head()
            woke: list[float] = []

            def wait(after: int = after, woke: list[float] = woke) -> None:
                reader.wait_for_append(after, timeout=30)
                woke.append(time.perf_counter())

            thread = threading.Thread(target=wait)
            thread.start()
            time.sleep(0.1)  # the waiter is asleep before the append: that is what is measured
            appended = time.perf_counter()
            writer.append(f"bench/w{i}", [NewEvent("note", {}, actor("cli", "bench"))])
            thread.join(60)
            latencies.append((woke[0] - appended) * 1000)
    finally:
        writer.close()
        reader.close()
    return summary(latencies)


def bench_takeover(url: str, rounds: int, ttl: float) -> dict[str, float]:
    open_leases(url).close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    took: list[float] = []
    for _ in range(rounds):
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(ttl)], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, text=True)
        keeper = LeaseKeeper(lambda: open_leases(url), "survivor", ttl)
        try:
            if holder.stdout.readline().strip() != "held":
                raise SystemExit("the holder process did not get the lease")
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)
            killed = time.perf_counter()
            while not keeper.claim("job:bench/x"):
                time.sleep(0.01)
            took.append((time.perf_counter() - killed) * 1000)
            keeper.release("job:bench/x")
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            keeper.close()
    return {**summary(took), "ttl_ms": ttl * 1000}


def bench_cut_off(url: str, rounds: int, ttl: float) -> dict[str, float]:
    stopped, freed = [], []
    for i in range(rounds):
        calls: list[int] = []

        def factory(calls: list[int] = calls):
            calls.append(1)
            if len(calls) > 1:  # the renewing thread's handle: the database is gone
                raise StoreError("cannot connect (simulated)")
            return open_leases(url)

        keeper = LeaseKeeper(factory, "cut-off", ttl=ttl, margin=ttl / 5)
        other = open_leases(url)
        name = f"job:bench/cut{i}"
        try:
            claimed = time.perf_counter()
            keeper.claim(name)
            while keeper.holds(name):
                time.sleep(0.005)
            stopped.append((time.perf_counter() - claimed) * 1000)
            while not other.acquire(name, "next", ttl=5):
                time.sleep(0.005)
            freed.append((time.perf_counter() - claimed) * 1000)
        finally:
            other.close()
            keeper.close()
    return {"stops_holding": summary(stopped), "lease_freed": summary(freed),
            "expected_stop_ms": ttl * 0.8 * 1000, "ttl_ms": ttl * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--ttl", type=float, default=1.0)
    ap.add_argument("--backends", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    ap.add_argument("--pg-url", default=None, help="a PostgreSQL database to use (default: a scratch one on 127.0.0.1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="lease-bench-") as tmp:
        for backend in args.backends:
            scratch = None
            if backend == "sqlite":
                url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
            else:
                from pg_bench import Scratch  # psycopg and a server only when asked for

                scratch = Scratch(args.pg_url)
                url = scratch.store_url(scratch.schema("lease_bench"))
            try:
                results[backend] = {"wake_ms": bench_wake(url, args.rounds * 3),
                                    "takeover_ms": bench_takeover(url, args.rounds, args.ttl),
                                    "cut_off_ms": bench_cut_off(url, args.rounds, args.ttl)}
            finally:
                if scratch is not None:
                    scratch.drop()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'backend':<9}{'measure':<44}{'median ms':>10}{'p99 ms':>9}{'max ms':>9}")
    for backend, r in results.items():
        rows = [("append -> wait_for_append wakes", r["wake_ms"]),
                (f"holder killed -> lease taken (ttl {args.ttl:g} s)", r["takeover_ms"]),
                (f"cut off: claim -> stops holding (exp. {r['cut_off_ms']['expected_stop_ms']:.0f})",
                 r["cut_off_ms"]["stops_holding"]),
                ("cut off: claim -> another holder gets it", r["cut_off_ms"]["lease_freed"])]
        for label, s in rows:
            print(f"{backend:<9}{label:<44}{s['median']:>10}{s['p99']:>9}{s['max']:>9}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (2 cores)")


if __name__ == "__main__":
    main()
