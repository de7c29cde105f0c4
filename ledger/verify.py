"""`ledger verify`: walk the whole chain and the invariants, stop at the first bad position.

Checked for every event, in seq order: seq is contiguous from 1; prev_hash is the previous
event's hash; hash is sha256(prev_hash + canonical(envelope without hash)), rebuilt from the
stored columns; the stream's version is contiguous from 1; the envelope and its data fit the
event classes (ledger/events; schemas/event.schema.json is generated from them); and the
transition is legal for the job (fold anomalies).
`verify_ledger` also checks every stored snapshot against the chain and the events, in the same walk.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

import msgspec

from ledger import capacity_snapshot, fold, overrides
from ledger.capacity import CapacityMemory
from ledger.events import GENESIS_HASH, sealed_hash
from ledger.events.data import OverrideSignature
from ledger.events.schema import RowChecker
from ledger.fold import JobState, LedgerState
from ledger.replay import PROGRESS_EVERY, SNAPSHOT_NAME, fold_into, parts_among, snapshot_problem
from ledger.shelf import JobsWithShelf, PackedJobs, compact_text, settled, shelve, unshelve
from ledger.snapshots.jobs import PIECES, ROWS, SnapshotPartError, part_name
from ledger.snapshots.jobs import code_version as snapshot_code
from ledger.snapshots.lazy import state_difference
from ledger.snapshots.plain import no_cyclic_gc
from ledger.store import open_store
from ledger.store.base import Reader, Snapshot, SnapshotReader
from ledger.usage import UsageFold
from ledger.usage import snapshot as usage_snapshot
from ledger.usage.share import ShareMeter

if TYPE_CHECKING:  # start-up time: multiprocessing.connection loads only where a child verifies
    from multiprocessing.connection import Connection

SINK_CHUNK = 20_000  # rows a walk's sink is given at once


@dataclass(frozen=True, slots=True)
class Problem:
    position: int
    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    events: int  # events checked (up to and including the bad one)
    head: int
    problem: Problem | None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "events": self.events, "head": self.head,
            "problem": None if self.problem is None else {"position": self.problem.position, "reason": self.problem.reason},
        }


def verify_rows(
    rows: Iterable[tuple],
    *,
    transitions: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Report:
    """Check rows in `Store.raw_rows` layout; the first problem ends the walk."""
    return _Walk(transitions).run(rows, progress=progress)


class _Walk:
    """verify's walk over rows in seq order, resumable: its state (versions, jobs) carries
    from one range of rows to the next.

    One loop: the rows' own checks (seq, chain, hash, version, schema) run in a generator
    that feeds the fold's own `fold.apply_rows`, so the jobs are built by the very code that
    replay runs, and a transition is illegal exactly when that fold records an anomaly.
    A job the fold has settled waits on a shelf (ledger.shelf) until an event comes for it:
    a lab's history is mostly settled jobs, ~5 KB each as states (600 MB at 118,956 jobs,
    every time the dashboard verifies) and ~0.3 KB shelved."""

    def __init__(self, transitions: bool) -> None:
        self.transitions = transitions
        self.checker = RowChecker()
        self.versions: dict[str, int] = {}
        self.state = LedgerState()
        self.shelf = PackedJobs(compact_text)
        self.prev_hash = GENESIS_HASH
        self.expected_seq = 1
        self.count = 0
        self.problem: Report | None = None

    def run(self, rows: Iterable[tuple], *, chain: bool = True, progress: Callable[[int], None] | None = None,
            sink: Callable[[list[tuple]], None] | None = None) -> Report:
        """Walk `rows` (raw_rows' layout). chain=False takes fold_rows' layout and leaves out
        what depends on the row alone (hash, schema, the link to the row before), for a
        range another process checks. `sink` is given the checked rows too, in fold_rows'
        layout, a list of up to SINK_CHUNK at a time (the snapshots' other folds)."""
        self.problem = None
        checked = self._checked(rows, chain, progress, sink)
        if self.transitions:
            checker, decode = self.checker, msgspec.json.decode

            def loads(text: str) -> object:  # the schema check may have just decoded it
                seen, value = checker.last_decoded
                return value if chain and seen is text else decode(text)

            fold.apply_rows(self.state, checked, loads)
        else:
            for _ in checked:
                pass
        if self.problem is not None:
            return self.problem
        if progress is not None:
            progress(self.count)
        return Report(self.count, self.expected_seq - 1, None)

    def _checked(self, rows: Iterable[tuple], chain: bool, progress: Callable[[int], None] | None,
                 sink: Callable[[list[tuple]], None] | None) -> Iterator[tuple]:
        """The rows in fold_rows' layout, each checked before the fold sees it; the first
        problem (a row's, or the fold's anomaly on the row before) ends the walk."""
        checker, versions, state, shelf = self.checker, self.versions, self.state, self.shelf
        jobs = state.jobs
        prev_hash, expected_seq, count = self.prev_hash, self.expected_seq, self.count
        folding = self.transitions
        last: tuple[str, int, int] | None = None  # (stream, anomalies before, seq) of the row just folded
        passed: list[tuple] = []  # for the sink
        try:
            for row in rows:
                if last is not None:
                    job = jobs[last[0]]
                    if len(job.anomalies) > last[1]:
                        self.problem = self._illegal(last, count)
                        return
                    if settled(job):
                        shelve(state, shelf, job)
                    last = None
                if chain:
                    seq, stream, version, type_, time_, _, _, _, data_json, row_prev, hash_ = row
                else:  # fold_rows' layout: what the walk needs, fewer columns to fetch
                    seq, stream, version, type_, time_, data_json = row
                count += 1
                if seq != expected_seq:
                    self.problem = Report(count, expected_seq - 1, Problem(expected_seq, f"seq is not contiguous: expected {expected_seq}, found {seq}"))
                    return
                if chain:
                    if row_prev != prev_hash:
                        self.problem = Report(count, seq, Problem(seq, f"prev_hash does not match the hash of seq {seq - 1}: the chain is broken"))
                        return
                    try:
                        actual = sealed_hash(*row[:10])
                    except (TypeError, ValueError) as exc:
                        self.problem = Report(count, seq, Problem(seq, f"a column has the wrong type: {exc}"))
                        return
                    if actual != hash_:
                        self.problem = Report(count, seq, Problem(seq, "hash mismatch: the event was altered after it was written"))
                        return
                    prev_hash = hash_
                expected_version = versions.get(stream, 0) + 1
                if version != expected_version:
                    self.problem = Report(count, seq, Problem(seq, f"stream {stream!r} version is not contiguous: expected {expected_version}, found {version}"))
                    return
                versions[stream] = version
                if chain:
                    error = row_problem(checker, row)
                    if error is not None:
                        self.problem = Report(count, seq, Problem(seq, error))
                        return
                expected_seq += 1
                if folding and stream[:1] != "_":  # fold.is_job_stream
                    job = jobs.get(stream)
                    if job is None and stream in shelf:  # revived: back before the fold sees its event
                        job = unshelve(state, shelf, stream)
                    last = (stream, len(job.anomalies) if job is not None else 0, seq)
                out = (seq, stream, version, type_, time_, data_json) if chain else row  # fold_rows' layout already
                if sink is not None:
                    passed.append(out)
                    if len(passed) == SINK_CHUNK:
                        sink(passed)
                        passed = []
                yield out
                if progress is not None and count % PROGRESS_EVERY == 0:
                    progress(count)
            if last is not None and len(jobs[last[0]].anomalies) > last[1]:
                self.problem = self._illegal(last, count)
        finally:
            self.prev_hash, self.expected_seq, self.count = prev_hash, expected_seq, count
            if passed and sink is not None:
                sink(passed)

    def every_job(self) -> Mapping[str, JobState]:
        """The fold's jobs, shelved ones included (decoded as asked)."""
        return JobsWithShelf(self.state.jobs, self.shelf)

    def _illegal(self, last: tuple[str, int, int], count: int) -> Report:
        stream, _, seq = last
        anomaly = self.state.jobs[stream].anomalies[-1]
        return Report(count, seq, Problem(seq, f"illegal transition in {stream}: {anomaly['type']} from state {anomaly['from']}"))


def row_problem(checker: RowChecker, row: tuple) -> str | None:
    """What is wrong with a row on its own (its hash already checked): its schema, and for an
    operator's signed override, its signature (the statement names this very event: action,
    job and the version it was decided on, and the key that signed it is the one recorded).
    Whether that key was trusted is the allowed-signers file's history, checked at append."""
    error = checker.check(row, hashes_checked=True)
    if error is not None:
        return f"schema: {error}"
    type_ = row[3]
    if type_ not in overrides.ACTIONS:
        return None
    data = msgspec.json.decode(row[8])
    if "signed" not in data:
        return None
    signed = msgspec.convert(data["signed"], OverrideSignature)
    stream, version = row[1], row[2]
    why = overrides.problem(signed, type_, stream, version - 1)
    if why is None and msgspec.json.decode(row[5]).get("name") != signed.signer:
        why = f"the event's actor is not the signer {signed.signer!r}"
    return None if why is None else f"override signature: {why}"


# Above this many events, verify uses a second process: the hash and schema of each row
# depend on that row alone (it carries its prev_hash), so a child checks the tail of the
# log while this process checks the head of it and walks the versions and transitions of
# every row (those carry state from row to row). The chain is joined at the boundary.
PARALLEL_FROM = 200_000
# Of the rows. Per row (CPU us, this machine): this process ~8 for a row it checks whole,
# ~3.5 for one it only walks; the child ~7 (fetch, hash, schema): 1M events took 4.6 s CPU
# here and 5.5 s in the child at 0.8; 0.73 evens them out.
CHILD_SHARE = 0.73
# When the child also folds the usage and the capacity memory that snapshots are compared
# with (`verify_ledger`, ~8 s CPU at 1M events, then their comparisons), it checks fewer rows.
# Measured in process, two rounds each (2026-11-29, after the walk's shelf and the usage
# meter's shorter week): at 1M events and 20,087 jobs 0.35 / 0.45 / 0.55 took 7.0-7.1 /
# 6.6-6.7 / 7.2-7.3 s; at 118,956 jobs 11.6-11.8 / 11.4-11.7 / 12.0-12.4 s (0.25: 12.5,
# 0.65: 12.6-12.8).
CHILD_SHARE_APART = 0.45


def verify_store(store: Reader, *, parallel_from: int = PARALLEL_FROM, transitions: bool = True,
                 progress: Callable[[int], None] | None = None) -> Report:
    """Every event checked (`verify_rows`' checks), by two processes past `parallel_from`
    events; `progress` is given the count of events walked."""
    return _verify(store, None, parallel_from=parallel_from, transitions=transitions, progress=progress)[0]


def verify_ledger(store: SnapshotReader, *, parallel_from: int = PARALLEL_FROM,
                  progress: Callable[[int], None] | None = None) -> tuple[Report, list[SnapshotVerdict]]:
    """`verify_store`, and every stored snapshot's verdict (none unless the events are
    sound), in the same walk: each job-state snapshot is compared with the walk's own fold of
    the jobs at its position, each usage and capacity snapshot with folds of their own, fed
    the walk's rows, or in two processes the child's (`_SnapshotChecks`). A second read and
    a second fold of a million events would cost ~8 s more."""
    report, checks = _verify(store, store.list_snapshots(), parallel_from=parallel_from, transitions=True,
                             progress=progress)
    return report, checks.verdicts() if report.ok and checks is not None else []


def verify_snapshots(store: SnapshotReader) -> list[SnapshotVerdict]:
    """Every stored snapshot's verdict, the events taken as they are (`verify_ledger` checks
    them in the same read): compared with a fold of the events up to each one's position."""
    with no_cyclic_gc():
        checks = _SnapshotChecks(store, store.list_snapshots())
        _compare_apart(store, checks, None)
        return checks.verdicts()


def _compare_apart(store: Reader, checks: _SnapshotChecks, until: int | None) -> None:
    """Give `checks` a plain fold of the events (taken as they are) up to each snapshot's
    position up to `until`: the jobs' states only if a job-state snapshot is among them."""
    state = LedgerState()
    checks.at(0, state.jobs)
    for end in checks.positions(0, until):
        rows = store.fold_rows(state.position, end)
        while chunk := list(islice(rows, SINK_CHUNK)):
            if checks.jobs:
                fold_into(state, chunk)
            checks.feed(chunk)
        state.position = end
        checks.at(end, state.jobs)


def _verify(store: Reader, listed: list[Snapshot] | None, *, parallel_from: int, transitions: bool,
            progress: Callable[[int], None] | None) -> tuple[Report, _SnapshotChecks | None]:
    """The walk, and the snapshots `listed` (None: none checked). They are listed before the
    head is read: every one the events reach is then within the walk."""
    head = store.head() if parallel_from else 0
    url = getattr(store, "url", None)
    split = bool(parallel_from) and head >= parallel_from and url is not None
    here = (JOBS,) if split else (JOBS, FOLDED)  # two processes: the child folds the rest
    with no_cyclic_gc():
        checks = None if listed is None else _SnapshotChecks(store, listed, kinds=here)
        if split and url is not None:
            report = _verify_split(store, url, head, checks, transitions, progress)
            if report is not None:
                return report, checks
            checks = None if listed is None else _SnapshotChecks(store, listed)  # no child: all of it here
        walk = _Walk(transitions)
        if checks is not None:
            checks.at(0, walk.every_job())
        return _walk_to(walk, store, None, chain=True, checks=checks, progress=progress), checks


def _walk_to(walk: _Walk, store: Reader, until: int | None, *, chain: bool, checks: _SnapshotChecks | None,
             progress: Callable[[int], None] | None) -> Report:
    """Walk on from where `walk` is to seq `until` (None: the head), pausing at each snapshot
    position on the way for `checks`. The walk is resumable, so pausing changes nothing."""
    after = walk.expected_seq - 1
    ends: list[int | None] = [*(checks.positions(after, until) if checks is not None else ())]
    if not ends or ends[-1] != until:
        ends.append(until)
    report = Report(walk.count, after, None)
    sink = checks.feed if checks is not None and checks.folding else None
    for end in ends:
        start = walk.expected_seq - 1
        rows = store.raw_rows(start, end) if chain else store.fold_rows(start, end)
        report = walk.run(rows, chain=chain, progress=progress, sink=sink)
        if not report.ok or (end is not None and report.head != end):  # a problem, or the events end sooner
            return report
        if checks is not None and end is not None:
            checks.at(end, walk.every_job())
    return report


def _verify_split(store: Reader, url: str, head: int, checks: _SnapshotChecks | None, transitions: bool,
                  progress: Callable[[int], None] | None) -> Report | None:
    """The walk with a child checking the rows after `mid` (and folding what `checks` left
    to it); None when no child could be started."""
    apart = checks.apart() if checks is not None else []
    mid = head - int(head * (CHILD_SHARE_APART if apart else CHILD_SHARE))
    # forkserver, not fork: a process with other threads (the dashboard verifies from one)
    # could fork while one of them holds SQLite's or the allocator's lock, and the child
    # would hang on it. The server is started once per process, with this module loaded.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, url, mid, head, [_key(snap) for snap in apart]), daemon=True)
    try:
        child.start()
    except OSError:  # no process to be had (a process limit, no room for the server's socket)
        receive.close()
        send.close()
        return None
    send.close()
    walk, walked = _Walk(transitions), False
    try:  # the child is not left running when this walk stops early (a problem; a progress
        # callback that stops verify, as the dashboard's does when it closes; a lost store)
        if checks is not None:
            checks.at(0, walk.every_job())
        first = _walk_to(walk, store, mid, chain=True, checks=checks, progress=progress)
        boundary = walk.prev_hash  # the hash of seq `mid`, checked
        if first.ok and first.head == mid:
            rest = _walk_to(walk, store, head, chain=False, checks=checks, progress=progress)
            walked = True
    finally:
        if not walked:
            child.kill()
            child.join()
            receive.close()
    if not walked:
        return first
    try:
        answer = receive.recv()
    except EOFError:  # the child died without an answer (killed: out of memory, a signal)
        answer = (*_check_range(store.raw_rows(mid, head), mid), {})  # its range, here
    child.join()
    if isinstance(answer, Exception):
        raise answer
    tail_problem, first_prev, tail_count, answers = answer
    problems = [p for p in (rest.problem, tail_problem) if p is not None]
    if first_prev is not None and first_prev != boundary:
        problems.append(Problem(mid + 1, f"prev_hash does not match the hash of seq {mid}: the chain is broken"))
    if tail_count != head - mid and tail_problem is None:
        problems.append(Problem(mid + tail_count + 1, "seq is not contiguous"))
    if problems:
        worst = min(problems, key=lambda p: p.position)
        return Report(worst.position, worst.position, worst)
    if checks is not None:
        checks.settle(answers)
        if unsettled := checks.apart():  # the child died, or did not find them (saved since, or kept no longer)
            here = _SnapshotChecks(store, unsettled, kinds=(FOLDED,))
            _compare_apart(store, here, head)
            checks.settle(here.answers())
    return Report(head, head, None)


def _child(send: Connection, url: str, after: int, until: int, apart: list[tuple]) -> None:
    """In the child: seq, the chain within the range, hash and schema of rows (after, until];
    then, if they are sound, the snapshots `apart` (their `_key`s) compared with folds of
    the events up to `until`, their verdicts answered by key."""
    try:
        store = open_store(url, create=False)
        with no_cyclic_gc():
            result = _check_range(store.raw_rows(after, until), after)
            answers: dict[tuple, str | None] = {}
            if apart and result[0] is None:
                wanted = set(apart)
                checks = _SnapshotChecks(store, [s for s in store.list_snapshots() if _key(s) in wanted], kinds=(FOLDED,))
                _compare_apart(store, checks, until)
                answers = checks.answers()
        store.close()
        send.send((*result, answers))
    except Exception as exc:  # the parent raises it: a damaged file fails as it would there
        send.send(exc)
    finally:
        send.close()


def _check_range(rows: Iterable[tuple], after: int, checker: RowChecker | None = None) -> tuple[Problem | None, str | None, int]:
    """(first problem, the first row's prev_hash, rows seen) for rows after seq `after`."""
    checker = checker or RowChecker()
    expected_seq, prev_hash, first_prev, count = after + 1, None, None, 0
    for row in rows:
        seq, row_prev, hash_ = row[0], row[9], row[10]
        count += 1
        if seq != expected_seq:
            return Problem(expected_seq, f"seq is not contiguous: expected {expected_seq}, found {seq}"), first_prev, count
        if prev_hash is None:
            first_prev = row_prev
        elif row_prev != prev_hash:
            return Problem(seq, f"prev_hash does not match the hash of seq {seq - 1}: the chain is broken"), first_prev, count
        try:
            actual = sealed_hash(*row[:10])
        except (TypeError, ValueError) as exc:
            return Problem(seq, f"a column has the wrong type: {exc}"), first_prev, count
        if actual != hash_:
            return Problem(seq, "hash mismatch: the event was altered after it was written"), first_prev, count
        error = row_problem(checker, row)
        if error is not None:
            return Problem(seq, error), first_prev, count
        prev_hash = hash_
        expected_seq += 1
    return None, first_prev, count


class TailCheck:
    """The events appended since the last call, checked as `verify` checks each row (seq
    contiguous, linked to the row before, hash, schema): the cheap soundness signal a
    running service gives (/readyz, metrics). It starts at the head it first sees (the
    events before are `ledger verify`'s), and each call reads only what is new; a head
    that went back (events removed) is a problem too."""

    def __init__(self) -> None:
        self.after: int | None = None  # the seq checked up to
        self.last_hash: str | None = None  # that row's hash
        self.problem: Problem | None = None  # once found, kept: the ledger does not heal
        self._checker: RowChecker | None = None  # built once (it compiles every event type's schema)

    def check(self, store: Reader) -> Problem | None:
        if self.problem is not None:
            return self.problem
        head = store.head()
        if self.after is None:
            self.after = max(0, head - 1)
        if head < self.after:
            self.problem = Problem(head + 1, f"the head went back from seq {self.after} to {head}: events were removed")
            return self.problem
        if head == self.after and self.last_hash is not None:
            return None  # nothing new
        if self._checker is None:
            self._checker = RowChecker()
        last: list[tuple] = []

        def remember(rows: Iterable[tuple]) -> Iterator[tuple]:
            for row in rows:
                last[:] = [row]
                yield row

        problem, first_prev, count = _check_range(remember(store.raw_rows(self.after)), self.after, self._checker)
        if problem is None and count and self.last_hash is not None and first_prev != self.last_hash:
            problem = Problem(self.after + 1, f"prev_hash does not match the hash of seq {self.after}: the chain is broken")
        if problem is not None:
            self.problem = problem
        elif last:
            self.after, self.last_hash = last[0][0], last[0][10]
        return self.problem


# -- snapshots -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SnapshotVerdict:
    snapshot: Snapshot
    rebuilt: bool  # its state was compared with the events' (this code's snapshots only)
    problem: str | None  # None: sound

    def to_dict(self) -> dict:
        s = self.snapshot
        return {"name": s.name, "code_version": s.code_version, "position": s.position,
                "rebuilt": self.rebuilt, "problem": self.problem}


# What a snapshot is compared with: the walk's fold of the jobs, or folds of its own (usage,
# capacity) that the walk's rows feed, or the child's.
JOBS, FOLDED = "jobs", "folded"


def _key(snap: Snapshot) -> tuple:
    """A snapshot as both processes of verify name it (each lists the snapshots itself)."""
    return snap.name, snap.code_version, snap.position, snap.hash


class _SnapshotChecks:
    """Snapshots `listed`, checked as verify's walk passes their positions.

    Up front, each one's own hash and its tie to the chain (the checks replay makes before
    using one, `replay.snapshot_problem`). Each one made by this code is then compared with
    the state the events give at its position, which is what catches a snapshot forged with
    consistent hashes: a job-state snapshot with the walk's own fold of the jobs (replay's
    fold), a usage snapshot with the usage fold of the half-life its name says, a capacity
    snapshot with a capacity memory; those two are fed the walk's rows (`feed`). Snapshots
    of other code are checked by hash only (replay never uses them). Those of a kind not
    in `kinds` are compared elsewhere (verify's child): their verdicts come to `settle`."""

    def __init__(self, store: SnapshotReader, listed: list[Snapshot], *, kinds: Collection[str] = (JOBS, FOLDED)) -> None:
        self._snapshots = listed  # by position
        code, usage_code, capacity_code = snapshot_code(), usage_snapshot.code_version(), capacity_snapshot.code_version()
        parts = {part_name(SNAPSHOT_NAME, p) for p in (PIECES, ROWS)}
        self._verdicts: dict[tuple, SnapshotVerdict] = {}  # by _key
        self._due: dict[int, list[tuple[Snapshot, Callable[[Snapshot, Mapping[str, JobState]], str | None]]]] = {}
        self._apart: dict[tuple, Snapshot] = {}  # compared elsewhere, by _key
        self._usage: dict[str, usage_snapshot.Kept] = {}
        self._memory: CapacityMemory | None = None
        self.jobs = False  # whether a job-state snapshot is compared here
        compare = {code: (JOBS, self._jobs_problem), usage_code: (FOLDED, self._usage_problem),
                   capacity_code: (FOLDED, self._capacity_problem)}
        for snap in listed:
            problem = snapshot_problem(store, snap)
            # a part is checked by its own hash here, and as what its manifest names with its whole
            kind, check = (None, None) if problem is not None or snap.name in parts \
                else compare.get(snap.code_version, (None, None))
            if kind is None or check is None:
                self._verdicts[_key(snap)] = SnapshotVerdict(snap, False, problem)
            elif kind not in kinds:
                self._apart[_key(snap)] = snap
            else:
                self._due.setdefault(snap.position, []).append((snap, check))
                if snap.code_version == usage_code:
                    self._usage_fold(snap.name)
                elif snap.code_version == capacity_code:
                    self._memory = self._memory or CapacityMemory()
                else:
                    self.jobs = True

    def _usage_fold(self, name: str) -> None:
        half_life = usage_snapshot.half_life_of(name)
        if half_life is not None and name not in self._usage:  # else: reported as a name no meter writes
            meter = ShareMeter(half_life)
            self._usage[name] = meter, UsageFold(on_interval=meter.add)

    def apart(self) -> list[Snapshot]:
        """The snapshots compared elsewhere whose verdicts have not come yet."""
        return list(self._apart.values())

    def settle(self, answers: dict[tuple, str | None]) -> None:
        """Verdicts of snapshots compared elsewhere (`answers` of the checks there), by _key."""
        for key in [k for k in self._apart if k in answers]:
            self._verdicts[key] = SnapshotVerdict(self._apart.pop(key), True, answers[key])

    def answers(self) -> dict[tuple, str | None]:
        """The verdicts of the snapshots compared here, by _key (for `settle`)."""
        return {key: v.problem for key, v in self._verdicts.items() if v.rebuilt}

    @property
    def folding(self) -> bool:
        """Whether the walk's rows feed folds of their own (usage, capacity)."""
        return bool(self._usage) or self._memory is not None

    def positions(self, after: int, until: int | None) -> list[int]:
        """Where snapshots are still to be compared, in (after, until], in order."""
        return sorted(p for p in self._due if p > after and (until is None or p <= until))

    def feed(self, rows: list[tuple]) -> None:
        """The walk's checked rows, in fold_rows' layout, in seq order."""
        for _, usage in self._usage.values():
            usage.apply_rows(rows)
        if self._memory is not None:
            self._memory.apply_rows(rows)

    def at(self, position: int, jobs: Mapping[str, JobState]) -> None:
        """The walk is at `position` (its fold's jobs are `jobs`, the rows up to it fed):
        compare the snapshots made there."""
        for _, usage in self._usage.values():
            usage.position = position
        if self._memory is not None:
            self._memory.position = position
        for snap, check in self._due.pop(position, ()):
            self._verdicts[_key(snap)] = SnapshotVerdict(snap, True, check(snap, jobs))

    def verdicts(self) -> list[SnapshotVerdict]:
        """Each snapshot's, in position order; one the walk did not reach (the ledger ended
        sooner) is past the head."""
        for position, due in self._due.items():
            for snap, _ in due:
                self._verdicts[_key(snap)] = SnapshotVerdict(snap, False, f"it folds up to seq {position}, past the ledger's head")
        self._due.clear()
        return [self._verdicts[_key(snap)] for snap in self._snapshots]

    def _jobs_problem(self, snap: Snapshot, jobs: Mapping[str, JobState]) -> str | None:
        try:
            return state_difference(snap.state, parts_among(self._snapshots, snap), snap.position, jobs)
        except SnapshotPartError as exc:
            return str(exc)

    def _usage_problem(self, snap: Snapshot, _jobs: Mapping[str, JobState]) -> str | None:
        """A usage snapshot against the usage fold of the events up to its position."""
        saved = usage_snapshot.decode(snap.state)
        if saved is None or saved[1].position != snap.position:
            return "its state does not decode to its position"
        half_life = saved[0].half_life_hours
        if snap.name != usage_snapshot.snapshot_name(half_life) or snap.name not in self._usage:
            return f"its meter's half-life ({half_life:g} h) is not its name's"
        rebuilt = usage_snapshot.body_of(*self._usage[snap.name])  # copied once, compared twice
        return usage_snapshot.difference(saved, rebuilt) or usage_snapshot.admission_difference(snap.state, rebuilt)

    def _capacity_problem(self, snap: Snapshot, _jobs: Mapping[str, JobState]) -> str | None:
        """A capacity snapshot against the memory of the events up to its position."""
        saved = capacity_snapshot.decode(snap.state)
        if saved is None or saved.position != snap.position:
            return "its state does not decode to its position"
        if snap.name != capacity_snapshot.SNAPSHOT_NAME:
            return f"it is a capacity memory under another name ({snap.name})"
        assert self._memory is not None  # made for every capacity snapshot
        return capacity_snapshot.difference(saved, self._memory)
