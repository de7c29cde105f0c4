"""A child process that appends to a ledger, for the contract tests (real processes).

python -m tests.ledger.writer URL NAME COUNT BATCH MODE
  MODE free:     append COUNT batches of BATCH events to stream NAME/own and to shared/stream
  MODE optimistic: COUNT single events to shared/counter with expected_version, retrying on
                 conflict (optimistic concurrency under contention)
  MODE forever:  batches of BATCH to NAME/own until killed
Prints `ack <batch-number> <first-seq> <last-seq>` after every append that returned.
"""

from __future__ import annotations

import sys

from ledger.errors import ConflictError
from ledger.events import NewEvent, actor
from ledger.store import open_store


def main() -> None:
    url, name, count, batch, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    store = open_store(url)
    who = actor("system", f"writer-{name}")
    n = 0
    while mode == "forever" or n < count:
        if mode == "optimistic":
            while True:
                version = store.stream_version("shared/counter")
                try:
                    result = store.append(
                        "shared/counter", [NewEvent("note", {"text": f"{name}-{n}"}, who, key=f"{name}-{n}")], version
                    )
                    break
                except ConflictError:
                    continue
        else:
            stream = f"{name}/own" if mode == "forever" or n % 2 == 0 else "shared/stream"
            events = [NewEvent("note", {"text": f"{name} {n} {i}"}, who, key=f"{name}-{n}-{i}") for i in range(batch)]
            result = store.append(stream, events)
        print(f"ack {n} {result.positions[0]} {result.positions[-1]}", flush=True)
        n += 1
    store.close()


if __name__ == "__main__":
    main()
