"""PostgreSQL ledger benchmark: tpu-ledger's PostgresStore against `eventsourcing` 9.x's
PostgreSQL recorder, on the same server, the same data, in the same run.

    python bench/pg_bench.py                                   # 100k events, 3 runs
    python bench/pg_bench.py --events 1000000 --runs 3 --json  # the issue's 1M replay
    python bench/pg_bench.py --url postgresql://user@db.internal/bench

Measured (medians over --runs; wall time, CPU time of this process beside it, since the
machine may be shared): durable single-event append (one writer; and WRITERS writers at
once, which shows what the commit-order lock costs), single append with
synchronous_commit=off (not durable; shows the fsync share), batched append (append_many,
100 jobs' events per transaction), full replay without snapshot (fold of every event), and
the store's share of it (fold_rows read, nothing folded) and a scan of every decoded envelope
(read_all). A scratch database is created and dropped unless
--url is given (then scratch schemas in it are created and dropped).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import ledger_bench  # noqa: E402
import psycopg  # noqa: E402
import psycopg.sql  # noqa: E402
from ledger_bench import TICK_TIME, es_stored, timed  # noqa: E402
from workload import workload  # noqa: E402

from ledger.events import NewEvent, actor  # noqa: E402
from ledger.replay import load_state  # noqa: E402
from ledger.store.postgres import PostgresStore  # noqa: E402

TARGETS = {  # from issue 9
    "single_append_per_s": (">=", 2000), "batched_append_per_s": (">=", 30_000), "replay_1m_s": ("<=", 5.0),
}
SINGLE = 2000  # single-event appends per run
JOBS_PER_TX = 100  # batched append: this many jobs' events per transaction
WRITERS = 4


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Scratch:
    """Schemas (and, without --url, a database) that exist only for this run."""

    def __init__(self, url: str | None) -> None:
        self.admin = url or "postgresql://postgres@127.0.0.1:5432/postgres"
        self.db_name: str | None = None
        if url is None:
            self.db_name = f"ledger_bench_{secrets.token_hex(4)}"
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.db_name}"')
            self.url = f"{self.admin.rsplit('/', 1)[0]}/{self.db_name}"
        else:
            self.url = url
        self.schemas: list[str] = []

    def schema(self, prefix: str) -> str:
        name = f"{prefix}_{secrets.token_hex(4)}"
        self.schemas.append(name)
        return name

    def store_url(self, schema: str, options: str = "") -> str:
        sep = "&" if "?" in self.url else "?"
        extra = f"&options={quote(options)}" if options else ""
        return f"{self.url}{sep}schema={schema}{extra}"

    def drop(self) -> None:
        if self.db_name:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            return
        with psycopg.connect(self.url, autocommit=True) as conn:
            for name in self.schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


# -- tpu-ledger ----------------------------------------------------------------------------
def ours_fill(url: str, data) -> tuple[float, float]:
    store = PostgresStore(url)

    def go():
        for i in range(0, len(data), JOBS_PER_TX):
            store.append_many([(job, events, 0) for job, events in data[i:i + JOBS_PER_TX]])

    wall, cpu, _ = timed(go)
    store.close()
    return wall, cpu


def ours_single(url: str, stream: str, count: int) -> None:
    store = PostgresStore(url)
    who = actor("reconciler", "bench")
    for n in range(count):
        store.append(stream, [NewEvent("note", {"text": f"tick {n}"}, who, key=str(n))], expected_version=n)
    store.close()


def writers_at_once(fn, url: str, tag: str, writers: int) -> tuple[float, float]:
    fn(url, f"bench/{tag}-warmup", 1)  # tables exist before the writers race (and are warm)
    per = SINGLE // writers
    done: list[int] = []
    errors: list[BaseException] = []

    def writer(stream: str) -> None:
        try:
            fn(url, stream, per)
            done.append(per)
        except BaseException as exc:  # a figure from writers that died would be a lie
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"bench/{tag}-{w}",)) for w in range(writers)]
    w0, c0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if errors or sum(done) != per * writers:
        raise RuntimeError(f"a writer failed: {errors[0]!r}" if errors else "a writer stopped early")
    return wall, cpu


def ours_replay(url: str) -> tuple[float, float, int]:
    store = PostgresStore(url, create=False)
    wall, cpu, state = timed(lambda: load_state(store, use_snapshot=False))
    store.close()
    return wall, cpu, len(state.jobs)


def ours_rows(url: str) -> tuple[float, float, int]:
    """The store's share of a replay: every fold row read, nothing folded."""
    store = PostgresStore(url, create=False)
    wall, cpu, n = timed(lambda: sum(1 for _ in store.fold_rows()))
    store.close()
    return wall, cpu, n


