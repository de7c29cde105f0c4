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
import threading
import typing
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeVar, overload

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
# fields as plain tuples (LZ4-compressed). Every container is a pickle of plain values
# (tuples, lists, str, bytes), read by an unpickler that refuses every global: nothing in
# a snapshot can name code to run.
#
# A snapshot is stored in three parts, each a snapshot row of its own at the same position
# and code, so each reader fetches and hashes only what it reads (at 118,956 jobs: columns
# 6 MB, pieces 25 MB, rows 19 MB): the snapshot named SNAPSHOT_NAME holds the columns and
# each other part's SHA-256 (the manifest: what the due check and every reader load), and
# `{SNAPSHOT_NAME}.pieces` and `.rows` hold the chunks and the rows. Lazy readers and the
# reconciler's start read the pieces, the dashboard the rows, verify both.
_MAGIC = b"TLS4"
# Jobs per compressed chunk: a reader of one job decompresses its chunk. LZ4 finds matches
# within 64 KB, so chunks larger than ~64 jobs (~140 KB of text) hardly compress better: at
# 118,956 jobs, 64 a chunk keep in 25.9 MB against 24.9 at 256, and the 500 jobs a tail of
# 5,000 events touches decompress in 14 ms against 69.
_CHUNK = 64
PIECES, ROWS = "pieces", "rows"


def code_version() -> str:
    """What job-state snapshots are tied to: the fold's code (`fold.code_version()`) and this
    encoding (`_MAGIC`). A snapshot of other code, or of the earlier encoding, is never loaded."""
    return hashlib.sha256(f"{fold.code_version()}/{_MAGIC.decode()}".encode()).hexdigest()[:16]


