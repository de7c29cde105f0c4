"""Backup and restore of a 1M-event SQLite ledger while a reconciler-like writer appends.

What is measured (medians of --runs):
- `ledger backup`: wall time, the copy's size, and what the writer managed meanwhile
  (appends per second and p99 append latency, during the backup against before it: the
  online backup must not stall the services);
- `ledger restore`: wall time (copy, full verify, signed checkpoint), and the full verify
  of the restored ledger alone.

The writer appends one durable event at a time (synchronous=FULL), as the reconciler records
intents and outcomes, only faster: it is the harder case for a copy taken under it.

    .venv/bin/python bench/backup_bench.py                 # 1M events, 3 runs
    .venv/bin/python bench/backup_bench.py --events 100000 --runs 1
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from usage_bench import build, ledger_arguments  # noqa: E402

from ledger.backup import backup, restore  # noqa: E402
from ledger.checkpoints import NAMESPACE, AllowedSigners, SigningKey  # noqa: E402
from ledger.checkpoints.signers import parse  # noqa: E402
from ledger.events import NewEvent, actor  # noqa: E402
from ledger.store import open_store  # noqa: E402
from ledger.verify import verify_store  # noqa: E402
from reconciler.keys import ensure_key  # noqa: E402

RECONCILER = actor("reconciler", "bench")


def writer(url: str, phase, out) -> None:
    """Append one event at a time; report (phase, latency) pairs until phase is 'stop'."""
    samples: dict[str, list[float]] = {}
    with contextlib.closing(open_store(url)) as store:
        i = 0
        while (name := phase.value.decode()) != "stop":
            t = time.perf_counter()
            store.append("_bench", [NewEvent("note", {"text": f"outcome {i}"}, RECONCILER)])
            samples.setdefault(name, []).append(time.perf_counter() - t)
            i += 1
    out.put(samples)


def p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99)] if values else 0.0


def run(path: Path, work: Path, runs: int, progress) -> dict:
    url = f"sqlite:///{path}"
    key_path = work / "ssh" / "id_ecdsa"
    ensure_key(key_path)
    key = SigningKey.load(key_path)
    allowed = parse(AllowedSigners(()).line_for("bench", key.public_key, NAMESPACE))
    m: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        m.setdefault(name, []).append(value)

    ctx = multiprocessing.get_context("spawn")
    for r in range(runs):
        progress(f"run {r + 1}/{runs}")
        phase, out = ctx.Array("c", 16), ctx.Queue()
        phase.value = b"before"
        proc = ctx.Process(target=writer, args=(url, phase, out))
        proc.start()
        time.sleep(3.0)
        phase.value = b"during"
        dest = work / f"backup-{r}"
        started = time.perf_counter()
        taken = backup(url, dest, key, "bench")
        add("backup_s", time.perf_counter() - started)
        phase.value = b"after"
        time.sleep(0.5)
        phase.value = b"stop"
        samples = out.get(timeout=60)
        proc.join(60)
        before, during = samples.get("before", []), samples.get("during", [])
        add("backup_mb", taken.manifest.bytes / 1e6)
        add("backup_head", taken.manifest.head)
        add("writer_before_per_s", len(before) / 3.0)
        add("writer_during_per_s", len(during) / m["backup_s"][-1])
        add("writer_before_p99_ms", p99(before) * 1000)
        add("writer_during_p99_ms", p99(during) * 1000)
        target = work / f"restored-{r}.db"
        started = time.perf_counter()
        done = restore(dest, f"sqlite:///{target}", allowed)
        add("restore_s", time.perf_counter() - started)
        assert done.report.head == taken.manifest.head
        with contextlib.closing(open_store(f"sqlite:///{target}", create=False)) as restored:
            started = time.perf_counter()
            assert verify_store(restored).ok
            add("verify_s", time.perf_counter() - started)
        for p in (target, *dest.iterdir()):
            p.unlink()
        dest.rmdir()
    return {"events": int(statistics.median(m["backup_head"])), "ledger_mb": path.stat().st_size / 1e6, "runs": runs,
            "load": os.getloadavg(), "medians": {k: statistics.median(v) for k, v in m.items()}, "all": m}


def main() -> None:
    args = ledger_arguments(__doc__.split("\n\n")[0]).parse_args()

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "ledger.db"
        build(path, args.events, args.jobs, progress).close()
        result = run(path, Path(tmp), args.runs, progress)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    med = result["medians"]
    print(f"SQLite ledger of {result['events']:,} events ({result['ledger_mb']:,.0f} MB file), median of "
          f"{result['runs']} run(s), load {' '.join(f'{x:.1f}' for x in result['load'])}")
    print(f"  ledger backup (online backup API, one snapshot)   {med['backup_s']:6.2f} s   {med['backup_mb']:,.0f} MB")
    print(f"  writer meanwhile: appends/s before -> during       {med['writer_before_per_s']:6.0f} -> "
          f"{med['writer_during_per_s']:.0f}   p99 {med['writer_before_p99_ms']:.1f} -> {med['writer_during_p99_ms']:.1f} ms")
    print(f"  ledger restore (copy, verify, signed checkpoint)  {med['restore_s']:6.2f} s")
    print(f"  of which: verify of the restored ledger alone     {med['verify_s']:6.2f} s")


if __name__ == "__main__":
    main()
