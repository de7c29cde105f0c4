"""The lab-wide capacity memory (ledger.capacity) from a checked snapshot plus the events after it.

The third kind of snapshot beside the job states' (ledger.snapshots) and usage's
(ledger.usage.snapshot). The memory is small (a row per stocked-out place, the rounds of the
jobs still trying), but folding it means reading the whole ledger, and most events are of a
type it reads: at 1M events that fold took ~1.9 s of `ledger queue` and of every reconciler
and dashboard start. A snapshot is checked exactly as the others are
(`replay.checked_snapshot`: its own hash, the event it names in the chain, this code's
version, it decodes to its position), saved by the same rule (`replay.snapshot_due`), and
`ledger verify` compares it with the memory rebuilt from the events.

Folding snapshot + tail gives exactly the memory of a fold of every event: what is saved is
the memory's whole state, and folding is deterministic (tests/ledger/test_capacity_snapshot.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from pathlib import Path
from typing import Any

from ledger import capacity
from ledger.capacity import CapacityMemory, Stockouts, Tally
from ledger.replay import SNAPSHOT_EVERY, checked_snapshot, snapshot_due, tied_snapshot
from ledger.snapshots.plain import load_plain
from ledger.store.base import Snapshot, SnapshotReader

SNAPSHOT_NAME = "capacity"
_MAGIC = b"TLC1"


def code_version() -> str:
    """The memory's fold and this encoding's code together."""
    digest = hashlib.sha256()
    for path in (capacity.__file__, __file__):
        digest.update(Path(path or "").read_bytes())
    return digest.hexdigest()[:16]


def encode(memory: CapacityMemory) -> bytes:
    """The memory as plain containers (no class is named: `load_plain` reads it back)."""
    body = {
        "position": memory.position, "backoff_us": memory.backoff_us, "backoff_max_us": memory.backoff_max_us,
        "keys": [(key, dataclasses.astuple(found)) for key, found in memory.keys.items()],
        "rounds": {job: {index: dataclasses.astuple(t) for index, t in tallies.items()}
                   for job, tallies in memory.rounds.items()},
        "ran_on": dict(memory.ran_on), "moved": sorted(memory.moved),
    }
    return _MAGIC + pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)


def decode(blob: bytes) -> CapacityMemory | None:
    """The memory in `blob`; None when it is not one this code wrote (it is then ignored)."""
    if not blob.startswith(_MAGIC):
        return None
    try:
        body: dict[str, Any] = load_plain(blob, len(_MAGIC))
        return CapacityMemory(
            backoff_us=body["backoff_us"], backoff_max_us=body["backoff_max_us"],
            keys={tuple(key): Stockouts(*values) for key, values in body["keys"]},
            rounds={job: {index: Tally(*values) for index, values in tallies.items()}
                    for job, tallies in body["rounds"].items()},
            ran_on=dict(body["ran_on"]), moved=set(body["moved"]), position=body["position"])
    except (pickle.UnpicklingError, KeyError, TypeError, ValueError, EOFError):
        return None


def difference(saved: CapacityMemory, rebuilt: CapacityMemory) -> str | None:
    """What differs between a saved memory and the one rebuilt from the events, said plainly."""
    for name in ("backoff_us", "backoff_max_us", "keys", "rounds", "ran_on", "moved"):
        if getattr(saved, name) != getattr(rebuilt, name):
            return f"its {name.replace('_', ' ')} differ from the events'"
    return None


# -- the store side -----------------------------------------------------------------------------
def _decoded(snap: Snapshot) -> CapacityMemory | None:
    return decode(snap.state)


def _position(memory: CapacityMemory) -> int:
    return memory.position


def load_capacity(store: SnapshotReader, until: int | None = None, use_snapshot: bool = True) -> CapacityMemory:
    """The memory at seq `until` (None = head): the newest usable snapshot plus the events
    after it (the whole ledger when none is usable)."""
    target = store.head() if until is None else min(until, store.head())
    found = checked_snapshot(store, SNAPSHOT_NAME, code_version(), target, _decoded, _position) if use_snapshot else None
    memory = found if found is not None else CapacityMemory()
    memory.apply_rows(store.fold_rows(memory.position, target))
    memory.position = target
    return memory


def capacity_due(store: SnapshotReader, position: int, every: int = SNAPSHOT_EVERY) -> bool:
    """Whether a capacity snapshot at `position` is due (the other snapshots' rule)."""
    return snapshot_due(store, SNAPSHOT_NAME, code_version(), position, every)


def due_blob(store: SnapshotReader, memory: CapacityMemory, every: int = SNAPSHOT_EVERY) -> tuple[int, bytes] | None:
    """What to save (`save_blob`) when a capacity snapshot of `memory` is due, encoded now (a
    copy later folds never change); None when none is due."""
    if not capacity_due(store, memory.position, every):
        return None
    return memory.position, encode(memory)


def save_blob(store: SnapshotReader, position: int, blob: bytes) -> None:
    store.save_snapshot(tied_snapshot(store, SNAPSHOT_NAME, code_version(), position, blob))


def save_capacity(store: SnapshotReader, memory: CapacityMemory) -> None:
    save_blob(store, memory.position, encode(memory))