class InChunk(NamedTuple):
    """A job's piece where a snapshot keeps it: in a compressed chunk (shared by the chunk's
    jobs), from `start` to `end` of its text. A shelf holds a job loaded from a snapshot so,
    not compressed again (0.65 s at 108,756 settled jobs)."""

    chunk: bytes
    start: int
    end: int

    def plain(self) -> bytes:
        """The whole chunk, decompressed."""
        return lz4.block.decompress(self.chunk)

    def text(self, plain: bytes | None = None) -> bytes:
        """The job's piece; `plain`: the chunk already decompressed (`plain()`), for a reader
        that walks the chunk's jobs in turn."""
        return (self.plain() if plain is None else plain)[self.start:self.end]


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
    states never edit a field in place (fold._clone copies `times`, the one exception).
    Leaves are shared where they lie, not by a call each (a snapshot of 118,956 jobs makes
    ~60 a job: 2.5 -> 2.0 s)."""
    kind = type(value)
    if kind is str:
        return strings.setdefault(value, value)
    if kind is not dict and kind is not list:
        return value
    key = _key(value)
    found = seen.get(key)
    if found is not None:
        return found
    keep = strings.setdefault
    out: Any
    if kind is dict:
        out = {}
        for k, v in value.items():
            inner = type(v)
            out[keep(k, k) if type(k) is str else k] = keep(v, v) if inner is str else \
                _shared(v, strings, seen) if inner is dict or inner is list else v
    else:
        out = [keep(v, v) if type(v) is str else _shared(v, strings, seen) for v in value]
    seen[key] = out
    return out


# A job's fields in order: a row of the snapshot's rows part holds them so.
_FIELDS = tuple(f.name for f in dataclasses.fields(JobState))
_FIELDS_OF = operator.attrgetter(*_FIELDS)
_TIMES_AT = _FIELDS.index("times")


def _shared_fields(job: JobState, strings: dict[str, str], seen: dict[bytes, Any]) -> tuple:
    """The job's fields in order, values shared (`_shared`) but its own `times`: the field a
    transition edits in place, so each job keeps a dict of its own."""
    values = list(_FIELDS_OF(job))
    keep = strings.setdefault
    for at, value in enumerate(values):
        kind = type(value)
        if kind is str:
            values[at] = keep(value, value)
        elif at == _TIMES_AT:
            values[at] = {keep(k, k): keep(v, v) for k, v in value.items()}
        elif kind is dict or kind is list:
            values[at] = _shared(value, strings, seen)
    return tuple(values)


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

    ids: Sequence[str]  # a list while built, _Names when loaded
    owners: list[str]
    owner_of: array
    states: list[str]
    state_of: array
    starts: array
    ends: array
    notable: dict[int, tuple[str | None, bool, str | None]]  # place -> held, held_shared, wants_shared
    released: Sequence[str]
    released_by: array

    @classmethod
    def empty(cls) -> _Columns:
        return cls([], [], array(_UINT32), [], array(_UINT32), array(_UINT32), array(_UINT32), {}, [], array(_UINT32))

    def packed(self) -> tuple:
        return (*_Names.packed(self.ids), self.owners, _packed(self.owner_of), self.states, _packed(self.state_of),
                _packed(self.starts), _packed(self.ends), self.notable, *_Names.packed(self.released),
                _packed(self.released_by))

    @classmethod
    def unpacked(cls, stored: tuple) -> _Columns | None:
        """The columns as stored (`packed`); None unless they are whole and consistent."""
        ids_text, id_starts, owners, owner_of, states, state_of, starts, ends, notable, released_text, \
            released_starts, released_by = stored
        ids, released = _Names.unpacked(ids_text, id_starts), _Names.unpacked(released_text, released_starts)
        if ids is None or released is None:
            return None
        # The ids' order (bisect finds a job by it) is checked by verify (LazyState.decoded):
        # checking it here cost every reader 7 ms at 118,956 jobs.
        c = cls(ids, owners, _unpacked(owner_of), states, _unpacked(state_of), _unpacked(starts), _unpacked(ends),
                notable, released, _unpacked(released_by))
        n = len(c.ids)
        if not all(isinstance(x, list) for x in (owners, states)) or not isinstance(notable, dict) \
                or any(len(col) != n for col in (c.owner_of, c.state_of, c.starts, c.ends)) \
                or len(c.released_by) != len(released) \
                or not all(map(operator.le, c.released_by, itertools.islice(c.released_by, 1, None))):
            return None
        if not (_codes_below(owner_of, len(owners)) and _codes_below(state_of, len(states))):
            return None
        if any(not (isinstance(i, int) and 0 <= i < n and isinstance(v, tuple) and len(v) == 3) for i, v in notable.items()) \
                or (released_by and c.released_by[-1] >= n):  # in place order: the last is the largest
            return None
        return c


_SEP = "\0"  # no job id nor TPU name holds it (ledger.spec.names); _Names.packed refuses one that would


class _Names(Sequence[str]):
    """A long list of names (a snapshot's ids, its latest releases) kept as one text, each
    name followed by a separator, and where each starts: a name is made a str when asked,
    so a reader that bisects for a few ids never splits all 119k (unpickling them as a list
    took 19 ms, splitting the text 11). Iterating splits it, and so does the 4,096th lookup
    by place (~240 bisects, ~3 ms): a reader asking for many jobs splits once."""

    __slots__ = ("_text", "_starts", "_asked", "_list")
    _SPLIT_AFTER = 4_096  # lookups by place (0.6 us each; a bisect of 119k makes 17)

    def __init__(self, text: str, starts: array) -> None:
        self._text, self._starts = text, starts  # len(starts) == len(self) + 1
        self._asked = 0
        self._list: list[str] | None = None

    @staticmethod
    def packed(names: Sequence[str]) -> tuple[str, bytes]:
        text = "".join(name + _SEP for name in names)
        if text.count(_SEP) != len(names):
            raise ValueError("a job id or TPU name holds a NUL character: it cannot be kept in a snapshot")
        return text, _packed(itertools.accumulate((len(n) + 1 for n in names), initial=0))

    @classmethod
    def unpacked(cls, text: Any, starts: Any) -> _Names | None:
        """None unless `text` and `starts` are a packed list of names."""
        if not isinstance(text, str) or not isinstance(starts, bytes) or len(starts) % 4:
            return None
        at = _unpacked(starts)
        if not at or at[0] != 0 or at[-1] != len(text) or text.count(_SEP) != len(at) - 1:
            return None
        return cls(text, at)

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if self._list is not None:
            return self._list[i]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        self._asked += 1
        if self._asked > self._SPLIT_AFTER:
            self._list = self._text.split(_SEP)[:-1]
            return self._list[i]
        if i < 0:
            i += len(self)
            if i < 0:
                raise IndexError(i)
        return self._text[self._starts[i]:self._starts[i + 1] - 1]  # past the end: IndexError

    def __iter__(self) -> Iterator[str]:
        return iter(self._list if self._list is not None else self._text.split(_SEP)[:-1])

    def consistent(self) -> bool:
        """Each name starts where the text's separators say (verify: lookups by place use
        the starts, iteration the separators)."""
        return list(itertools.accumulate((len(n) + 1 for n in self._text.split(_SEP)[:-1]), initial=0)) \
            == self._starts.tolist()

    def sorted_list(self) -> Sequence[str]:
        """What to bisect: the names split, once they are (a bisect of a list runs at C
        speed, 17x faster than through __getitem__), else these."""
        return self._list if self._list is not None else self


def _place(names: Sequence[str], name: str) -> int | None:
    """Where `name` is in `names` (in order), None if it is not."""
    if isinstance(names, _Names):
        names = names.sorted_list()
    i = bisect.bisect_left(names, name)
    return i if i < len(names) and names[i] == name else None


def _codes_below(data: bytes, n: int) -> bool:
    """Every code in `data` (packed, `_packed`) is below `n`. A lab has fewer than 256 owners
    and states: then each code's three high bytes are 0 and its low byte one of range(n),
    checked at C speed (max() over 119k codes took 5 ms a column)."""
    if not isinstance(data, bytes):
        return False
    if n > 256:
        return not data or max(_unpacked(data)) < n
    high = data[1::4] + data[2::4] + data[3::4]
    return high.count(0) == len(high) and not data[0::4].translate(None, bytes(range(n)))


class _ColumnsBuilder:
    """Columns made job by job, in id order, as `_encode_state` walks."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._released: list[str] = []
        self.c = _Columns.empty()._replace(ids=self._ids, released=self._released)
        self._owner: dict[str, int] = {}
        self._state: dict[str, int] = {}

    def add(self, entry: JobIndex, start: int, end: int) -> None:
        c, i = self.c, len(self._ids)
        self._ids.append(entry.id)
        c.owner_of.append(_code(self._owner, c.owners, entry.owner))
        c.state_of.append(_code(self._state, c.states, entry.state))
        c.starts.append(start)
        c.ends.append(end)
        if entry.held is not None or entry.wants_shared is not None:
            c.notable[i] = (entry.held, entry.held_shared, entry.wants_shared)
        for name in entry.released:
            self._released.append(name)
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


