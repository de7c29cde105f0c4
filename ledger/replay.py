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

import bisect
import contextlib
import dataclasses
import gc
import hashlib
import heapq
import io
import itertools
import logging
import operator
import pickle
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeVar

import lz4.block
import msgspec

from ledger import fold, jsontext
from ledger.errors import UsageError
from ledger.events import GENESIS_HASH, format_time
from ledger.fold import TERMINAL, JobState, LedgerState
from ledger.store.base import Reader, Snapshot, SnapshotReader

log = logging.getLogger(__name__)

SNAPSHOT_NAME = "ledger"
# Snapshot when this many events have passed since the last one: replay then reads at most
# this many events beyond the snapshot, and a snapshot (~one job's state per job) is cheap.
SNAPSHOT_EVERY = 10_000


# -- snapshot encoding ---------------------------------------------------------------------
# Each job's state is kept as its own piece: the text `ledger list --json` prints for it
# (jsontext.item of JobState.to_dict), in chunks of jobs in id order, each chunk compressed
# (LZ4: 49 MB of text at 20k jobs keeps in 4.4 MB and comes back in ~15 ms). Beside them, a
# small index says of every job what readers select on (`JobIndex`, stored as columns:
# `_Columns`), so a reader decodes only the jobs it shows (`LazyState`): `ledger tpus` the
# TPUs' holders, `ledger list --owner` one user's jobs, and `ledger list --json` writes the
# pieces as they are. Those who decode every job (reconciler, dashboard) load the jobs'
# fields as plain tuples (LZ4-compressed). The container is a pickle of plain values (tuples, lists, str, bytes), read by an unpickler
# that refuses every global: nothing in a snapshot can name code to run.
_MAGIC = b"TLS3"
_CHUNK = 256  # jobs per compressed chunk


def code_version() -> str:
    """What job-state snapshots are tied to: the fold's code (`fold.code_version()`) and this
    encoding (`_MAGIC`). A snapshot of other code, or of the earlier encoding, is never loaded."""
    return hashlib.sha256(f"{fold.code_version()}/{_MAGIC.decode()}".encode()).hexdigest()[:16]


class JobIndex(NamedTuple):
    """What a reader can select a job on without decoding its state."""

    id: str
    owner: str
    state: str
    held: str | None  # the name of the TPU it holds (`JobState.tpu`), None when it holds none
    held_shared: bool  # that TPU is a shared one
    wants_shared: str | None  # the shared TPU its spec asks for, if it asks for one
    released: tuple[str, ...]  # the TPUs of its latest releases (`JobState.released`)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @classmethod
    def of(cls, job: JobState) -> JobIndex:
        tpu = job.tpu
        want = job.spec.get("tpu") or {}
        return cls(job.id, job.owner, job.state, str(tpu.get("name")) if tpu else None, bool(tpu and tpu.get("shared")),
                   str(want.get("name")) if want.get("shared") else None, tuple(str(r[0]) for r in job.released if r))


