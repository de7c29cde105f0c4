"""What a smaller events row, indexes left to the trigger, or larger pages would buy a batched append
(issue 33's store decision): the SQL alone (rows made beforehand, 100 a statement, 10,000 a
transaction, WAL, synchronous=FULL, the insert trigger on) into our table as it is and into
variants of it, taking turns run by run:

- `text`: the table as it is (hashes as 64 hex characters, the id as a UUID's 36);
- `blob-hashes`: `hash` and `prev_hash` as 32-byte blobs;
- `blob-id`: the same, and the id as its 16 bytes;
- `no-prev-hash`: the same, and no `prev_hash` column (the trigger then checks only that
  the seq follows the head: the link itself would be verify's alone);
- `plain-indexes`: the table as it is, but `id` and `(stream, version)` indexed without
  UNIQUE: the insert trigger already refuses a stored id and any version but the stream's
  next, so the unique indexes' own probe on every insert would be the trigger's alone;
- `no-trigger`: the table as it is without its insert trigger (a floor, not a candidate:
  nothing would keep the ledger append-only);
- `page-8k`, `page-16k`: the table as it is in a file of 8 or 16 KiB pages (SQLite's
  default, and ours, is 4 KiB): fewer, larger pages for the table and its two indexes.

    python bench/row_formats.py                 # 200k events, 2k jobs, 3 rounds

Prints, per variant, the median CPU and wall µs a row and the file's size. None of these is
a format of ours; the bench says whether one is worth a store format migration.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from ledger_bench import sealed_rows  # noqa: E402
from workload import workload  # noqa: E402

SCHEMA = (ROOT / "ledger/store/sqlite/schema.sql").read_text()
TRIGGERS = (ROOT / "ledger/store/sqlite/triggers.sql").read_text()
ZERO_HASH = "'" + "0" * 64 + "'"
VARIANTS = ("text", "blob-hashes", "blob-id", "no-prev-hash", "plain-indexes", "no-trigger", "page-8k", "page-16k")
PAGE_SIZES = {"page-8k": 8192, "page-16k": 16384}  # the others: 4,096
PER_STATEMENT, PER_TRANSACTION = 100, 10_000


def variant(name: str, rows: list[tuple]) -> tuple[str, str, list[tuple]]:
    """(schema, triggers, rows) of the variant, each change checked to apply."""
    schema, triggers = SCHEMA, TRIGGERS

    def swap(text: str, old: str, new: str) -> str:
        assert old in text, f"the schema changed: update bench/row_formats.py ({old!r})"
        return text.replace(old, new)

    if name == "plain-indexes":
        schema = swap(swap(schema, "id TEXT NOT NULL UNIQUE", "id TEXT NOT NULL"), ",\n    UNIQUE (stream, version)\n);",
                      "\n);\nCREATE INDEX events_id ON events (id);\nCREATE INDEX events_stream ON events (stream, version);")
        return schema, triggers, rows
    if name == "no-trigger":
        return schema, "", rows
    if name in PAGE_SIZES:
        return schema, triggers, rows
    if name != "text":
        schema = swap(swap(schema, "prev_hash TEXT NOT NULL", "prev_hash BLOB NOT NULL"), "hash TEXT NOT NULL,", "hash BLOB NOT NULL,")
        triggers = swap(triggers, ZERO_HASH, "zeroblob(32)")
        rows = [(*r[:9], bytes.fromhex(r[9]), bytes.fromhex(r[10])) for r in rows]
    if name in ("blob-id", "no-prev-hash"):
        schema = swap(schema, "id TEXT NOT NULL UNIQUE", "id BLOB NOT NULL UNIQUE")
        rows = [(*r[:6], uuid.UUID(r[6]).bytes, *r[7:]) for r in rows]
    if name == "no-prev-hash":
        schema = swap(schema, "    prev_hash BLOB NOT NULL,\n", "")
        triggers = swap(swap(triggers, "NEW.prev_hash IS NOT zeroblob(32) OR ", ""), " AND head.hash = NEW.prev_hash", "")
        rows = [(*r[:9], r[10]) for r in rows]
    return schema, triggers, rows


def insert_all(path: Path, schema: str, triggers: str, rows: list[tuple], page_size: int = 4096) -> tuple[float, float, int]:
    """CPU µs and wall µs a row, and the file's size in bytes."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA page_size = {page_size}")  # before WAL: a WAL file's page size is fixed
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute("PRAGMA cache_size = -65536")
    db.executescript("BEGIN;" + schema + triggers + "COMMIT;")
    width = len(rows[0])
    statement = "INSERT INTO events VALUES " + ", ".join(["(" + ", ".join("?" * width) + ")"] * PER_STATEMENT)
    whole = len(rows) - len(rows) % PER_STATEMENT  # whole statements only
    cpu, wall = time.process_time(), time.perf_counter()
    for first in range(0, whole, PER_TRANSACTION):
        db.execute("BEGIN IMMEDIATE")
        for start in range(first, min(first + PER_TRANSACTION, whole), PER_STATEMENT):
            db.execute(statement, [v for row in rows[start:start + PER_STATEMENT] for v in row])
        db.execute("COMMIT")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return cpu / whole * 1e6, wall / whole * 1e6, path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--jobs", type=int, default=None, help="default events/100")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = sealed_rows(list(workload(args.events, args.jobs or max(1, args.events // 100))))
    made = {name: variant(name, rows) for name in VARIANTS}
    found: dict[str, list[tuple[float, float, int]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
                found[name].append(insert_all(Path(tmp) / f"{name}-{r}.db", *made[name], PAGE_SIZES.get(name, 4096)))
                print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
    base = statistics.median(x[0] for x in found["text"])
    print(f"{len(rows):,} rows, {PER_STATEMENT} a statement, {PER_TRANSACTION:,} a transaction, trigger on; medians of {args.rounds}:")
    for name, runs in found.items():
        cpu = statistics.median(x[0] for x in runs)
        wall = statistics.median(x[1] for x in runs)
        print(f"  {name:14s} {cpu:5.2f} µs CPU a row ({cpu / base:.2f}x), {wall:5.2f} µs wall, file {runs[0][2] / 2**20:.0f} MB")


if __name__ == "__main__":
    main()