class Encoded(NamedTuple):
    """A job-state snapshot's content: the manifest (the snapshot's own state) and its parts'."""

    manifest: bytes
    parts: dict[str, bytes]  # PIECES, ROWS


# A part's content by its name (PIECES, ROWS), or None when it is not there.
Parts = Callable[[str], bytes | None]


class SnapshotPartError(ValueError):
    """A part of a snapshot is missing or is not the one its manifest names."""


def part_name(name: str, part: str) -> str:
    """The name a part of snapshot `name` is stored under."""
    return f"{name}.{part}"


def encode_state(state: LedgerState, settled: Iterable[tuple[JobState, bytes]] = ()) -> Encoded:
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


def lines_decoder(names: Collection[str]) -> msgspec.json.Decoder:
    """A decoder of a list of jobs' pieces into structs of only the JobState fields `names`,
    with JobState's own types and defaults. A table of every job reads a few fields; the
    spec and the rest are then skipped, not built: 118,956 jobs decode in 0.3 s, not 3.1 s."""
    return msgspec.json.Decoder(list[_fields_struct(names)])  # type: ignore[index]


def fields_decoder(names: Collection[str]) -> msgspec.json.Decoder:
    """`lines_decoder`'s, of one job's piece."""
    return msgspec.json.Decoder(_fields_struct(names))


