"""The ledger's state at any position: the newest usable snapshot plus the events after it.

Snapshots are checked, never trusted. One is used only when it was made by this fold's code
(`fold.code_version()`), its content still hashes to its own hash, and the event it names
(position and hash) is the one in the chain (one indexed lookup). Otherwise it is ignored,
with a log line, and replay falls back to the events. These checks catch a damaged or stale
snapshot and a hand-made one that does not reproduce the hashes; a snapshot forged with
consistent hashes is only caught by `ledger verify`, which rebuilds every snapshot's state
from the events (ledger.verify.verify_snapshots).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import logging
import pickle
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

import msgspec

from ledger import fold
from ledger.errors import UsageError
from ledger.events import GENESIS_HASH, format_time
from ledger.fold import JobState, LedgerState
from ledger.store.base import Reader, Snapshot, SnapshotReader

log = logging.getLogger(__name__)

SNAPSHOT_NAME = "ledger"
# Snapshot when this many events have passed since the last one: replay then reads at most
# this many events beyond the snapshot, and a snapshot (~one job's state per job) is cheap.
SNAPSHOT_EVERY = 10_000


# -- snapshot encoding ---------------------------------------------------------------------
# Pickle of plain containers only (tuples of field values), read by an unpickler that refuses
# every global: nothing in a snapshot can name code to run, and it loads twice as fast as
# JSON. A snapshot's fields match JobState because the snapshot is tied to fold's code version.
_MAGIC = b"TLS1"


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ARG002
        raise pickle.UnpicklingError(f"snapshot refers to {module}.{name}; snapshots hold plain data only")


def _shared(value: Any, strings: dict[str, str], seen: dict[bytes, Any]) -> Any:
    """`value` with equal strings made one object, and equal lists and dicts too (same
    types, same order: equal pickles), so the pickle writes each once and loading makes
    each once. 10k jobs' states repeat most of their content (dict keys, states, failure
    records, the same TPU): 15 MB -> 5 MB, and loading 3x faster. Sharing is safe because
    states never edit a field in place (fold._clone copies `times`, the one exception)."""
    kind = type(value)
    if kind is str:
        return strings.setdefault(value, value)
    if kind is dict or kind is list:
        key = pickle.dumps(value, protocol=5)
        found = seen.get(key)
        if found is not None:
            return found
        if kind is dict:
            out: Any = {_shared(k, strings, seen): _shared(v, strings, seen) for k, v in value.items()}
        else:
            out = [_shared(v, strings, seen) for v in value]
        seen[key] = out
        return out
    return value


def _own_times(times: dict[str, str], strings: dict[str, str]) -> dict[str, str]:
    """`times` is the field a transition edits in place: each job keeps a dict of its own."""
    return {strings.setdefault(k, k): strings.setdefault(v, v) for k, v in times.items()}


def encode_state(state: LedgerState) -> bytes:
    names = tuple(f.name for f in dataclasses.fields(JobState))
    strings: dict[str, str] = {}
    seen: dict[bytes, Any] = {}
    rows = [
        tuple(_shared(getattr(job, n), strings, seen) if n != "times" else _own_times(job.times, strings) for n in names)
        for job in state.jobs.values()
    ]
    return _MAGIC + pickle.dumps((state.position, names, rows), protocol=5)


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Folding and decoding make no reference cycles but millions of containers, which set
    off collections of the whole heap over and over (the snapshot's 350k containers took
    2.5x as long to load with the collector on). Freed memory is still freed at once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_plain(data: bytes) -> Any:
    """Unpickle plain containers only (every snapshot kind's decoder uses this); raises
    pickle.UnpicklingError on anything that names code."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def decode_state(blob: bytes) -> LedgerState | None:
    """None when the blob is not a snapshot this code can read (it is then ignored)."""
    if not blob.startswith(_MAGIC):
        return None
    try:
        position, names, rows = load_plain(blob[len(_MAGIC):])
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError):
        return None
    if tuple(names) != tuple(f.name for f in dataclasses.fields(JobState)):
        return None
    return LedgerState(position, {row[0]: JobState(*row) for row in rows})


def fold_rows(store: Reader, after: int = 0, until: int | None = None) -> Iterator[tuple]:
    """(seq, stream, version, type, time, data_json) in seq order."""
    return store.fold_rows(after, until)


def fold_into(state: LedgerState, rows: Iterable[tuple]) -> LedgerState:
    """Fold rows onto `state` in place (the caller owns it) and return it. Data texts are
    decoded by msgspec: the same values as json.loads, ~5x faster for events' small dicts."""
    return fold.apply_rows(state, rows, msgspec.json.decode)


