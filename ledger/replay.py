"""The ledger's state at any position: the newest usable snapshot plus the events after it.

Snapshots are checked, never trusted. One is used only when it was made by this fold's code
and this encoding (`code_version()`), its content still hashes to its own hash, and the event it names
(position and hash) is the one in the chain (one indexed lookup). Otherwise it is ignored,
with a log line, and replay falls back to the events. These checks catch a damaged or stale
snapshot and a hand-made one that does not reproduce the hashes; a snapshot forged with
consistent hashes is only caught by `ledger verify`, which rebuilds every snapshot's state
from the events (ledger.verify.verify_snapshots).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import lz4.block
import msgspec

from ledger import fold
from ledger.errors import UsageError
from ledger.events import GENESIS_HASH, format_time
from ledger.fold import JobState, LedgerState
from ledger.snapshots.jobs import (
    InChunk,
    Parts,
    SnapshotPartError,
    code_version,
    encode_state,
    fields_decoder,
    job_from_text,
    part_name,
    shared_fields,
)
from ledger.snapshots.lazy import LazyState, decode_lazy, decode_state
from ledger.snapshots.plain import no_cyclic_gc
from ledger.store.base import Reader, Snapshot, SnapshotReader

log = logging.getLogger(__name__)

SNAPSHOT_NAME = "ledger"
# Snapshot when this many events have passed since the last one: replay then reads at most
# this many events beyond the snapshot, and a snapshot (~one job's state per job) is cheap.
SNAPSHOT_EVERY = 10_000


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
                     decode: Callable[[Snapshot], Any], position_of: Callable[[Any], int]) -> Any | None:
    """The decoded state of the newest snapshot `name` of that code at or before `at_most`,
    if it passes the checks (snapshot_problem, its parts are the ones it names, and it
    decodes to its position); None otherwise, with a log line. Every kind of snapshot (job
    states, usage) is checked here."""
    snap = store.load_snapshot(name, code_version, at_most=at_most)
    if snap is None:
        return None
    why, state = snapshot_problem(store, snap), None
    if why is None:
        try:
            state = decode(snap)
        except SnapshotPartError as exc:
            why = str(exc)
    if why is None and (state is None or position_of(state) != snap.position):
        why = "its state does not decode to its position"
    if why is not None:
        log.warning("ignoring %s: %s; replaying from the events (`ledger verify --rebuild-snapshots` replaces it)",
                    snap.label, why)
        return None
    return state


def usable_snapshot(store: SnapshotReader, at_most: int) -> LedgerState | None:
    """The state of this code's newest job-state snapshot at or before `at_most`, if usable."""
    return checked_snapshot(store, SNAPSHOT_NAME, code_version(), at_most,
                            _with_parts(store, decode_state), _position)


def stored_parts(store: SnapshotReader, snap: Snapshot) -> Parts:
    """The parts of job-state snapshot `snap` as the store holds them, fetched when asked."""
    def part(part: str) -> bytes | None:
        return _own_part(snap, store.load_snapshot(part_name(snap.name, part), snap.code_version, at_most=snap.position))
    return part


def parts_among(snapshots: Iterable[Snapshot], snap: Snapshot) -> Parts:
    """The parts of job-state snapshot `snap` among `snapshots` (verify has them all at hand)."""
    found = {s.name: s for s in snapshots if s.position == snap.position and s.code_version == snap.code_version}

    def part(part: str) -> bytes | None:
        return _own_part(snap, found.get(part_name(snap.name, part)))
    return part


def _own_part(snap: Snapshot, found: Snapshot | None) -> bytes | None:
    """`found`'s content if it is a part saved with `snap` (same position, the same event)."""
    return found.state if found is not None and found.position == snap.position \
        and found.event_hash == snap.event_hash else None


Decoded = TypeVar("Decoded")


