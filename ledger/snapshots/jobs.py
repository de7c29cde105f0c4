"""The job-state snapshot's encoding: each job's piece (its `ledger list --json` text) in
compressed chunks, its rows (every job's fields as plain tuples) and its columns
(ledger.snapshots.columns), stored as a manifest and two parts. Decoded by
ledger.snapshots.lazy; checked and loaded by ledger.replay.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import operator
import pickle
import typing
from collections.abc import Callable, Collection, Iterable
from typing import Any, NamedTuple

import lz4.block
import msgspec

from ledger import fold, jsontext
from ledger.fold import JobState, LedgerState
from ledger.snapshots.columns import Columns, ColumnsBuilder, JobIndex, job_id_of
from ledger.snapshots.plain import load_plain, no_cyclic_gc

# Each job's state is kept as its own piece: the text `ledger list --json` prints for it
# (jsontext.item of JobState.to_dict), in chunks of jobs in id order, each chunk compressed
# (LZ4: 49 MB of text at 20k jobs keeps in 4.4 MB and comes back in ~15 ms). Beside them, a
# small index says of every job what readers select on (`JobIndex`, stored as columns:
# `Columns`), so a reader decodes only the jobs it shows (`LazyState`): `ledger tpus` the
# TPUs' holders, `ledger list --owner` one user's jobs, and `ledger list --json` writes the
# pieces as they are. Those who decode every job (reconciler, dashboard) load the jobs'
# fields as plain tuples (LZ4-compressed). Every container is a pickle of plain values
# (tuples, lists, str, bytes), read by an unpickler that refuses every global: nothing in
# a snapshot can name code to run.
#
# A snapshot is stored in three parts, each a snapshot row of its own at the same position
# and code, so each reader fetches and hashes only what it reads (at 118,956 jobs: columns
# 6 MB, pieces 25 MB, rows 19 MB): the snapshot named SNAPSHOT_NAME (ledger.replay) holds the
# columns and each other part's SHA-256 (the manifest: what the due check and every reader
# load), and
# `{SNAPSHOT_NAME}.pieces` and `.rows` hold the chunks and the rows. Lazy readers and the
# reconciler's start read the pieces, the dashboard the rows, verify both.
MAGIC = b"TLS4"
# Jobs per compressed chunk: a reader of one job decompresses its chunk. LZ4 finds matches
# within 64 KB, so chunks larger than ~64 jobs (~140 KB of text) hardly compress better: at
# 118,956 jobs, 64 a chunk keep in 25.9 MB against 24.9 at 256, and the 500 jobs a tail of
# 5,000 events touches decompress in 14 ms against 69.
CHUNK = 64
PIECES, ROWS = "pieces", "rows"


def code_version() -> str:
    """What job-state snapshots are tied to: the fold's code (`fold.code_version()`) and this
    encoding (`MAGIC`). A snapshot of other code, or of the earlier encoding, is never loaded."""
    return hashlib.sha256(f"{fold.code_version()}/{MAGIC.decode()}".encode()).hexdigest()[:16]


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
FIELDS = tuple(f.name for f in dataclasses.fields(JobState))
_FIELDS_OF = operator.attrgetter(*FIELDS)
_TIMES_AT = FIELDS.index("times")


def shared_fields(job: JobState, strings: dict[str, str], seen: dict[bytes, Any]) -> tuple:
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
    own = ((job, None) for job in sorted(state.jobs.values(), key=job_id_of))
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
    columns = ColumnsBuilder()
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
        rows.append(shared_fields(job, strings, seen))
        if len(rows) % CHUNK == 0:
            chunks.append(lz4.block.compress(bytes(text + b"]")))
            text = bytearray(b"[")
    if len(text) > 1:
        chunks.append(lz4.block.compress(bytes(text + b"]")))
    parts = {PIECES: pickle.dumps(chunks, protocol=5), ROWS: lz4.block.compress(pickle.dumps(rows, protocol=5))}
    digests = {part: _digest(data) for part, data in parts.items()}
    return Encoded(MAGIC + pickle.dumps((position, FIELDS, columns.c.packed(), digests), protocol=5), parts)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# msgspec builds the dataclass as it parses (half the time of JobState(**dict)), and refuses
# a piece whose value has not the field's type.
_ONE = msgspec.json.Decoder(JobState)


class Manifest(NamedTuple):
    position: int
    columns: Columns
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
        if not isinstance(chunks, list) or len(chunks) != -(-len(self.columns.ids) // CHUNK) \
                or not set(map(type, chunks)) <= {bytes}:
            return None
        return chunks


def manifest(blob: bytes) -> Manifest | None:
    """None when the blob is not a snapshot this code can read (it is then ignored)."""
    if not blob.startswith(MAGIC):
        return None
    try:
        position, names, columns, digests = load_plain(blob, len(MAGIC))
        if tuple(names) != FIELDS or not isinstance(digests, dict) or set(digests) != {PIECES, ROWS}:
            return None
        c = Columns.unpacked(columns)
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError, IndexError):
        return None
    return None if c is None else Manifest(position, c, digests)
