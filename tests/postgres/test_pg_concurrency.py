"""4 processes appending 10,000 events each at once to one PostgreSQL ledger, while a reader
follows the head: no gap, no duplicate, commit order = seq order, and the chain verifies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ledger.app.commands.migrate import verify_chain
from ledger.store import open_store

REPO = Path(__file__).resolve().parents[2]
WRITERS, EVENTS, BATCH, INCREMENTS = 4, 10_000, 25, 50


@pytest.mark.slow
def test_four_processes_append_at_once_without_gap_duplicate_or_broken_chain(pg_url):
    store = open_store(pg_url)  # create the schema once, before the writers race
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    seen: list[int] = []
    problems: list[str] = []
    stop = threading.Event()

    def follow() -> None:
        # A reader that has seen seq N must never later find a new event below N: each read
        # continues exactly where the last one ended.
        reader = open_store(pg_url, create=False)
        last = 0
        try:
            while not stop.is_set():
                for e in reader.read_all(after=last):
                    if e.seq != last + 1:
                        problems.append(f"after seq {last} the reader saw {e.seq}")
                    last = e.seq
                    seen.append(e.seq)
                reader.wait_for_append(last, timeout=0.5)
        finally:
            reader.close()

    reader_thread = threading.Thread(target=follow)
    reader_thread.start()
    procs = [
        subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("pg_writer.py")), pg_url, f"w{i}",
             str(EVENTS), str(BATCH), str(INCREMENTS)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(WRITERS)
    ]
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    total = WRITERS * EVENTS + WRITERS * INCREMENTS
    deadline = time.monotonic() + 60
    while len(seen) < total and time.monotonic() < deadline and reader_thread.is_alive():
        time.sleep(0.05)
    stop.set()
    reader_thread.join(timeout=30)

    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    summaries = [json.loads(out) for out, _ in outputs]
    assert all(s["version"] == EVENTS and s["increments"] == INCREMENTS for s in summaries)
    assert problems == []
    assert seen == list(range(1, total + 1))
    assert store.head() == total
    check = verify_chain(store)  # seq 1..N, prev_hash links, hashes, per-stream versions
    assert check.events == total
    ids = [row[6] for row in store.raw_rows(0)]
    assert len(set(ids)) == total
    for i in range(WRITERS):
        assert [int(e.data["text"]) for e in store.read_stream(f"writer/w{i}")] == list(range(EVENTS))
    counter = store.read_stream("shared/counter")
    assert [int(e.data["text"]) for e in counter] == list(range(1, WRITERS * INCREMENTS + 1))
    store.close()