def _fields_struct(names: Collection[str]) -> type[msgspec.Struct]:
    """A struct of only the JobState fields `names`, with JobState's own types and defaults."""
    hints = typing.get_type_hints(JobState)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for f in dataclasses.fields(JobState):
        if f.name not in names:
            continue
        if f.default is not dataclasses.MISSING:
            fields.append((f.name, hints[f.name], f.default))
        elif f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, hints[f.name], msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, hints[f.name]))
    if len(fields) != len(set(names)):
        raise ValueError(f"not fields of a job's state: {sorted(set(names) - {f[0] for f in fields})}")
    return msgspec.defstruct("JobFields", fields)


def _encode_state(position: int, by_id: Iterable[tuple[JobState, bytes | None]]) -> Encoded:
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
    parts = {PIECES: pickle.dumps(chunks, protocol=5), ROWS: lz4.block.compress(pickle.dumps(rows, protocol=5))}
    digests = {part: _digest(data) for part, data in parts.items()}
    return Encoded(_MAGIC + pickle.dumps((position, _FIELDS, columns.c.packed(), digests), protocol=5), parts)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# msgspec builds the dataclass as it parses (half the time of JobState(**dict)), and refuses
# a piece whose value has not the field's type.
_ONE = msgspec.json.Decoder(JobState)


