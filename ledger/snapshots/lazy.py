"""A job-state snapshot decoded job by job as asked (`LazyState`), and decoded whole or
compared with a fold of the events (verify)."""

from __future__ import annotations

import bisect
import itertools
import operator
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import lz4.block
import msgspec

from ledger import jsontext
from ledger.fold import TERMINAL, JobState, LedgerState
from ledger.snapshots.columns import NOTHING_HELD, Columns, JobIndex, Names, choose, code_in, place
from ledger.snapshots.jobs import CHUNK, FIELDS, ROWS, InChunk, Parts, job_from_text, manifest
from ledger.snapshots.plain import load_plain


class LazyState:
    """Every job's state at `position`, decoded job by job as asked: a snapshot's columns and
    pieces, with the jobs the events after it changed (folded, kept decoded). `select` gives
    the ids a listing shows, in id order; `holders` and `releasing` what `ledger tpus`
    chooses on; `job(id)` a job's state; `texts(ids)` their `ledger list --json` items;
    `index` every job's JobIndex (made whole only when asked: verify, tests).

    A snapshot keeps the pieces in id order, `CHUNK` to a chunk, each chunk's text a JSON
    list whose items are separated as `jsontext.pretty` separates a list's: a run of
    consecutive jobs is one slice of it, written out as it is."""

    def __init__(self, position: int, columns: Columns | None = None, chunks: list[bytes] | None = None,
                 rows: Callable[[], bytes] | None = None) -> None:
        self.position = position
        self._c = columns or Columns.empty()
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
        return place(self._c.ids, job_id)

    def _chunk(self, n: int) -> bytes:
        if self._plain[0] != n:
            self._plain = (n, lz4.block.decompress(self._chunks[n]))
        return self._plain[1]

    def _piece(self, i: int) -> tuple[int, int, int]:
        return i // CHUNK, self._c.starts[i], self._c.ends[i]

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
        names = self._c.ids.sorted_list() if isinstance(self._c.ids, Names) else self._c.ids
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
            n = first // CHUNK
            last = min(end, (n + 1) * CHUNK) - 1
            yield memoryview(self._chunk(n))[starts[first]:ends[last]]
            first = last + 1

    def pieces(self) -> Iterator[tuple[str, memoryview, InChunk]]:
        """Every job's id, piece and where it lies as the snapshot holds them (not the jobs
        folded since), a chunk at a time in the chunks' order (`_chunk`: only the chunk at hand
        is kept), for a reader that takes each job once."""
        text = memoryview(b"")
        starts, ends = self._c.starts, self._c.ends
        for i, job_id in enumerate(self._c.ids):
            n = i // CHUNK
            if i % CHUNK == 0:
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
        o, s = code_in(c.owners, owner), code_in(c.states, state)
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
        for i in places:  # released_by is in place order (`Columns.unpacked` checks it)
            lo = bisect.bisect_left(c.released_by, i)
            hi = bisect.bisect_right(c.released_by, i, lo)
            if lo < hi:
                out[i] = c.released[lo:hi]
        return out

    def _entry(self, i: int, released: dict[int, list[str]]) -> JobIndex:
        """The snapshot's JobIndex of the job at place `i`."""
        c = self._c
        held, held_shared, wants = c.notable.get(i, NOTHING_HELD)
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
        ValueError (and the errors of `UNREADABLE`) when its rows do not decode."""
        if self._changed:
            raise ValueError("jobs were folded since the snapshot: it is not as stored")
        c = self._c
        rows = self._plain_rows() if c.ids else []
        if not all(map(operator.lt, c.ids, itertools.islice(c.ids, 1, None))):
            return "its job ids are not in order (a reader bisects them)"
        if not all(names.consistent() for names in (c.ids, c.released) if isinstance(names, Names)):
            return "its names do not start where its text says"
        if len(c.ids) != len(jobs) or list(c.ids) != sorted(jobs):
            held = set(c.ids)
            first = min(held.symmetric_difference(jobs))
            return f"it holds job {first}, which the events do not" if first in held else f"job {first} is missing from it"
        fields_of, released = operator.attrgetter(*FIELDS), self._released_at()
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
    if len(row) != len(FIELDS):
        return f"job {job_id}: its row has {len(row)} fields, not {len(FIELDS)}"
    name, a, b = next((n, a, b) for n, a, b in zip(FIELDS, row, operator.attrgetter(*FIELDS)(job), strict=True)
                      if a != b)
    return f"job {job_id}: {name} is {_short(a)} in it, {_short(b)} from the events"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def decode_lazy(blob: bytes, parts: Parts) -> LazyState | None:
    """The snapshot's columns and pieces (its rows fetched only if decoded whole); None when
    it is not a snapshot this code can read (it is then ignored). SnapshotPartError when a
    part is missing or not the one it names."""
    m = manifest(blob)
    chunks = None if m is None else m.chunks(parts)
    if m is None or chunks is None:
        return None
    return LazyState(m.position, m.columns, chunks, lambda: m.part(parts, ROWS))


def decode_state(blob: bytes, parts: Parts, check: bool = False) -> LedgerState | None:
    """Every job's state in the snapshot `blob` (and its rows; its pieces too when `check`);
    None when it is not a snapshot this code can read (it is then ignored).
    SnapshotPartError when a part is missing or not the one it names. `check`:
    LazyState.decoded's."""
    m = manifest(blob)
    if m is None:
        return None
    chunks = m.chunks(parts) if check else []
    if chunks is None:
        return None
    rows = m.part(parts, ROWS)
    try:
        return LazyState(m.position, m.columns, chunks, lambda: rows).decoded(check)
    except UNREADABLE:
        return None


def state_difference(blob: bytes, parts: Parts, position: int, jobs: Mapping[str, JobState]) -> str | None:
    """Why the job-state snapshot `blob` does not hold `jobs` at `position`
    (`LazyState.difference`), or None (verify's check of a snapshot against its walk's fold
    of the events). SnapshotPartError when a part is missing or not the one it names."""
    m = manifest(blob)
    chunks = None if m is None else m.chunks(parts)
    if m is None or chunks is None or m.position != position:
        return "its state does not decode to its position"
    rows = m.part(parts, ROWS)
    try:
        return LazyState(m.position, m.columns, chunks, lambda: rows).difference(jobs)
    except UNREADABLE as exc:
        return f"its state does not decode ({type(exc).__name__}: {exc})"


# What reading a snapshot's parts can raise when they are not what this code wrote
# (msgspec's ValidationError is a DecodeError).
UNREADABLE = (msgspec.DecodeError, lz4.block.LZ4BlockError, pickle.UnpicklingError, TypeError, KeyError,
               IndexError, ValueError, EOFError)