class _OwnedAndStated(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def state(self) -> str: ...


Chosen = TypeVar("Chosen", bound=_OwnedAndStated)


def choose(items: Iterable[Chosen], *, owner: str | None = None, state: str | None = None) -> list[Chosen]:
    """The jobs of that owner and in that state, in id order: how `ledger list` (over the
    snapshot's index, `LazyState.select`) and the dashboard (over decoded states,
    `readmodels.select_jobs`) choose, from a JobIndex or a JobState alike."""
    if owner is None and state is None:
        chosen = list(items)
    else:
        chosen = [x for x in items if (owner is None or x.owner == owner) and (state is None or x.state == state)]
    chosen.sort(key=_job_id)
    return chosen


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ARG002
        raise pickle.UnpicklingError(f"snapshot refers to {module}.{name}; snapshots hold plain data only")


# What tells equal lists and dicts: their JSON text (faster to make than their pickle: a
# snapshot of 118,956 jobs encoded in 5.8 s instead of 6.8).
_key = msgspec.json.Encoder().encode


def _shared(value: Any, strings: dict[str, str], seen: dict[bytes, Any]) -> Any:
    """`value` with equal strings made one object, and equal lists and dicts too (the same
    JSON text: a state holds JSON values only), so the pickle writes each once and loading makes
    each once. 10k jobs' states repeat most of their content (dict keys, states, failure
    records, the same TPU): 15 MB -> 5 MB, and loading 3x faster. Sharing is safe because
    states never edit a field in place (fold._clone copies `times`, the one exception)."""
    kind = type(value)
    if kind is str:
        return strings.setdefault(value, value)
    if kind is dict or kind is list:
        key = _key(value)
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


def _shared_fields(job: JobState, strings: dict[str, str], seen: dict[bytes, Any]) -> tuple:
    """The job's fields in order, values shared (`_shared`) but its own `times`."""
    return tuple(_shared(getattr(job, n), strings, seen) if n != "times" else _own_times(job.times, strings)
                 for n in _FIELDS)


def _own_times(times: dict[str, str], strings: dict[str, str]) -> dict[str, str]:
    """`times` is the field a transition edits in place: each job keeps a dict of its own."""
    return {strings.setdefault(k, k): strings.setdefault(v, v) for k, v in times.items()}


_UINT32 = next(t for t in "IL" if array(t).itemsize == 4)
_NOTHING_HELD = (None, False, None)


def _packed(values: Iterable[int]) -> bytes:
    """Unsigned 32-bit integers, little-endian whatever the machine (a ledger file moves)."""
    out = array(_UINT32, values)
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def _unpacked(data: bytes) -> array:
    out = array(_UINT32)
    out.frombytes(data)
    if sys.byteorder == "big":
        out.byteswap()
    return out


class _Columns(NamedTuple):
    """What a snapshot says of every job besides its piece, a column per field, so a
    reader loads 119k jobs' worth in milliseconds and looks at only what it selects on:
    the ids (sorted), owner and state as codes into their few distinct values, the pieces'
    places (job i is in chunk i // _CHUNK), and the rare fields where they are set: what
    holders and askers of TPUs hold and ask for (`notable`), and the names of the latest
    releases (flat, each with its job's place)."""

    ids: list[str]
    owners: list[str]
    owner_of: array
    states: list[str]
    state_of: array
    starts: array
    ends: array
    notable: dict[int, tuple[str | None, bool, str | None]]  # place -> held, held_shared, wants_shared
    released: list[str]
    released_by: array

    @classmethod
    def empty(cls) -> _Columns:
        return cls([], [], array(_UINT32), [], array(_UINT32), array(_UINT32), array(_UINT32), {}, [], array(_UINT32))

    def packed(self) -> tuple:
        return (self.ids, self.owners, _packed(self.owner_of), self.states, _packed(self.state_of), _packed(self.starts),
                _packed(self.ends), self.notable, self.released, _packed(self.released_by))

    @classmethod
    def unpacked(cls, stored: tuple) -> _Columns | None:
        """The columns as stored (`packed`); None unless they are whole and consistent."""
        ids, owners, owner_of, states, state_of, starts, ends, notable, released, released_by = stored
        c = cls(ids, owners, _unpacked(owner_of), states, _unpacked(state_of), _unpacked(starts), _unpacked(ends),
                notable, released, _unpacked(released_by))
        n = len(c.ids)
        if not all(isinstance(x, list) for x in (ids, owners, states, released)) or not isinstance(notable, dict) \
                or any(len(col) != n for col in (c.owner_of, c.state_of, c.starts, c.ends)) \
                or len(c.released_by) != len(released) or not set(map(type, ids)) <= {str} \
                or not all(map(operator.lt, ids, itertools.islice(ids, 1, None))):
            return None
        if n and (max(c.owner_of) >= len(owners) or max(c.state_of) >= len(states)):
            return None
        if any(not (isinstance(i, int) and 0 <= i < n and isinstance(v, tuple) and len(v) == 3) for i, v in notable.items()) \
                or (released_by and max(c.released_by) >= n):
            return None
        return c


class _ColumnsBuilder:
    """Columns made job by job, in id order, as `_encode_state` walks."""

    def __init__(self) -> None:
        self.c = _Columns.empty()
        self._owner: dict[str, int] = {}
        self._state: dict[str, int] = {}

    def add(self, entry: JobIndex, start: int, end: int) -> None:
        c, i = self.c, len(self.c.ids)
        c.ids.append(entry.id)
        c.owner_of.append(_code(self._owner, c.owners, entry.owner))
        c.state_of.append(_code(self._state, c.states, entry.state))
        c.starts.append(start)
        c.ends.append(end)
        if entry.held is not None or entry.wants_shared is not None:
            c.notable[i] = (entry.held, entry.held_shared, entry.wants_shared)
        for name in entry.released:
            c.released.append(name)
            c.released_by.append(i)


def _code_in(values: list[str], value: str | None) -> int | None:
    """`value`'s code in a column's distinct `values`: None for no value asked, -1 when no
    job has it."""
    if value is None:
        return None
    return values.index(value) if value in values else -1


def _code(codes: dict[str, int], values: list[str], value: str) -> int:
    code = codes.get(value)
    if code is None:
        code = codes[value] = len(values)
        values.append(value)
    return code


def encode_state(state: LedgerState, settled: Iterable[tuple[JobState, bytes]] = ()) -> bytes:
    """The snapshot of `state`, and of `settled`: jobs kept apart from it with their pieces
    (`job_text`), in id order (the reconciler's shelf, reconciler/shelf.py), read as walked."""
    own = ((job, None) for job in sorted(state.jobs.values(), key=_job_id))
    with no_cyclic_gc():  # the shared values make ~350k containers: 2.0 -> 1.8 s at 20k jobs
        return _encode_state(state.position, heapq.merge(own, settled, key=_first_id))


def _first_id(pair: tuple[JobState, bytes | None]) -> str:
    return pair[0].id


def job_text(job: JobState) -> bytes:
    """A job's piece of a snapshot: its `ledger list --json` item (`job_from_text` reads it)."""
    return jsontext.item(job.to_dict())


def job_from_text(text: bytes | memoryview) -> JobState:
    return _ONE.decode(text)


def _encode_state(position: int, by_id: Iterable[tuple[JobState, bytes | None]]) -> bytes:
    """One walk over the jobs in id order, each with its piece if it has one already: each
    job's piece, columns and row are made at once, so a job decoded for the walk is let
    go at once."""
    columns = _ColumnsBuilder()
    chunks: list[bytes] = []
    # Every job's fields, for those who decode every job (the reconciler, the dashboard):
    # plain tuples with equal values shared, in a pickle of its own that lazy readers never
    # load (faster to load than parsing the texts), LZ4-compressed: at 118,956 jobs 49 MB
    # are 19 MB, which every reader of the snapshot fetches and hashes.
    rows: list[tuple] = []
    strings: dict[str, str] = {}
    seen: dict[bytes, Any] = {}
    text = bytearray(b"[")
    for job, piece in by_id:
        if len(text) > 1:
            text += jsontext.SEPARATOR
        start = len(text)
        text += piece if piece is not None else job_text(job)
        columns.add(JobIndex.of(job), start, len(text))
        rows.append(_shared_fields(job, strings, seen))
        if len(rows) % _CHUNK == 0:
            chunks.append(lz4.block.compress(bytes(text + b"]")))
            text = bytearray(b"[")
    if len(text) > 1:
        chunks.append(lz4.block.compress(bytes(text + b"]")))
    packed_rows = lz4.block.compress(pickle.dumps(rows, protocol=5))
    return _MAGIC + pickle.dumps((position, _FIELDS, columns.c.packed(), chunks, packed_rows), protocol=5)


# msgspec builds the dataclass as it parses (half the time of JobState(**dict)), and refuses
# a piece whose value has not the field's type.
_ONE = msgspec.json.Decoder(JobState)
_FIELDS = tuple(f.name for f in dataclasses.fields(JobState))


def _job_id(job: _OwnedAndStated) -> str:
    return job.id


class LazyState:
    """Every job's state at `position`, decoded job by job as asked: a snapshot's columns and
    pieces, with the jobs the events after it changed (folded, kept decoded). `select` gives
    the ids a listing shows, in id order; `holders` and `releasing` what `ledger tpus`
    chooses on; `job(id)` a job's state; `texts(ids)` their `ledger list --json` items;
    `index` every job's JobIndex (made whole only when asked: verify, tests).

    A snapshot keeps the pieces in id order, `_CHUNK` to a chunk, each chunk's text a JSON
    list whose items are separated as `jsontext.pretty` separates a list's: a run of
    consecutive jobs is one slice of it, written out as it is."""

    def __init__(self, position: int, columns: _Columns | None = None, chunks: list[bytes] | None = None,
                 rows: bytes = b"") -> None:
        self.position = position
        self._c = columns or _Columns.empty()
        self._chunks = chunks or []
        self._rows = rows  # every job's fields, in the columns' order (an LZ4-compressed pickle)
        self._plain: dict[int, bytes] = {}
        self._jobs: dict[str, JobState] = {}  # decoded, or folded since the snapshot
        self._changed: dict[str, JobIndex] = {}  # folded since the snapshot: its columns and piece are stale
        self._new: list[str] = []  # of those, the jobs the snapshot does not hold, in the order they came

    @classmethod
    def of(cls, state: LedgerState) -> LazyState:
        """A state already decoded (a replay without a snapshot), behind the same face."""
        lazy = cls(state.position)
        lazy.update(state.jobs)
        return lazy

    def _at(self, job_id: str) -> int | None:
        """Where the snapshot holds the job (its place in the columns), None if it does not."""
        ids = self._c.ids
        i = bisect.bisect_left(ids, job_id)
        return i if i < len(ids) and ids[i] == job_id else None

    def _chunk(self, n: int) -> bytes:
        text = self._plain.get(n)
        if text is None:
            text = self._plain[n] = lz4.block.decompress(self._chunks[n])
        return text

    def _piece(self, i: int) -> tuple[int, int, int]:
        return i // _CHUNK, self._c.starts[i], self._c.ends[i]

    def holds(self, job_id: str) -> bool:
        """The state knows the job (the snapshot holds it, or an event since made it)."""
        return job_id in self._jobs or self._at(job_id) is not None

    def job(self, job_id: str) -> JobState:
        job = self._jobs.get(job_id)
        if job is None:
            i = self._at(job_id)
            if i is None:
                raise KeyError(job_id)
            n, start, end = self._piece(i)
            job = self._jobs[job_id] = job_from_text(self._chunk(n)[start:end])
        return job

    def jobs(self, ids: Iterable[str]) -> list[JobState]:
        return [self.job(i) for i in ids]

    def texts(self, ids: list[str]) -> Iterator[bytes | memoryview]:
        """The jobs' items of `ledger list --json` (jsontext.item of each state), `ids` in
        id order (`select`), for jsontext.write_list: a run of jobs stored side by side
        comes as one slice; every job of an unchanged snapshot, as its chunks."""
        if not self._changed and len(ids) == len(self._c.ids):  # all of them, in the chunks' order
            for n in range(len(self._chunks)):
                yield memoryview(self._chunk(n))[1:-1]
            return
        run: tuple[int, int, int] | None = None  # chunk, start, end
        for job_id in ids:
            i = None if job_id in self._changed else self._at(job_id)
            at = None if i is None else self._piece(i)
            if run is not None and at is not None and at[0] == run[0] and at[1] == run[2] + len(jsontext.SEPARATOR):
                run = (run[0], run[1], at[2])
                continue
            if run is not None:
                yield memoryview(self._chunk(run[0]))[run[1]:run[2]]
            run = at
            if at is None:
                yield jsontext.item(self.job(job_id).to_dict())
        if run is not None:
            yield memoryview(self._chunk(run[0]))[run[1]:run[2]]

    def pieces(self) -> Iterator[tuple[str, memoryview]]:
        """Every job's id and piece as the snapshot holds them (not the jobs folded since),
        a chunk at a time in the chunks' order; nothing is kept, for a reader that takes
        each job once."""
        text = memoryview(b"")
        for i, job_id in enumerate(self._c.ids):
            n, start, end = self._piece(i)
            if i % _CHUNK == 0:
                text = memoryview(lz4.block.decompress(self._chunks[n]))
            yield job_id, text[start:end]

    def update(self, jobs: dict[str, JobState]) -> None:
        """Jobs folded past the snapshot: they replace what it says of them."""
        self._jobs.update(jobs)
        for job_id, job in jobs.items():
            if job_id not in self._changed and self._at(job_id) is None:
                self._new.append(job_id)
            self._changed[job_id] = JobIndex.of(job)

    def _kept(self, i: int) -> bool:
        """The snapshot's word on the job at `i` still holds (no event since changed it)."""
        return not self._changed or self._c.ids[i] not in self._changed

    def select(self, *, owner: str | None = None, state: str | None = None) -> list[str]:
        """The ids of the jobs of that owner and in that state, in id order."""
        c = self._c
        if owner is None and state is None:  # all of them
            return list(c.ids) if not self._new else sorted([*c.ids, *self._new])
        o, s = _code_in(c.owners, owner), _code_in(c.states, state)
        found = [] if -1 in (o, s) else [job_id for job_id, oc, sc in zip(c.ids, c.owner_of, c.state_of, strict=True)
                                         if (o is None or oc == o) and (s is None or sc == s)]
        if not self._changed:
            return found
        found = [i for i in found if i not in self._changed]
        found += (x.id for x in choose(self._changed.values(), owner=owner, state=state))
        return sorted(found)

    def holders(self) -> list[JobIndex]:
        """The JobIndex of every job that holds a TPU or asks for a shared one."""
        kept = [i for i in self._c.notable if self._kept(i)]
        released = self._released_at(set(kept))
        return [self._entry(i, released) for i in kept] + \
            [x for x in self._changed.values() if x.held is not None or x.wants_shared is not None]

    def _released_at(self, places: set[int] | None = None) -> dict[int, list[str]]:
        """The latest releases' names of the jobs at `places` (None: of every job), by place."""
        out: dict[int, list[str]] = {}
        for i, name in zip(self._c.released_by, self._c.released, strict=True):
            if places is None or i in places:
                out.setdefault(i, []).append(name)
        return out

    def _entry(self, i: int, released: dict[int, list[str]]) -> JobIndex:
        """The snapshot's JobIndex of the job at place `i`."""
        c = self._c
        held, held_shared, wants = c.notable.get(i, _NOTHING_HELD)
        return JobIndex(c.ids[i], c.owners[c.owner_of[i]], c.states[c.state_of[i]], held, held_shared, wants,
                        tuple(released.get(i, ())))

    def releasing(self, names: set[str]) -> set[str]:
        """The ids of the jobs whose latest releases (`JobIndex.released`) name one of `names`."""
        c = self._c
        found = {c.ids[i] for i, name in zip(c.released_by, c.released, strict=True) if name in names and self._kept(i)}
        return found | {x.id for x in self._changed.values() if names.intersection(x.released)}

    @property
    def index(self) -> dict[str, JobIndex]:
        """Every job's JobIndex by id: the snapshot's in id order, then those new since."""
        released = self._released_at()
        index = {job_id: self._entry(i, released) for i, job_id in enumerate(self._c.ids)}
        index.update(self._changed)
        return index

    def decoded(self, check: bool = False) -> LedgerState:
        """Every job decoded, in the index's order (what the reconciler and the dashboard
        keep), from the snapshot's rows. `check` (ledger verify): raise ValueError unless
        the columns and each job's text say what its row says, so a verified snapshot
        vouches for what lazy readers read too."""
        found: dict[str, JobState] = {}
        if self._c.ids:
            rows = load_plain(lz4.block.decompress(self._rows))
            if [row[0] for row in rows] != self._c.ids:
                raise ValueError("the rows and the columns hold different jobs")
            found = {row[0]: JobState(*row) for row in rows}
        found.update((i, self._jobs[i]) for i in self._changed)
        jobs = {i: found[i] for i in (*self._c.ids, *self._new)}
        if check:
            index = self.index
            for i, job in jobs.items():
                if index[i] != JobIndex.of(job) or (i not in self._changed and self.job(i) != job):
                    raise ValueError(f"the index or the text of job {i} does not say what its row says")
        return LedgerState(self.position, jobs)


def decode_lazy(blob: bytes) -> LazyState | None:
    """None when the blob is not a snapshot this code can read (it is then ignored)."""
    if not blob.startswith(_MAGIC):
        return None
    try:
        position, names, columns, chunks, rows = load_plain(blob, len(_MAGIC))
        if tuple(names) != _FIELDS:
            return None
        c = _Columns.unpacked(columns)
        if c is None or len(chunks) != -(-len(c.ids) // _CHUNK) or not isinstance(rows, bytes):
            return None
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError, IndexError):
        return None
    return LazyState(position, c, chunks, rows)


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


def load_plain(data: bytes, start: int = 0) -> Any:
    """Unpickle plain containers only (every snapshot kind's decoder uses this), from `start`
    on (past a magic: a slice would copy the whole blob first); raises
    pickle.UnpicklingError on anything that names code."""
    source = io.BytesIO(data)  # shares `data`, no copy
    source.seek(start)
    return _PlainUnpickler(source).load()


def decode_state(blob: bytes, check: bool = False) -> LedgerState | None:
    """Every job's state in the snapshot `blob`; None when it is not a snapshot this code can
    read (it is then ignored). `check`: LazyState.decoded's."""
    lazy = decode_lazy(blob)
    if lazy is None:
        return None
    try:
        return lazy.decoded(check)
    except (msgspec.DecodeError, lz4.block.LZ4BlockError, pickle.UnpicklingError, TypeError, KeyError, IndexError,
            ValueError, EOFError):  # msgspec's ValidationError too
        return None


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
    return checked_snapshot(store, SNAPSHOT_NAME, code_version(), at_most, decode_state, _position)


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


def load_state_apart(store: SnapshotReader, apart: Callable[[JobState], bool],
                     put: Callable[[JobState, bytes], None]) -> LedgerState | None:
    """`load_state`'s state at the head, less the snapshot's jobs that `apart` picks and the
    events after it do not touch: each of those goes to `put` with its piece (`job_text`)
    instead. Read from the pieces a job at a time, so the whole state is never held at
    once (the reconciler keeps its settled jobs apart: reconciler.shelf). None when there
    is no usable snapshot, or its pieces do not decode: then `load_state` it is (and what
    went to `put` is to be dropped)."""
    head = store.head()
    with no_cyclic_gc():
        lazy = checked_snapshot(store, SNAPSHOT_NAME, code_version(), head, decode_lazy, _position)
        if lazy is None:
            return None
        rows = list(fold_rows(store, lazy.position, head))
        touched = {r[1] for r in rows}
        state = LedgerState(lazy.position)
        strings: dict[str, str] = {}
        seen: dict[bytes, Any] = {}
        try:
            for job_id, text in lazy.pieces():
                job = job_from_text(text)
                if job_id in touched or not apart(job):
                    # shared as a snapshot's rows are: the pass walks these (unshared, 10,200 jobs took it 40% longer)
                    state.jobs[job_id] = JobState(*_shared_fields(job, strings, seen))
                else:
                    put(job, bytes(text))
        except (msgspec.DecodeError, lz4.block.LZ4BlockError, ValueError) as exc:  # msgspec's ValidationError too
            log.warning("the snapshot at seq %s does not decode job by job (%s): loading it whole", lazy.position, exc)
            return None
        state.owned.update(state.jobs)
        fold_into(state, rows)
    state.position = head
    return state


def load_lazy(store: SnapshotReader, until: int | None = None) -> LazyState:
    """Every job's state at `until` (a seq; None = head) as `load_state` gives it, decoded
    only as asked: the newest usable snapshot's index and pieces, and the jobs the events
    after it touch, folded (those events are read once, at most SNAPSHOT_EVERY of them
    when snapshots are kept). Without a usable snapshot, a full replay."""
    head = store.head()
    target = head if until is None else min(until, head)
    with no_cyclic_gc():
        lazy = checked_snapshot(store, SNAPSHOT_NAME, code_version(), target, decode_lazy, _position)
        if lazy is None:
            state = fold_into(LedgerState(), fold_rows(store, 0, target))
            state.position = target
            return LazyState.of(state)
        rows = list(fold_rows(store, lazy.position, target))
        part = LedgerState(lazy.position, {s: lazy.job(s) for s in {r[1] for r in rows} if lazy.holds(s)})
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


def make_snapshot(store: Reader, state: LedgerState, settled: Iterable[tuple[JobState, bytes]] = ()) -> Snapshot:
    """`state` (and `settled`: encode_state's) sealed as a job-state snapshot, tied to the
    event at its position."""
    return tied_snapshot(store, SNAPSHOT_NAME, code_version(), state.position, encode_state(state, settled))


def save_snapshot(store: SnapshotReader, state: LedgerState, settled: Iterable[tuple[JobState, bytes]] = ()) -> None:
    store.save_snapshot(make_snapshot(store, state, settled))


def snapshot_due(store: SnapshotReader, name: str, code_version: str, position: int, every: int = SNAPSHOT_EVERY) -> bool:
    """The policy for every kind: a state at `position` is saved when `every` events or more
    passed since the newest snapshot of that name and code, or when that one fails its checks."""
    last = store.load_snapshot(name, code_version, at_most=position)
    since = position - (last.position if last else 0)
    return not (since < every and (last is None or snapshot_problem(store, last) is None))


def maybe_snapshot(store: SnapshotReader, state: LedgerState, every: int = SNAPSHOT_EVERY, *,
                   settled: Iterable[tuple[JobState, bytes]] = ()) -> bool:
    """Save `state` (and `settled`: encode_state's) when a job-state snapshot is due
    (snapshot_due). Call it after a replay at the head; returns whether it saved."""
    if not snapshot_due(store, SNAPSHOT_NAME, code_version(), state.position, every):
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