def _with_parts(store: SnapshotReader, decode: Callable[[bytes, Parts], Decoded]) -> Callable[[Snapshot], Decoded]:
    """`decode` (decode_state, decode_lazy) of a stored job-state snapshot and its stored parts."""
    return lambda snap: decode(snap.state, stored_parts(store, snap))


def _position(state: Any) -> int:
    return state.position


def load_state(store: SnapshotReader, until: int | None = None, use_snapshot: bool = True,
               progress: Callable[[int], None] | None = None) -> LedgerState:
    """Every job's state at `until` (a seq; None = head). `progress` is given the seq folded
    up to every PROGRESS_EVERY events (a fold from before the oldest snapshot kept is long:
    4-8 s at 1M events)."""
    head = store.head()
    target = head if until is None else min(until, head)
    state = LedgerState()
    with no_cyclic_gc():
        if use_snapshot:
            state = usable_snapshot(store, target) or state
        rows = fold_rows(store, state.position, target)
        fold_into(state, rows if progress is None else _reporting(rows, progress))
    state.position = target
    return state


# How often a long walk of the events says how far it got (load_state's, verify's `progress`).
PROGRESS_EVERY = 20_000


def _reporting(rows: Iterable[tuple], progress: Callable[[int], None]) -> Iterator[tuple]:
    """`rows` as they are, `progress` given each PROGRESS_EVERY-th one's seq."""
    for count, row in enumerate(rows, 1):
        if count % PROGRESS_EVERY == 0:
            progress(row[0])
        yield row


def load_state_apart(store: SnapshotReader, apart: Callable[[Any], bool], put: Callable[[Any, InChunk], None],
                     reads: Collection[str] | None = None) -> tuple[LedgerState, LazyState] | None:
    """`load_state`'s state at the head, less the snapshot's jobs that `apart` picks and the
    events after it do not touch: each of those goes to `put` with where its piece
    (`job_text`) lies instead. Read from the pieces a job at a time, so the whole state is
    never held at once (the reconciler keeps its settled jobs apart: reconciler.shelf).
    `apart` and `put` are given each such job as a JobState or, when they read only the
    fields `reads`, as a struct of those (`fields_decoder`: the rest of its piece, its spec
    most of it, is skipped, not built: 118,956 jobs' pieces decode in 0.18 s instead of 0.95;
    the reconciler's first pass at that size, 108,756 of them settled, 1.62 -> 1.38 s CPU).
    With it, the snapshot's index at the head (`load_lazy`'s: the dashboard picks the TPUs'
    holders from it without reading the snapshot again). None when there is no usable
    snapshot, or its pieces do not decode: then `load_state` it is (and what went to `put`
    is to be dropped)."""
    looks = job_from_text if reads is None else fields_decoder(reads).decode
    head = store.head()
    with no_cyclic_gc():
        lazy = checked_snapshot(store, SNAPSHOT_NAME, code_version(), head, _with_parts(store, decode_lazy), _position)
        if lazy is None:
            return None
        rows = list(fold_rows(store, lazy.position, head))
        touched = {r[1] for r in rows}
        state = LedgerState(lazy.position)
        strings: dict[str, str] = {}
        seen: dict[bytes, Any] = {}
        try:
            for job_id, text, where in lazy.pieces():
                if job_id in touched:
                    job = job_from_text(text)
                else:
                    seen_as = looks(text)
                    if apart(seen_as):
                        put(seen_as, where)
                        continue
                    job = seen_as if reads is None else job_from_text(text)
                # shared as a snapshot's rows are: the pass walks these (unshared, 10,200 jobs took it 40% longer)
                state.jobs[job_id] = JobState(*shared_fields(job, strings, seen))
        except (msgspec.DecodeError, lz4.block.LZ4BlockError, ValueError) as exc:  # msgspec's ValidationError too
            log.warning("the snapshot at seq %s does not decode job by job (%s): loading it whole", lazy.position, exc)
            return None
        state.owned.update(state.jobs)
        fold_into(state, rows)
        lazy.update({job_id: state.jobs[job_id] for job_id in touched if job_id in state.jobs})
    state.position = lazy.position = head
    return state, lazy