def ours_scan(url: str) -> tuple[float, float, int]:
    store = PostgresStore(url, create=False)
    wall, cpu, n = timed(lambda: sum(1 for _ in store.read_all()))
    store.close()
    return wall, cpu, n


# -- eventsourcing, same server, same data -------------------------------------------------
def es_recorder(url: str, schema: str, *, create: bool = True):
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

    parts = urlsplit(url)
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    datastore = PostgresDatastore(
        dbname=parts.path.lstrip("/"), host=parts.hostname or "127.0.0.1", port=parts.port or 5432,
        user=parts.username or "postgres", password=parts.password or "", schema=schema,
        originator_id_type="text",
    )
    recorder = PostgresApplicationRecorder(datastore)
    if create:  # not from racing threads: concurrent CREATE OR REPLACE FUNCTION fails
        recorder.create_table()
    return recorder


def es_fill(url: str, schema: str, data) -> tuple[float, float]:
    return ledger_bench.es_fill_recorder(es_recorder(url, schema), data)


def es_single_fn(schema: str):
    def single(url: str, stream: str, count: int) -> None:
        recorder = es_recorder(url, schema, create=stream.endswith("-warmup"))
        who = actor("reconciler", "bench")
        for n in range(count):
            recorder.insert_events([es_stored(stream, n + 1, NewEvent("note", {"text": f"tick {n}"}, who, time=TICK_TIME))])
        recorder.datastore.close()

    return single


def es_replay(url: str, schema: str) -> tuple[float, float, int]:
    recorder = es_recorder(url, schema)
    # The same fold over eventsourcing's records as the SQLite bench uses.
    wall, cpu, state = timed(lambda: ledger_bench.es_replay(recorder))
    recorder.datastore.close()
    return wall, cpu, len(state.jobs)


# -- the run -------------------------------------------------------------------------------
STATISTICS_SAID = {"auto": "as autovacuum left them", "vacuum": "after VACUUM (ANALYZE)", "none": "none"}


def run(events: int, jobs: int, runs: int, url: str | None, with_es: bool, progress, statistics: str = "auto") -> dict:
    scratch = Scratch(url)
    load_before = os.getloadavg()
    try:
        res = _run(scratch, events, jobs, runs, with_es, progress, statistics)
        res["vacuumed"] = statistics == "vacuum"
        res["statistics"] = statistics
    finally:
        scratch.drop()
    # The machine may be shared: the 1-minute load average at the start and the end.
    res["load"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    return res


def _each_table(url: str, schema: str, statement: str) -> None:
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'",
            (schema,))]
        for table in tables:
            conn.execute(psycopg.sql.SQL(statement).format(psycopg.sql.Identifier(schema, table)))


def vacuum(url: str, schema: str) -> None:
    """VACUUM (ANALYZE) every table of `schema`: the state autovacuum leaves a ledger in after a
    while (statistics for the planner, the visibility map, hint bits set)."""
    _each_table(url, schema, "VACUUM (ANALYZE) {}")


def no_autovacuum(url: str, schema: str) -> None:
    """Autovacuum off on every table of `schema` before it is filled: its replays meet a
    table the planner has no statistics for, as a ledger just migrated or restored does
    until autovacuum's first ANALYZE."""
    _each_table(url, schema, "ALTER TABLE {} SET (autovacuum_enabled = false)")


