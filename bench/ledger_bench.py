"""Ledger benchmark: tpu-ledger's SQLite store against the `eventsourcing` library (9.x,
SQLite) on the same data, in the same run.

    python bench/ledger_bench.py                         # 200k events, 2k jobs, 3 runs
    python bench/ledger_bench.py --events 1000000 --jobs 10000 --runs 3 --json

Measured (medians over --runs; wall time, with CPU time beside it since the machine may be
shared): durable single-event append (synchronous=FULL, and NORMAL for comparison), batched
append, full replay without snapshot, snapshot + 1,000-event tail, inspect of one job,
verify, and peak RSS of a full replay (in a child process). Durable single and batched
appends of both libraries take turns (blocks of BLOCK appends, transaction by transaction),
so a ratio compares them under the same disk and the same neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from workload import workload  # noqa: E402

from ledger import fold  # noqa: E402
from ledger.events import NewEvent, actor, dumps  # noqa: E402
from ledger.replay import load_state, save_snapshot  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402
from ledger.verify import verify_store  # noqa: E402

TARGETS = {  # issues 2 and 19 (the replay and verify bounds are for 1M events / 10k jobs)
    "single_append_full_per_s": (">=", 5000), "batched_append_per_s": (">=", 100_000),
    "replay_full_s": ("<=", 3.0), "replay_snapshot_tail_s": ("<=", 0.1),
    "inspect_s": ("<=", 0.010), "verify_s": ("<=", 5.0),
}
# How many times eventsourcing's figure in the same run ours must reach (issue 19).
RATIO_TARGETS = {"batched_append_per_s": 1.5, "single_append_full_per_s": 1.7,
                 "single_append_full_2w_per_s": 1.7, "single_append_full_8w_per_s": 1.7}
WRITERS = (2, 8)  # concurrent durable appenders (threads), besides the single writer
SINGLE = 2000  # single-event appends per run
BLOCK = 100  # single appends: ours and theirs take turns in blocks of this many
JOBS_PER_TX = 100  # batched append: this many jobs' events per transaction


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - w, time.process_time() - c, result


def fresh(path: Path) -> Path:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


# -- tpu-ledger --------------------------------------------------------------------------
def batched_pair(ours_path: Path, es_path: Path, data) -> tuple[float, float, float, float]:
    """Batched appends (JOBS_PER_TX jobs' events a transaction) into fresh ledgers, ours and
    eventsourcing's taking turns transaction by transaction, for the reason single_pair
    gives. (our wall, our CPU, their wall, their CPU)."""
    store = SQLiteStore(fresh(ours_path))
    recorder = es_recorder(str(fresh(es_path)))
    totals = [0.0, 0.0, 0.0, 0.0]
    for i in range(0, len(data), JOBS_PER_TX):
        chunk = data[i:i + JOBS_PER_TX]

        def ours(chunk=chunk):
            store.append_many([(job, events, 0) for job, events in chunk])

        def theirs(chunk=chunk):
            recorder.insert_events([es_stored(job, v, e) for job, events in chunk for v, e in enumerate(events, 1)])

        for fn in ((ours, theirs) if i // JOBS_PER_TX % 2 == 0 else (theirs, ours)):
            wall, cpu, _ = timed(fn)
            at = 0 if fn is ours else 2
            totals[at] += wall
            totals[at + 1] += cpu
    store.close()
    recorder.datastore.close()
    return totals[0], totals[1], totals[2], totals[3]


def ours_single(path: Path, synchronous: str, run: int) -> tuple[float, float]:
    store = SQLiteStore(path, synchronous=synchronous)
    who = actor("reconciler", "bench")
    stream = f"bench/single-{synchronous}-{run}"

    def go():
        for n in range(SINGLE):
            store.append(stream, [NewEvent("note", {"text": f"tick {n}"}, who, key=str(n))], expected_version=n)

    wall, cpu, _ = timed(go)
    store.close()
    return wall, cpu


def single_pair(ours_path: Path, es_path: Path, run: int) -> tuple[float, float, float, float]:
    """Durable single appends, ours and eventsourcing's taking turns in blocks of BLOCK: both
    meet the same disk and the same neighbours (on a shared machine the fsync time drifts by
    2x within a minute, which back-to-back runs of SINGLE appends each turned into ratios
    from 0.5x to 1.5x). (our wall, our CPU, their wall, their CPU)."""
    store = SQLiteStore(ours_path)
    recorder = es_recorder(str(es_path))
    who = actor("reconciler", "bench")
    ours_stream, es_stream = f"bench/single-FULL-{run}", f"bench/single-{run}"
    totals = [0.0, 0.0, 0.0, 0.0]
    for start in range(0, SINGLE, BLOCK):
        block = range(start, min(start + BLOCK, SINGLE))

        def ours(block=block):
            for n in block:
                store.append(ours_stream, [NewEvent("note", {"text": f"tick {n}"}, who, key=str(n))], expected_version=n)

        def theirs(block=block):
            for n in block:
                recorder.insert_events([es_stored(es_stream, n + 1, NewEvent("note", {"text": f"tick {n}"}, who, time="t"))])

        first, second = (ours, theirs) if start // BLOCK % 2 == 0 else (theirs, ours)
        for fn in (first, second):
            wall, cpu, _ = timed(fn)
            at = 0 if fn is ours else 2
            totals[at] += wall
            totals[at + 1] += cpu
    store.close()
    recorder.datastore.close()
    return totals[0], totals[1], totals[2], totals[3]


def ours_writers(path: Path, writers: int, run: int) -> tuple[float, float]:
    """`writers` threads appending single events through one store at once (each its own
    stream, expected version checked): the group commit shares fsyncs between them."""
    store = SQLiteStore(path)
    who = actor("reconciler", "bench")

    def writer(w: int) -> None:
        stream = f"bench/w{writers}-{run}-{w}"
        for n in range(SINGLE // writers):
            store.append(stream, [NewEvent("note", {"text": f"tick {n}"}, who, key=str(n))], expected_version=n)

    wall, cpu, _ = timed(lambda: threaded(writer, writers))
    store.close()
    return wall, cpu


def threaded(fn, count: int) -> None:
    threads = [threading.Thread(target=fn, args=(w,)) for w in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def ours_grouped(path: Path, run: int, per_commit: int = 10) -> tuple[float, float]:
    """Durable (FULL) appends of `per_commit` events per transaction: what a reconciler
    decision or a watcher poll writes; one fsync carries them all."""
    store = SQLiteStore(path)
    who = actor("reconciler", "bench")
    stream = f"bench/grouped-{run}"
    commits = SINGLE // per_commit

    def go():
        for n in range(commits):
            store.append(stream, [NewEvent("note", {"text": f"tick {n}.{k}"}, who, key=f"{n}.{k}") for k in range(per_commit)],
                         expected_version=n * per_commit)

    wall, cpu, _ = timed(go)
    store.close()
    return wall, cpu


def replay_child(path: str, engine: str) -> None:
    """Run in a child: one full replay, then print its time and the process's peak RSS."""
    base = peak_rss_mb()
    if engine == "ours":
        store = SQLiteStore(path)
        wall, cpu, state = timed(lambda: load_state(store, use_snapshot=False))
    else:
        recorder = es_recorder(path)
        wall, cpu, state = timed(lambda: es_replay(recorder))
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": len(state.jobs),
                      "peak_rss_mb": peak_rss_mb(), "base_rss_mb": base}))