def load_lazy(store: SnapshotReader, until: int | None = None) -> LazyState:
    """Every job's state at `until` (a seq; None = head) as `load_state` gives it, decoded
    only as asked: the newest usable snapshot's index and pieces, and the jobs the events
    after it touch, folded (those events are read once, at most SNAPSHOT_EVERY of them
    when snapshots are kept). Without a usable snapshot, a full replay."""
    head = store.head()
    target = head if until is None else min(until, head)
    with no_cyclic_gc():
        lazy = checked_snapshot(store, SNAPSHOT_NAME, code_version(), target, _with_parts(store, decode_lazy), _position)
        if lazy is None:
            state = fold_into(LedgerState(), fold_rows(store, 0, target))
            state.position = target
            return LazyState.of(state)
        rows = list(fold_rows(store, lazy.position, target))
        # in id order: the jobs of one chunk decompress it once (LazyState._chunk)
        part = LedgerState(lazy.position, {s: lazy.job(s) for s in sorted({r[1] for r in rows}) if lazy.holds(s)})
        fold_into(part, rows)
        lazy.update(part.jobs)
    lazy.position = target
    return lazy


def tied_snapshot(store: Reader, name: str, code_version: str, position: int, state: bytes) -> Snapshot:
    """`state` (folded up to `position`) sealed as a snapshot, tied to the event there."""
    event_hash = GENESIS_HASH if position == 0 else store.hash_at(position)
    if event_hash is None:
        raise ValueError(f"no event at seq {position} to tie a snapshot to")
    return Snapshot.seal(name, code_version, position, event_hash, state)


def make_snapshots(store: Reader, state: LedgerState, settled: Iterable[tuple[JobState, bytes]] = ()) -> list[Snapshot]:
    """`state` (and `settled`: encode_state's) sealed as a job-state snapshot and its parts,
    each tied to the event at its position: the parts first, the manifest last (the order
    to save them in: a manifest is never stored before what it names)."""
    encoded = encode_state(state, settled)
    code = code_version()
    parts = [tied_snapshot(store, part_name(SNAPSHOT_NAME, part), code, state.position, data)
             for part, data in encoded.parts.items()]
    return [*parts, tied_snapshot(store, SNAPSHOT_NAME, code, state.position, encoded.manifest)]


def save_snapshot(store: SnapshotReader, state: LedgerState, settled: Iterable[tuple[JobState, bytes]] = ()) -> None:
    for snap in make_snapshots(store, state, settled):
        store.save_snapshot(snap)


def snapshot_due(store: SnapshotReader, name: str, code_version: str, position: int, every: int = SNAPSHOT_EVERY) -> bool:
    """The policy for every kind: a state at `position` is saved when `every` events or more
    passed since the newest snapshot of that name and code, or when that one fails its checks."""
    last = store.load_snapshot(name, code_version, at_most=position)
    since = position - (last.position if last else 0)
    return not (since < every and (last is None or snapshot_problem(store, last) is None))


def state_due(store: SnapshotReader, position: int, every: int = SNAPSHOT_EVERY) -> bool:
    """A job-state snapshot at `position` is due (snapshot_due; only its manifest is fetched)."""
    return snapshot_due(store, SNAPSHOT_NAME, code_version(), position, every)


def maybe_snapshot(store: SnapshotReader, state: LedgerState, every: int = SNAPSHOT_EVERY, *,
                   settled: Iterable[tuple[JobState, bytes]] = ()) -> bool:
    """Save `state` (and `settled`: encode_state's) when a job-state snapshot is due
    (state_due). Call it after a replay at the head; returns whether it saved."""
    if not state_due(store, state.position, every):
        return False
    save_snapshot(store, state, settled)
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