def _run(scratch: Scratch, events: int, jobs: int, runs: int, with_es: bool, progress, statistics: str) -> dict:
    progress(f"generating {events} events over {jobs} jobs")
    data = list(workload(events, jobs))
    total = sum(len(e) for _, e in data)
    with psycopg.connect(scratch.url.split("?")[0]) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        settings = {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in ("synchronous_commit", "fsync", "shared_buffers")}
    res: dict = {"events": total, "jobs": jobs, "runs": runs, "single_events": SINGLE, "writers": WRITERS,
                 "server": f"PostgreSQL {server}", "settings": settings, "ours": {}, "eventsourcing": {}}
    ours, es = res["ours"], res["eventsourcing"]

    progress("tpu-ledger: batched fill")
    main = scratch.schema("ours")
    if statistics == "none":
        PostgresStore(scratch.store_url(main)).close()  # the tables, to turn autovacuum off on
        no_autovacuum(scratch.url, main)
    wall, cpu = ours_fill(scratch.store_url(main), data)
    ours["batched_append_per_s"] = total / wall
    ours["batched_append_cpu_s"] = cpu

    for label, writers, options in (("single_append", 1, ""), ("single_append_4_writers", WRITERS, ""),
                                    ("single_append_async_commit", 1, "-c synchronous_commit=off")):
        rates, cpus = [], []
        for r in range(runs):
            progress(f"tpu-ledger: {label} run {r + 1}/{runs}")
            schema = scratch.schema("single")
            wall, cpu = writers_at_once(ours_single, scratch.store_url(schema, options), f"{label}-{r}", writers)
            rates.append(SINGLE // writers * writers / wall)
            cpus.append(cpu)
        ours[f"{label}_per_s"] = median(rates)
        ours[f"{label}_cpu_s"] = median(cpus)

    if statistics == "vacuum":
        progress("tpu-ledger: VACUUM (ANALYZE)")
        vacuum(scratch.url, main)
    for label, fn in (("replay", ours_replay), ("fold_rows", ours_rows), ("scan", ours_scan)):
        walls, cpus = [], []
        for r in range(runs):
            progress(f"tpu-ledger: {label} run {r + 1}/{runs}")
            wall, cpu, n = fn(scratch.store_url(main))
            walls.append(wall)
            cpus.append(cpu)
        ours[f"{label}_s"] = median(walls)
        ours[f"{label}_cpu_s"] = median(cpus)
        ours[f"{label}_per_s"] = total / median(walls)
    ours["replay_1m_s"] = ours["replay_s"] * 1_000_000 / total  # extrapolated unless events = 1M

    if with_es:
        progress("eventsourcing: batched fill")
        es_main = scratch.schema("es")
        if statistics == "none":
            es_recorder(scratch.url, es_main).datastore.close()
            no_autovacuum(scratch.url, es_main)
        wall, cpu = es_fill(scratch.url, es_main, data)
        es["batched_append_per_s"] = total / wall
        es["batched_append_cpu_s"] = cpu
        for label, writers in (("single_append", 1), ("single_append_4_writers", WRITERS)):
            rates, cpus = [], []
            for r in range(runs):
                progress(f"eventsourcing: {label} run {r + 1}/{runs}")
                schema = scratch.schema("es_single")
                wall, cpu = writers_at_once(es_single_fn(schema), scratch.url, f"{label}-{r}", writers)
                rates.append(SINGLE // writers * writers / wall)
                cpus.append(cpu)
            es[f"{label}_per_s"] = median(rates)
            es[f"{label}_cpu_s"] = median(cpus)
        if statistics == "vacuum":
            progress("eventsourcing: VACUUM (ANALYZE)")
            vacuum(scratch.url, es_main)
        walls, cpus = [], []
        for r in range(runs):
            progress(f"eventsourcing: replay run {r + 1}/{runs}")
            wall, cpu, _ = es_replay(scratch.url, es_main)
            walls.append(wall)
            cpus.append(cpu)
        es["replay_s"] = median(walls)
        es["replay_cpu_s"] = median(cpus)
        es["replay_per_s"] = total / median(walls)
        es["replay_1m_s"] = es["replay_s"] * 1_000_000 / total
    res["targets"] = {
        k: {"target": f"{op} {v}", "measured": ours[k], "met": ours[k] >= v if op == ">=" else ours[k] <= v}
        for k, (op, v) in TARGETS.items()
    }
    return res


def print_table(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"PostgreSQL ledger, {res['events']} events / {res['jobs']} jobs, median of {res['runs']} "
                    f"({res['server']}, synchronous_commit={res['settings']['synchronous_commit']}, "
                    f"statistics {STATISTICS_SAID[res['statistics']]}, "
                    f"load {res['load'][0]:.2f} -> {res['load'][1]:.2f})")
    t.add_column("measure")
    t.add_column("tpu-ledger", justify="right")
    t.add_column("eventsourcing", justify="right")
    t.add_column("target", justify="right")
    rows = [
        ("durable single append, 1 writer (events/s)", "single_append_per_s", "{:,.0f}"),
        (f"durable single append, {res['writers']} writers (events/s)", "single_append_4_writers_per_s", "{:,.0f}"),
        ("single append, synchronous_commit=off (events/s)", "single_append_async_commit_per_s", "{:,.0f}"),
        ("batched append (events/s)", "batched_append_per_s", "{:,.0f}"),
        ("full replay, fold (s)", "replay_s", "{:.2f}"),
        ("full replay (events/s)", "replay_per_s", "{:,.0f}"),
        ("replay of 1M, extrapolated (s)", "replay_1m_s", "{:.2f}"),
        ("store share of replay: fold_rows read (s)", "fold_rows_s", "{:.2f}"),
        ("scan of every envelope, read_all (s)", "scan_s", "{:.2f}"),
    ]
    targets = {k: v["target"] for k, v in res["targets"].items()}
    for label, key, spec in rows:
        a = res["ours"].get(key)
        b = res["eventsourcing"].get(key)
        t.add_row(label, spec.format(a) if a is not None else "-", spec.format(b) if b is not None else "-",
                  targets.get(key, "") or (targets["replay_1m_s"] if key == "replay_1m_s" else ""))
    Console().print(t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000, help="events in the ledger (default 100,000)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs they are spread over (default events/100)")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are reported (default 3)")
    parser.add_argument("--url", default=None, help="database to use (scratch schemas); default: a scratch "
                        "database on postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--no-eventsourcing", action="store_true", help="skip the eventsourcing side")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--vacuum", action="store_true", help="VACUUM (ANALYZE) each side's filled tables before its "
                        "replays (the steady state autovacuum keeps a live ledger in; default: replays of the fresh fill, "
                        "which autovacuum may or may not have analyzed by then)")
    parser.add_argument("--no-statistics", action="store_true", help="autovacuum off on each side's tables before the "
                        "fill: replays meet a table the planner has no statistics for (a ledger just migrated or restored)")
    args = parser.parse_args()
    jobs = args.jobs or max(1, args.events // 100)

    def progress(msg: str) -> None:
        print(f"  {msg} (load {os.getloadavg()[0]:.2f}, {time.strftime('%H:%M:%S', time.gmtime())} UTC)",
              file=sys.stderr, flush=True)

    if args.vacuum and args.no_statistics:
        parser.error("--vacuum and --no-statistics are opposites: choose one")
    statistics = "vacuum" if args.vacuum else "none" if args.no_statistics else "auto"
    res = run(args.events, jobs, args.runs, args.url, not args.no_eventsourcing, progress, statistics)
    if args.json:
        print(json.dumps(res, indent=2, sort_keys=True))
    else:
        print_table(res)


if __name__ == "__main__":
    main()