_job_id: Callable[[_OwnedAndStated], str] = operator.attrgetter("id")  # a sort key of 118,956 jobs: no Python call each


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
                 rows: Callable[[], bytes] | None = None) -> None:
        self.position = position
        self._c = columns or _Columns.empty()
        self._chunks = chunks or []
        # every job's fields, in the columns' order (an LZ4-compressed pickle), fetched when decoded
        self._rows = rows
        # The chunk decompressed last: readers go in id order (chunk by chunk), and keeping
        # every chunk they passed (49 MB at 20,087 jobs) cost more in fresh pages than
        # decompressing one twice.
        self._plain: tuple[int, bytes] = (-1, b"")
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
        return _place(self._c.ids, job_id)

    def _chunk(self, n: int) -> bytes:
        if self._plain[0] != n:
            self._plain = (n, lz4.block.decompress(self._chunks[n]))
        return self._plain[1]

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

    def lines(self, ids: list[str], decoder: msgspec.json.Decoder) -> list[Any]:
        """The jobs `ids` (in id order, `select`) as `decoder` (lines_decoder) reads their
        pieces: a few fields of each, from the runs of pieces `texts` yields."""
        found: list[Any] = []
        for text in self.texts(ids):
            found += decoder.decode(b"[" + text + b"]")
        return found

    def texts(self, ids: list[str]) -> Iterator[bytes | memoryview]:
        """The jobs' items of `ledger list --json` (jsontext.item of each state), `ids` in
        id order (`select`), for jsontext.write_list: a run of jobs stored side by side
        comes as one slice; every job of an unchanged snapshot, as its chunks."""
        if len(ids) == len(self._c.ids) + len(self._new):  # all of them (`ids` are distinct jobs it holds)
            yield from self._every_text()
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

    def _every_text(self) -> Iterator[bytes | memoryview]:
        """`texts` of every job, in id order: the snapshot's chunks as they are, each job
        folded since put in its place (a job it holds replaced, a new one inserted). Walks
        places, not ids: a bisect for each of 20,087 ids was 60 % of `ledger list --json`'s
        own time with a tail of 1,000 jobs."""
        replaced: dict[int, str] = {}
        inserted: dict[int, list[str]] = {}  # the place a new job goes before -> their ids
        names = self._c.ids.sorted_list() if isinstance(self._c.ids, _Names) else self._c.ids
        for job_id in self._changed:
            i = self._at(job_id)
            if i is None:
                inserted.setdefault(bisect.bisect_left(names, job_id), []).append(job_id)
            else:
                replaced[i] = job_id
        at = 0  # the next place to write
        for mark in sorted(replaced.keys() | inserted.keys()):
            yield from self._span(at, mark)
            for job_id in sorted(inserted.get(mark, ())):
                yield jsontext.item(self.job(job_id).to_dict())
            at = mark
            if mark in replaced:
                yield jsontext.item(self.job(replaced[mark]).to_dict())
                at += 1
        yield from self._span(at, len(self._c.ids))

    def _span(self, first: int, end: int) -> Iterator[memoryview]:
        """The pieces of the jobs at places [first, end), one slice a chunk."""
        starts, ends = self._c.starts, self._c.ends
        while first < end:
            n = first // _CHUNK
            last = min(end, (n + 1) * _CHUNK) - 1
            yield memoryview(self._chunk(n))[starts[first]:ends[last]]
            first = last + 1

    def pieces(self) -> Iterator[tuple[str, memoryview, InChunk]]:
        """Every job's id, piece and where it lies as the snapshot holds them (not the jobs
        folded since), a chunk at a time in the chunks' order (`_chunk`: only the chunk at hand
        is kept), for a reader that takes each job once."""
        text = memoryview(b"")
        starts, ends = self._c.starts, self._c.ends
        for i, job_id in enumerate(self._c.ids):
            n = i // _CHUNK
            if i % _CHUNK == 0:
                text = memoryview(self._chunk(n))
            start, end = starts[i], ends[i]
            yield job_id, text[start:end], InChunk(self._chunks[n], start, end)

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

    def unended_or_holding(self) -> list[str]:
        """The ids of the jobs that have not ended or still hold a TPU (or ask for a shared
        one), in id order: the jobs admission reads (the reconciler's live view holds these;
        the rest are settled, reconciler.live)."""
        c = self._c
        live = {code for code, state in enumerate(c.states) if state not in TERMINAL}
        found = {job_id for job_id, code in zip(c.ids, c.state_of, strict=True) if code in live}
        found.update(c.ids[i] for i in c.notable)
        if self._changed:
            found.difference_update(self._changed)
            found.update(x.id for x in self._changed.values()
                         if not x.terminal or x.held is not None or x.wants_shared is not None)
        return sorted(found)

    def holders(self) -> list[JobIndex]:
        """The JobIndex of every job that holds a TPU or asks for a shared one."""
        kept = [i for i in self._c.notable if self._kept(i)]
        released = self._released_at(kept)
        return [self._entry(i, released) for i in kept] + \
            [x for x in self._changed.values() if x.held is not None or x.wants_shared is not None]

    def _released_at(self, places: Iterable[int] | None = None) -> dict[int, list[str]]:
        """The latest releases' names of the jobs at `places` (None: of every job), by place."""
        c = self._c
        out: dict[int, list[str]] = {}
        if places is None:
            for i, name in zip(c.released_by, c.released, strict=True):
                out.setdefault(i, []).append(name)
            return out
        for i in places:  # released_by is in place order (`_Columns.unpacked` checks it)
            lo = bisect.bisect_left(c.released_by, i)
            hi = bisect.bisect_right(c.released_by, i, lo)
            if lo < hi:
                out[i] = c.released[lo:hi]
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
        keep), from the snapshot's rows. `check`: raise ValueError unless the columns and
        each job's text say what its row says (`difference`)."""
        found: dict[str, JobState] = {}
        if self._c.ids:
            found = {row[0]: JobState(*row) for row in self._plain_rows()}
        found.update((i, self._jobs[i]) for i in self._changed)
        jobs = {i: found[i] for i in (*self._c.ids, *self._new)}
        if check:
            problem = self.difference(jobs)
            if problem is not None:
                raise ValueError(problem)
        return LedgerState(self.position, jobs)

    def _plain_rows(self) -> list[tuple]:
        """The snapshot's rows: every job's fields as a plain tuple, in the columns' order."""
        if self._rows is None:
            raise ValueError("the snapshot was read without its rows")
        rows = load_plain(lz4.block.decompress(self._rows()))
        if [row[0] for row in rows] != list(self._c.ids):
            raise ValueError("the rows and the columns hold different jobs")
        return rows

    def difference(self, jobs: Mapping[str, JobState]) -> str | None:
        """Where this snapshot as stored (nothing folded since) does not hold `jobs`, said
        plainly; None when its rows, its columns and every job's text say just what `jobs`
        say, so that every reader of it (whole, lazy, by column) reads them. Job by job in
        id order, each text decoded and let go: verify compares a snapshot of 118,956 jobs
        with its own fold of the events so, without a second copy of every job beside it.
        ValueError (and the errors of `_UNREADABLE`) when its rows do not decode."""
        if self._changed:
            raise ValueError("jobs were folded since the snapshot: it is not as stored")
        c = self._c
        rows = self._plain_rows() if c.ids else []
        if not all(map(operator.lt, c.ids, itertools.islice(c.ids, 1, None))):
            return "its job ids are not in order (a reader bisects them)"
        if not all(names.consistent() for names in (c.ids, c.released) if isinstance(names, _Names)):
            return "its names do not start where its text says"
        if len(c.ids) != len(jobs) or list(c.ids) != sorted(jobs):
            held = set(c.ids)
            first = min(held.symmetric_difference(jobs))
            return f"it holds job {first}, which the events do not" if first in held else f"job {first} is missing from it"
        fields_of, released = operator.attrgetter(*_FIELDS), self._released_at()
        for i, ((job_id, piece, _), row) in enumerate(zip(self.pieces(), rows, strict=True)):
            job = jobs[job_id]
            if row != fields_of(job):
                return _field_difference(job_id, row, job)
            try:
                told = job_from_text(piece)
            except msgspec.DecodeError as exc:  # ValidationError too
                return f"job {job_id}: its text does not decode ({exc})"
            if told != job:
                return f"job {job_id}: its text does not say what its row says"
            if self._entry(i, released) != JobIndex.of(job):
                return f"job {job_id}: its columns do not say what its row says"
        return None


