"""Settled jobs, held small.

A lab's ledger keeps every job it ever ran, and a fold of it holds each one as a `JobState`:
~5 KB of dicts and strings a job (its spec most of it), 600 MB at 118,956 jobs. Once a job
has settled (`settled`), no event but a rare revival (`ledger rerun`, `ledger resume`, a
resubmission) touches it again, and a fold only needs it back when one does. A shelf holds
each such job as its encoded text, LZ4-compressed with the first shelved job's text as the
dictionary (one lab's jobs repeat each other's fields): ~300-370 bytes a job, none of them a
container the cyclic collector walks; a job loaded from a snapshot stays where the snapshot's
compressed chunk of 64 jobs holds it (`InChunk`: ~220 bytes a job, no compression at start).
The reconciler (reconciler.shelf), the dashboard (ledger.app.dashboard.live) and `ledger
verify`'s walk (ledger.verify) keep their settled jobs on one, each with the encoding that
suits what it does with them next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import ClassVar, Generic, TypeVar

import lz4.block
import msgspec

from ledger.fold import TERMINAL, JobState, LedgerState
from ledger.replay import load_state, load_state_apart
from ledger.snapshots.jobs import InChunk, job_from_text, job_text
from ledger.snapshots.lazy import LazyState
from ledger.snapshots.plain import no_cyclic_gc
from ledger.store.base import SnapshotReader

_COMPACT = msgspec.json.Encoder().encode


def settled(job: JobState) -> bool:
    """Ended, no TPU held, nothing under way: no pass has anything to do with it, and only a
    revival brings an event for it."""
    return job.state in TERMINAL and job.tpu is None and not job.pending_action


SETTLED_READS = ("state", "tpu", "pending_action")  # the fields `settled` reads


def compact_text(job: JobState) -> bytes:
    """A job as compact JSON (its fields in declaration order), which `job_from_text` reads as
    it reads a snapshot's piece: ~4 us a job where the piece's indented, key-sorted text
    (`job_text`) takes ~13. For a shelf whose texts never leave the process (verify's)."""
    return _COMPACT(job)


class PackedJobs:
    """Jobs by id, each held packed and decoded only when asked (`get`, `take`), and how
    many end in each state (`states`: the metrics count them). `encode` gives a job's text
    (any text `job_from_text` reads): the snapshot piece `job_text` by default, which a
    snapshot can then take as it is. A job put from a snapshot stays in the snapshot's
    compressed chunk (`InChunk`), shared with the chunk's other jobs."""

    # The fields `put` reads of a job given with its piece (`where`), or None for the whole
    # job: a start from a snapshot then decodes a settled job's piece as those fields alone
    # (`LiveJobs.load`, ledger.replay.load_state_apart's `reads`).
    PUT_READS: ClassVar[tuple[str, ...] | None] = ("id", "state")

    def __init__(self, encode: Callable[[JobState], bytes] = job_text) -> None:
        self._encode = encode
        self._packed: dict[str, bytes | InChunk] = {}
        self._dict = b""  # the compression dictionary: the first shelved job's text
        self.states: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._packed)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._packed

    def ids(self) -> Iterator[str]:
        return iter(self._packed)

    def put(self, job: JobState, where: InChunk | None = None) -> None:
        """Shelve `job` (in place of a job of its id shelved before); `where`: its piece in
        a snapshot (`job_text`'s: only with the default `encode`), kept as it lies there."""
        if job.id in self._packed:
            self.take(job.id)
        if where is not None:
            self._packed[job.id] = where
        else:
            text = self._encode(job)
            if not self._dict:
                self._dict = text
            self._packed[job.id] = lz4.block.compress(text, dict=self._dict)
        self._count(job.state, 1)

    def get(self, job_id: str) -> JobState | None:
        """A decoded copy; the job stays shelved."""
        packed = self._packed.get(job_id)
        return None if packed is None else job_from_text(self._text(packed))

    def _text(self, packed: bytes | InChunk) -> bytes:
        return packed.text() if isinstance(packed, InChunk) else lz4.block.decompress(packed, dict=self._dict)

    def take(self, job_id: str) -> JobState | None:
        """The job, decoded and off the shelf (an event came for it)."""
        job = self.get(job_id)
        if job is not None:
            del self._packed[job_id]
            self._count(job.state, -1)
        return job

    def texts(self) -> Iterator[tuple[str, bytes]]:
        """(id, text) of every shelved job, in id order, decompressed one at a time (a
        snapshot's chunk once for its run of jobs)."""
        chunk, plain = b"", b""
        for job_id in sorted(self._packed):
            packed = self._packed[job_id]
            if not isinstance(packed, InChunk):
                yield job_id, lz4.block.decompress(packed, dict=self._dict)
                continue
            if packed.chunk is not chunk:
                chunk, plain = packed.chunk, packed.plain()
            yield job_id, packed.text(plain)

    def copy(self) -> PackedJobs:
        """What is shelved now, for another thread: later puts and takes do not change it
        (the packed texts are shared: bytes never change)."""
        other = PackedJobs(self._encode)
        other._packed, other._dict, other.states = dict(self._packed), self._dict, dict(self.states)
        return other

    def _count(self, state: str, by: int) -> None:
        left = self.states.get(state, 0) + by
        if left:
            self.states[state] = left
        else:
            self.states.pop(state, None)