def snapshot_problem(store: Reader, snap: Snapshot) -> str | None:
    """Why `snap` must not be used on this ledger, or None: its content no longer hashes to
    its hash, or the event it was made from is not the one at its position in the chain."""
    if not snap.intact:
        return "its content does not match its hash (altered or damaged)"
    found = GENESIS_HASH if snap.position == 0 else store.hash_at(snap.position)
    if found is None:
        return f"it folds up to seq {snap.position}, past the ledger's head"
    if found != snap.event_hash:
        return f"it was made from another event at seq {snap.position} than the ledger holds"
    return None


def checked_snapshot(store: SnapshotReader, name: str, code_version: str, at_most: int,
                     decode: Callable[[bytes], Any], position_of: Callable[[Any], int]) -> Any | None:
    """The decoded state of the newest snapshot `name` of that code at or before `at_most`,
    if it passes the checks (snapshot_problem, and it decodes to its position); None
    otherwise, with a log line. Every kind of snapshot (job states, usage) is checked here."""
    snap = store.load_snapshot(name, code_version, at_most=at_most)
    if snap is None:
        return None
    why = snapshot_problem(store, snap)
    state = decode(snap.state) if why is None else None
    if why is None and (state is None or position_of(state) != snap.position):
        why = "its state does not decode to its position"
    if why is not None:
        log.warning("ignoring %s: %s; replaying from the events (`ledger verify --rebuild-snapshots` replaces it)",
                    snap.label, why)
        return None
    return state


def usable_snapshot(store: SnapshotReader, at_most: int) -> LedgerState | None:
    """The state of this code's newest job-state snapshot at or before `at_most`, if usable."""
    return checked_snapshot(store, SNAPSHOT_NAME, fold.code_version(), at_most, decode_state, _position)


def _position(state: Any) -> int:
    return state.position


def load_state(store: SnapshotReader, until: int | None = None, use_snapshot: bool = True) -> LedgerState:
    """Every job's state at `until` (a seq; None = head)."""
    head = store.head()
    target = head if until is None else min(until, head)
    state = LedgerState()
    with no_cyclic_gc():
        if use_snapshot:
            state = usable_snapshot(store, target) or state
        fold_into(state, fold_rows(store, state.position, target))
    state.position = target
    return state


def tied_snapshot(store: Reader, name: str, code_version: str, position: int, state: bytes) -> Snapshot:
    """`state` (folded up to `position`) sealed as a snapshot, tied to the event there."""
    event_hash = GENESIS_HASH if position == 0 else store.hash_at(position)
    if event_hash is None:
        raise ValueError(f"no event at seq {position} to tie a snapshot to")
    return Snapshot.seal(name, code_version, position, event_hash, state)


def make_snapshot(store: Reader, state: LedgerState) -> Snapshot:
    """`state` sealed as a job-state snapshot, tied to the event at its position."""
    return tied_snapshot(store, SNAPSHOT_NAME, fold.code_version(), state.position, encode_state(state))


def save_snapshot(store: SnapshotReader, state: LedgerState) -> None:
    store.save_snapshot(make_snapshot(store, state))


def snapshot_due(store: SnapshotReader, name: str, code_version: str, position: int, every: int = SNAPSHOT_EVERY) -> bool:
    """The policy for every kind: a state at `position` is saved when `every` events or more
    passed since the newest snapshot of that name and code, or when that one fails its checks."""
    last = store.load_snapshot(name, code_version, at_most=position)
    since = position - (last.position if last else 0)
    return not (since < every and (last is None or snapshot_problem(store, last) is None))


def maybe_snapshot(store: SnapshotReader, state: LedgerState, every: int = SNAPSHOT_EVERY) -> bool:
    """Save `state` when a job-state snapshot is due (snapshot_due). Call it after a replay
    at the head; returns whether it saved."""
    if not snapshot_due(store, SNAPSHOT_NAME, fold.code_version(), state.position, every):
        return False
    save_snapshot(store, state)
    return True


def resolve_until(store: Reader, text: str | None) -> int | None:
    """--until: a seq number, or an ISO time (the last event at or before it)."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--until {text!r} is neither a seq number nor an ISO time",
            hint="e.g. --until 1200 or --until 2026-03-01T12:00:00Z",
        ) from None
    if moment.tzinfo is None:
        raise UsageError(f"--until {text!r} has no time zone", hint="add Z for UTC, e.g. 2026-03-01T12:00:00Z")
    return store.position_at_time(format_time(moment))