def _field_difference(job_id: str, row: tuple, job: JobState) -> str:
    """The first field of a job's row that is not what `job` says, said plainly."""
    if len(row) != len(_FIELDS):
        return f"job {job_id}: its row has {len(row)} fields, not {len(_FIELDS)}"
    name, a, b = next((n, a, b) for n, a, b in zip(_FIELDS, row, operator.attrgetter(*_FIELDS)(job), strict=True)
                      if a != b)
    return f"job {job_id}: {name} is {_short(a)} in it, {_short(b)} from the events"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Manifest(NamedTuple):
    position: int
    columns: _Columns
    digests: dict[str, str]  # each part's SHA-256

    def part(self, parts: Parts, part: str) -> bytes:
        """The part's content, once it is the one this manifest names; SnapshotPartError if not."""
        data = parts(part)
        if data is None:
            raise SnapshotPartError(f"its part {part!r} is missing")
        if _digest(data) != self.digests[part]:
            raise SnapshotPartError(f"its part {part!r} is not the one it names (altered, damaged or of another save)")
        return data

    def chunks(self, parts: Parts) -> list[bytes] | None:
        data = self.part(parts, PIECES)
        try:
            chunks = load_plain(data)
        except (pickle.UnpicklingError, ValueError, TypeError, EOFError, IndexError):
            return None
        if not isinstance(chunks, list) or len(chunks) != -(-len(self.columns.ids) // _CHUNK) \
                or not set(map(type, chunks)) <= {bytes}:
            return None
        return chunks


def _manifest(blob: bytes) -> _Manifest | None:
    """None when the blob is not a snapshot this code can read (it is then ignored)."""
    if not blob.startswith(_MAGIC):
        return None
    try:
        position, names, columns, digests = load_plain(blob, len(_MAGIC))
        if tuple(names) != _FIELDS or not isinstance(digests, dict) or set(digests) != {PIECES, ROWS}:
            return None
        c = _Columns.unpacked(columns)
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError, IndexError):
        return None
    return None if c is None else _Manifest(position, c, digests)