def shelve(state: LedgerState, shelf: PackedJobs, job: JobState) -> None:
    """Move `job` out of the fold `state` onto `shelf`."""
    shelf.put(job)
    del state.jobs[job.id]
    state.owned.discard(job.id)


def unshelve(state: LedgerState, shelf: PackedJobs, job_id: str) -> JobState | None:
    """Bring a shelved job back into the fold `state` (None: it was not shelved), before the
    fold sees an event for it."""
    job = shelf.take(job_id)
    if job is not None:
        state.jobs[job_id] = job
        state.owned.add(job_id)  # a fresh object: the fold may change it in place
    return job


ShelfT = TypeVar("ShelfT", bound=PackedJobs)


class LiveJobs(Generic[ShelfT]):
    """A fold kept to the jobs that can still change: `state` holds the unsettled jobs only
    (`jobs`); the settled ones leave it for `shelf` after the fold that settled them, and come
    back into it before an event for them is folded (`folding`, then `refresh`). The view is
    kept by the streams each fold touched, so keeping it costs what the new events do. The
    reconciler's passes walk `jobs` (reconciler.live); the dashboard's pages read them, and
    a settled job through `find`."""

    def __init__(self, shelf: ShelfT) -> None:
        self.state = LedgerState()
        self.shelf = shelf

    @property
    def jobs(self) -> dict[str, JobState]:
        return self.state.jobs

    def __len__(self) -> int:
        """Every job the ledger knows, shelved or not."""
        return len(self.state.jobs) + len(self.shelf)

    def load(self, store: SnapshotReader, empty: Callable[[], ShelfT]) -> LazyState:
        """The jobs at the store's head, kept so: the settled ones go to a shelf `empty` makes
        as the snapshot is read, never all held at once (ledger.replay.load_state_apart);
        without a usable snapshot, the events are folded whole and their settled jobs shelved
        after. Returns the index of every job at the head (the snapshot's, or one of the
        folded states): the dashboard picks the TPUs' holders from it."""
        shelf = empty()
        reads = None if shelf.PUT_READS is None else (*SETTLED_READS, *shelf.PUT_READS)
        loaded = load_state_apart(store, settled, shelf.put, reads)
        if loaded is None:  # what went to the first shelf is dropped
            shelf, state = empty(), load_state(store)
            index = LazyState.of(state)
        else:
            state, index = loaded
        self.rebuild(state, shelf)
        return index

    def rebuild(self, state: LedgerState, shelf: ShelfT) -> None:
        """From a freshly loaded state, and the `shelf` of what its load kept apart
        (ledger.replay.load_state_apart; an empty one if none): its settled jobs go to the shelf."""
        self.state, self.shelf = state, shelf
        with no_cyclic_gc():
            for job in [j for j in state.jobs.values() if settled(j)]:
                shelve(state, shelf, job)

    def folding(self, rows: Iterable[tuple], touched: set[str]) -> Iterator[tuple]:
        """The fold's rows (seq, stream, ...) as they are, each one's stream added to
        `touched`; a shelved job is put back into the state before its first event is folded."""
        shelf, state = self.shelf, self.state
        for row in rows:
            stream = row[1]
            if stream not in touched:
                touched.add(stream)
                if stream in shelf:
                    unshelve(state, shelf, stream)
            yield row

    def refresh(self, touched: Iterable[str]) -> None:
        """After a fold: the jobs it touched that it settled go to the shelf."""
        jobs = self.state.jobs
        for job_id in touched:
            job = jobs.get(job_id)
            if job is not None and settled(job):
                shelve(self.state, self.shelf, job)

    def find(self, job_id: str) -> JobState | None:
        """Any job the ledger knows, shelved or not (a shelved one decoded: a copy)."""
        job = self.state.jobs.get(job_id)
        return job if job is not None else self.shelf.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.state.jobs or job_id in self.shelf


class JobsWithShelf(Mapping[str, JobState]):
    """Every job of a fold whose settled jobs are on a shelf, as one mapping: the fold's own
    jobs as they are, a shelved one decoded when it is asked for (a copy, let go after)."""

    def __init__(self, jobs: Mapping[str, JobState], shelf: PackedJobs) -> None:
        self._jobs, self._shelf = jobs, shelf

    def __getitem__(self, job_id: str) -> JobState:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._shelf.get(job_id)
            if job is None:
                raise KeyError(job_id)
        return job

    def __iter__(self) -> Iterator[str]:
        yield from self._jobs
        yield from self._shelf.ids()

    def __len__(self) -> int:
        return len(self._jobs) + len(self._shelf)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs or job_id in self._shelf
