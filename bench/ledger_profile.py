"""Where each microsecond of the SQLite store goes, stage by stage (docs/bench/ledger.md).

    python bench/ledger_profile.py --events 200000

Batched append: encoding of data/actor, ids, body + hash, then the same precomputed rows
inserted into the real schema, without the insert trigger, and without the trigger or the
id index, so the database's share (and the trigger's) is measured apart from Python's.
Durable single append: the time of each statement of one append (BEGIN .. COMMIT).
Replay and verify: the row fetch alone, JSON decoding, the hash rebuild, and the rest.
Figures are CPU microseconds per event (process time), single process.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import msgspec  # noqa: E402
from workload import workload  # noqa: E402

from ledger.events import GENESIS_HASH, NewEvent, actor, dumps, sealed_hash  # noqa: E402
from ledger.replay import load_state  # noqa: E402
from ledger.store import sqlfiles  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402
from ledger.store.sqlite.database import PACKAGE  # noqa: E402
from ledger.verify import verify_store  # noqa: E402

JOBS_PER_TX = 100


def cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def wall(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def append_stages(data: list, n: int, tmp: Path) -> dict[str, float]:
    events = [(job, e) for job, evs in data for e in evs]
    out = {}
    out["encode data+actor"] = cpu(lambda: [(dumps(e.data), dumps(e.actor)) for _, e in events])
    out["ids"] = cpu(lambda: [e.resolve_id(job) for job, e in events])
    rows, seq, prev = [], 0, GENESIS_HASH
    for job, evs in data:
        for v, e in enumerate(evs, 1):
            seq += 1
            rows.append((seq, job, v, e.type, e.time, dumps(e.actor), e.resolve_id(job), e.causation, dumps(e.data), prev))

    def chain():
        p = GENESIS_HASH
        for r in rows:
            p = sealed_hash(*r[:9], p)
    out["body + sha256"] = cpu(chain)
    full = []
    p = GENESIS_HASH
    for r in rows:
        h = sealed_hash(*r[:9], p)
        full.append((*r[:9], p, h))
        p = h
    bounds = []
    i = 0
    for k in range(0, len(data), JOBS_PER_TX):
        count = sum(len(evs) for _, evs in data[k:k + JOBS_PER_TX])
        bounds.append((i, i + count))
        i += count
    insert = sqlfiles.queries(PACKAGE, "queries.sql")["insert"]
    for label, drop in (("sqlite insert, real schema", ()),
                        ("sqlite insert, no insert trigger", ("DROP TRIGGER events_contiguous",)),
                        ("sqlite insert, no trigger, no id index", None)):
        path = tmp / f"p{len(out)}.db"
        store = SQLiteStore(path)
        db = store._db
        if drop is None:  # rebuild the table without the id's UNIQUE
            db.execute("DROP TABLE events")
            db.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, stream TEXT NOT NULL, version INTEGER NOT NULL, "
                       "type TEXT NOT NULL, time TEXT NOT NULL, actor TEXT NOT NULL, id TEXT NOT NULL, causation TEXT, "
                       "data TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL, UNIQUE (stream, version))")
        else:
            for s in drop:
                db.execute(s)

        def go(db=db):
            for a, b in bounds:
                db.execute("BEGIN IMMEDIATE")
                db.executemany(insert, full[a:b])
                db.execute("COMMIT")
        out[label] = cpu(go)
        store.close()
    return {k: v / n * 1e6 for k, v in out.items()}


def single_stages(tmp: Path, count: int = 500) -> dict[str, float]:
    """Each statement of one durable append, the previous path (head, stored ids and the
    stream version read before the insert) and today's (head and version from the
    connection's cache, checked by data_version; a stored id refused by the trigger)."""
    store = SQLiteStore(tmp / "single.db")
    db, q = store._db, store._q
    who = actor("reconciler", "bench")
    sums: dict[str, float] = {}
    marks: list[tuple[str, float]] = []

    def mark(label: str) -> None:
        marks.append((label, time.perf_counter()))
    prev = GENESIS_HASH
    for n in range(2 * count):
        before = n < count
        tag = "previous: " if before else "now: "
        ev = NewEvent("note", {"text": f"tick {n}"}, who, key=str(n))
        marks[:] = [("", time.perf_counter())]
        db.execute("BEGIN IMMEDIATE")
        mark(tag + "BEGIN IMMEDIATE")
        id_ = ev.resolve_id("bench/s")
        if before:
            db.execute(q["head_row"]).fetchone()
            mark(tag + "head")
            db.execute(q["stored_ids"], (json.dumps([id_]),)).fetchall()
            mark(tag + "stored ids")
            db.execute(q["stream_version"], ("bench/s",)).fetchone()
            mark(tag + "stream version")
        else:
            db.execute("PRAGMA data_version").fetchone()
            mark(tag + "data_version")
        row = (n + 1, "bench/s", n + 1, "note", "2026-01-01T00:00:00.000000Z", dumps(who), id_, None, dumps(ev.data), prev)
        h = sealed_hash(*row)
        mark(tag + "encode + hash")
        db.execute(q["insert"], (*row, h))
        mark(tag + "insert (trigger)")
        db.execute("COMMIT")
        mark(tag + "COMMIT (fsync)")
        prev = h
        for (_, t0), (label, t1) in zip(marks, marks[1:], strict=False):
            sums[label] = sums.get(label, 0.0) + (t1 - t0)
    store.close()
    return {k: v / count * 1e6 for k, v in sums.items()}  # wall us: the fsync is wall time


def read_stages(path: Path, n: int) -> dict[str, float]:
    db = sqlite3.connect(path)
    out = {}
    out["fetch fold columns"] = cpu(lambda: sum(1 for _ in db.execute("SELECT seq, stream, version, type, time, data FROM events")))
    texts = [r[0] for r in db.execute("SELECT data FROM events")]
    out["json.loads every data"] = cpu(lambda: [json.loads(t) for t in texts])
    out["msgspec.json.decode every data"] = cpu(lambda: [msgspec.json.decode(t) for t in texts])
    store = SQLiteStore(path)
    out["replay (load_state, no snapshot)"] = cpu(lambda: load_state(store, use_snapshot=False))
    out["fetch all columns"] = cpu(lambda: sum(1 for _ in db.execute("SELECT * FROM events")))
    rows = list(db.execute("SELECT seq, stream, version, type, time, actor, id, causation, data, prev_hash, hash FROM events"))
    out["hash rebuild"] = cpu(lambda: [sealed_hash(*r[:10]) for r in rows])
    out["verify in one process"] = cpu(lambda: verify_store(store, parallel_from=0))
    out["verify in two processes, wall"] = wall(lambda: verify_store(store, parallel_from=1))
    store.close()
    db.close()
    return {k: v / n * 1e6 for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = list(workload(args.events, max(1, args.events // 100)))
    n = sum(len(e) for _, e in data)
    with tempfile.TemporaryDirectory() as tmp:
        result = {"batched append, CPU us/event": append_stages(data, n, Path(tmp)),
                  "durable single append, wall us/append": single_stages(Path(tmp))}
        store = SQLiteStore(Path(tmp) / "full.db")
        for k in range(0, len(data), JOBS_PER_TX):
            store.append_many([(job, evs, 0) for job, evs in data[k:k + JOBS_PER_TX]])
        store.close()
        result["replay and verify, CPU us/event"] = read_stages(Path(tmp) / "full.db", n)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for section, stages in result.items():
        print(section)
        for label, us in stages.items():
            print(f"  {label:<40} {us:8.2f}")


if __name__ == "__main__":
    main()