def decode_lazy(blob: bytes, parts: Parts) -> LazyState | None:
    """The snapshot's columns and pieces (its rows fetched only if decoded whole); None when
    it is not a snapshot this code can read (it is then ignored). SnapshotPartError when a
    part is missing or not the one it names."""
    m = _manifest(blob)
    chunks = None if m is None else m.chunks(parts)
    if m is None or chunks is None:
        return None
    return LazyState(m.position, m.columns, chunks, lambda: m.part(parts, ROWS))


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Folding and decoding make no reference cycles but millions of containers, which set
    off collections of the whole heap over and over (the snapshot's 350k containers took
    2.5x as long to load with the collector on). Freed memory is still freed at once.
    Counted across threads (the dashboard folds on several): the collector is back on when
    the last one leaves, as it was when the first came; one thread's exit never turns it on
    under another, nor leaves it off for good."""
    global _gc_holders, _gc_was_on
    with _gc_lock:
        if _gc_holders == 0:
            _gc_was_on = gc.isenabled()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_on:
                gc.enable()


_gc_lock = threading.Lock()
_gc_holders = 0  # threads (or nested calls) inside no_cyclic_gc
_gc_was_on = False


def load_plain(data: bytes, start: int = 0) -> Any:
    """Unpickle plain containers only (every snapshot kind's decoder uses this), from `start`
    on (past a magic: a slice would copy the whole blob first); raises
    pickle.UnpicklingError on anything that names code."""
    source = io.BytesIO(data)  # shares `data`, no copy
    source.seek(start)
    return _PlainUnpickler(source).load()


def decode_state(blob: bytes, parts: Parts, check: bool = False) -> LedgerState | None:
    """Every job's state in the snapshot `blob` (and its rows; its pieces too when `check`);
    None when it is not a snapshot this code can read (it is then ignored).
    SnapshotPartError when a part is missing or not the one it names. `check`:
    LazyState.decoded's."""
    m = _manifest(blob)
    if m is None:
        return None
    chunks = m.chunks(parts) if check else []
    if chunks is None:
        return None
    rows = m.part(parts, ROWS)
    try:
        return LazyState(m.position, m.columns, chunks, lambda: rows).decoded(check)
    except _UNREADABLE:
        return None


def state_difference(blob: bytes, parts: Parts, position: int, jobs: Mapping[str, JobState]) -> str | None:
    """Why the job-state snapshot `blob` does not hold `jobs` at `position`
    (`LazyState.difference`), or None (verify's check of a snapshot against its walk's fold
    of the events). SnapshotPartError when a part is missing or not the one it names."""
    m = _manifest(blob)
    chunks = None if m is None else m.chunks(parts)
    if m is None or chunks is None or m.position != position:
        return "its state does not decode to its position"
    rows = m.part(parts, ROWS)
    try:
        return LazyState(m.position, m.columns, chunks, lambda: rows).difference(jobs)
    except _UNREADABLE as exc:
        return f"its state does not decode ({type(exc).__name__}: {exc})"


# What reading a snapshot's parts can raise when they are not what this code wrote
# (msgspec's ValidationError is a DecodeError).
_UNREADABLE = (msgspec.DecodeError, lz4.block.LZ4BlockError, pickle.UnpicklingError, TypeError, KeyError,
               IndexError, ValueError, EOFError)


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
                state.jobs[job_id] = JobState(*_shared_fields(job, strings, seen))
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
