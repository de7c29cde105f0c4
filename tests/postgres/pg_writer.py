"""One of the concurrent writers of test_pg_concurrency (run as a separate process).

argv: store URL, writer name, events, batch size, shared-counter increments.
Appends `events` events to its own stream in batches (expected version each time: it is the
stream's only writer, so a conflict would be a store bug), and increments a stream shared by
all writers with expected-version retries. Prints a JSON summary.
"""

from __future__ import annotations

import json
import sys

from ledger.errors import ConflictError
from ledger.events import NewEvent, actor
from ledger.store import open_store


def main() -> None:
    url, name, total, batch, increments = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    who = actor("reconciler", name)
    store = open_store(url)
    stream = f"writer/{name}"
    version, conflicts, done_increments = 0, 0, 0
    every = max(1, total // max(1, increments))
    for start in range(0, total, batch):
        events = [NewEvent("note", {"text": str(i)}, who, key=f"{name}:{i}") for i in range(start, min(total, start + batch))]
        version = store.append(stream, events, expected_version=version).version
        while done_increments < increments and (start + batch) // every > done_increments:
            current = store.stream_version("shared/counter")
            try:
                store.append("shared/counter", [NewEvent("note", {"text": str(current + 1)}, who)], expected_version=current)
                done_increments += 1
            except ConflictError:
                conflicts += 1
    store.close()
    print(json.dumps({"name": name, "version": version, "increments": done_increments, "conflicts": conflicts}))


if __name__ == "__main__":
    main()