def peak_rss_mb() -> float:
    """This process's peak RSS. Not ru_maxrss: Linux carries it across exec from the parent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def in_child(path: Path, engine: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--replay-child", str(path), engine],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


# -- eventsourcing, same data ------------------------------------------------------------
def es_recorder(path: str):
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    datastore = SQLiteDatastore(str(path), originator_id_type="text")
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    return recorder


def es_stored(job: str, version: int, event: NewEvent):
    from eventsourcing.persistence import StoredEvent

    state = dumps({"time": event.time, "actor": event.actor, "data": event.data}).encode()
    return StoredEvent(originator_id=job, originator_version=version, topic=event.type, state=state)


def es_fill_recorder(recorder, data) -> tuple[float, float]:
    """Batched inserts into any eventsourcing recorder (SQLite here, PostgreSQL in pg_bench)."""

    def go():
        for i in range(0, len(data), JOBS_PER_TX):
            recorder.insert_events([es_stored(job, v, e) for job, events in data[i:i + JOBS_PER_TX]
                                    for v, e in enumerate(events, 1)])

    wall, cpu, _ = timed(go)
    recorder.datastore.close()
    return wall, cpu


def es_writers(path: Path, writers: int, run: int) -> tuple[float, float]:
    """eventsourcing with `writers` threads inserting single events through one recorder."""
    recorder = es_recorder(str(path))
    who = actor("reconciler", "bench")

    def writer(w: int) -> None:
        stream = f"bench/w{writers}-{run}-{w}"
        for n in range(SINGLE // writers):
            recorder.insert_events([es_stored(stream, n + 1, NewEvent("note", {"text": f"tick {n}"}, who, time="t"))])

    wall, cpu, _ = timed(lambda: threaded(writer, writers))
    recorder.datastore.close()
    return wall, cpu


def es_replay(recorder) -> fold.LedgerState:
    state = fold.LedgerState()
    loads = json.loads
    start = 1
    while True:
        page = recorder.select_notifications(start, 10_000)
        if not page:
            return state
        for n in page:
            body = loads(n.state)
            fold.apply(state, n.originator_id, n.topic, body["data"], time=body["time"], seq=n.id,
                       version=n.originator_version)
        start = page[-1].id + 1


# -- the run -----------------------------------------------------------------------------
def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(events: int, jobs: int, runs: int, workdir: Path, progress) -> dict:
    data = list(workload(events, jobs))
    total = sum(len(e) for _, e in data)
    ours_db, es_db = workdir / "ours.db", workdir / "es.db"
    m: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        m.setdefault(name, []).append(value)

    for r in range(runs):
        progress(f"run {r + 1}/{runs}: batched append")
        wall, cpu, es_wall, es_cpu = batched_pair(ours_db, es_db, data)
        add("batched_append_per_s", total / wall)
        add("batched_append_cpu_per_s", total / cpu)
        add("es_batched_append_per_s", total / es_wall)
        add("es_batched_append_cpu_per_s", total / es_cpu)

        progress(f"run {r + 1}/{runs}: single appends")
        wall, cpu, es_wall, es_cpu = single_pair(ours_db, es_db, r)
        add("single_append_full_per_s", SINGLE / wall)
        add("single_append_cpu_us", cpu / SINGLE * 1e6)
        add("es_single_append_per_s", SINGLE / es_wall)
        add("es_single_append_cpu_us", es_cpu / SINGLE * 1e6)
        wall, cpu = ours_single(ours_db, "NORMAL", r)
        add("single_append_normal_per_s", SINGLE / wall)
        for writers in WRITERS:
            wall, _ = ours_writers(ours_db, writers, r)
            add(f"single_append_full_{writers}w_per_s", SINGLE // writers * writers / wall)
            wall, _ = es_writers(es_db, writers, r)
            add(f"es_single_append_{writers}w_per_s", SINGLE // writers * writers / wall)
        wall, _ = ours_grouped(ours_db, r)
        add("grouped_append_full_per_s", SINGLE // 10 * 10 / wall)

        progress(f"run {r + 1}/{runs}: replay")
        store = SQLiteStore(ours_db)
        child = in_child(ours_db, "ours")
        add("replay_full_s", child["wall"])
        add("replay_full_cpu_s", child["cpu"])
        add("replay_peak_rss_mb", child["peak_rss_mb"])
        add("replay_base_rss_mb", child["base_rss_mb"])
        es_child = in_child(es_db, "es")
        add("es_replay_full_s", es_child["wall"])
        add("es_replay_full_cpu_s", es_child["cpu"])
        add("es_replay_peak_rss_mb", es_child["peak_rss_mb"])

        head = store.head()
        save_snapshot(store, load_state(store, until=head - 1000, use_snapshot=False))
        wall, cpu, state = timed(lambda store=store: load_state(store))
        assert state.position == head
        add("replay_snapshot_tail_s", wall)
        add("replay_snapshot_tail_cpu_s", cpu)

        job = data[len(data) // 2][0]

        def inspect(store=store, job=job):
            from ledger.describe import summarize

            return [(e.time, e.type, e.actor, summarize(e.type, e.data)) for e in store.read_stream(job)]

        add("inspect_s", median([timed(inspect)[0] for _ in range(20)]))
        recorder = es_recorder(str(es_db))
        add("es_inspect_s", median([timed(lambda recorder=recorder, job=job: recorder.select_events(job))[0] for _ in range(20)]))
        recorder.datastore.close()

        progress(f"run {r + 1}/{runs}: verify")
        wall, cpu, report = timed(lambda store=store: verify_store(store))
        assert report.ok, report.problem
        add("verify_s", wall)
        add("verify_cpu_s", cpu)
        store.close()

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {sys.platform}, Python {sys.version.split()[0]}, load {os.getloadavg()[0]:.1f}",
        "events": total, "jobs": jobs, "runs": runs,
        "medians": {k: median(v) for k, v in m.items()},
        "all": m,
        "targets": {k: {"op": op, "target": t, "met": (median(m[k]) >= t) if op == ">=" else (median(m[k]) <= t)}
                    for k, (op, t) in TARGETS.items()},
    }
    result["figures"] = figures(result["medians"])
    return result


def figures(med: dict[str, float]) -> list[dict]:
    """Every row as ours / theirs / ratio / target, each target met or missed. The ratio is
    how many times better ours is (theirs/ours for times, ours/theirs for rates)."""
    out = []
    for label, ours, es, spec in ROWS:
        value, theirs = med.get(ours), med.get(es) if es else None
        lower_better = not ours.endswith("_per_s")
        ratio = None
        if value and theirs:
            ratio = theirs / value if lower_better else value / theirs
        targets = []
        if ours in TARGETS:
            op, t = TARGETS[ours]
            targets.append({"target": f"{op} {fmt(t, spec)}", "met": value >= t if op == ">=" else value <= t})
        if ours in RATIO_TARGETS and ratio is not None:
            targets.append({"target": f">= {RATIO_TARGETS[ours]}x", "met": ratio >= RATIO_TARGETS[ours]})
        out.append({"measure": label, "key": ours, "ours": value, "theirs": theirs, "ratio": ratio, "targets": targets})
    return out


ROWS = [  # label, ours key, eventsourcing key, format
    ("single append, durable (FULL), events/s", "single_append_full_per_s", "es_single_append_per_s", "{:,.0f}"),
    ("single append, CPU us per append (besides the fsync)", "single_append_cpu_us", "es_single_append_cpu_us", "{:.0f}"),
    ("single append, synchronous=NORMAL, events/s", "single_append_normal_per_s", None, "{:,.0f}"),
    ("durable single append, 2 writer threads, events/s", "single_append_full_2w_per_s", "es_single_append_2w_per_s", "{:,.0f}"),
    ("durable single append, 8 writer threads, events/s", "single_append_full_8w_per_s", "es_single_append_8w_per_s", "{:,.0f}"),
    ("durable append, 10 events per commit, events/s", "grouped_append_full_per_s", None, "{:,.0f}"),
    ("batched append, events/s", "batched_append_per_s", "es_batched_append_per_s", "{:,.0f}"),
    ("batched append, events per CPU-s", "batched_append_cpu_per_s", "es_batched_append_cpu_per_s", "{:,.0f}"),
    ("full replay, s", "replay_full_s", "es_replay_full_s", "{:.2f}"),
    ("full replay, CPU s", "replay_full_cpu_s", "es_replay_full_cpu_s", "{:.2f}"),
    ("snapshot + 1,000-event tail, ms", "replay_snapshot_tail_s", None, "ms"),
    ("snapshot + tail, CPU ms", "replay_snapshot_tail_cpu_s", None, "ms"),
    ("inspect one job, ms", "inspect_s", "es_inspect_s", "ms"),
    ("verify, s", "verify_s", None, "{:.2f}"),
    ("verify, CPU s", "verify_cpu_s", None, "{:.2f}"),
    ("peak RSS of full replay, MB", "replay_peak_rss_mb", "es_replay_peak_rss_mb", "{:.0f}"),
    ("  (RSS before the replay, MB)", "replay_base_rss_mb", None, "{:.0f}"),
]


def fmt(value: float | None, spec: str) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.1f}" if spec == "ms" else spec.format(value)


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['events']:,} events, {result['jobs']:,} jobs, median of {result['runs']} run(s); {result['machine']}")
    for col in ("measure", "tpu-ledger", "eventsourcing 9.x", "ratio", "target"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    specs = {ours: spec for _, ours, _, spec in ROWS}
    for row in result["figures"]:
        spec = specs[row["key"]]
        tgt = ", ".join(f"{t['target']} {'met' if t['met'] else 'MISSED'}" for t in row["targets"])
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        table.add_row(row["measure"], fmt(row["ours"], spec), fmt(row["theirs"], spec), ratio, tgt)
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events in the ledger (default 200,000)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs they are spread over (default events/100)")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are reported (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go (default: a temporary folder)")
    parser.add_argument("--replay-child", nargs=2, metavar=("PATH", "ENGINE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay_child:
        replay_child(*args.replay_child)
        return
    jobs = args.jobs or max(1, args.events // 100)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = run(args.events, jobs, args.runs, Path(tmp), progress)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
