"""`ledger verify`: walk the whole chain and the invariants, stop at the first bad position.

Checked for every event, in seq order: seq is contiguous from 1; prev_hash is the previous
event's hash; hash is sha256(prev_hash + canonical(envelope without hash)), rebuilt from the
stored columns; the stream's version is contiguous from 1; the envelope and its data fit the
event classes (ledger/events; schemas/event.schema.json is generated from them); and the
transition is legal for the job (fold anomalies).
Then `verify_snapshots` checks every stored snapshot against the chain and the events.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

import msgspec

from ledger import capacity_snapshot, fold, overrides
from ledger.capacity import CapacityMemory
from ledger.events import GENESIS_HASH, sealed_hash
from ledger.events.data import OverrideSignature
from ledger.events.schema import RowChecker
from ledger.fold import LedgerState
from ledger.replay import (
    PIECES,
    ROWS,
    SNAPSHOT_NAME,
    SnapshotPartError,
    decode_state,
    fold_into,
    no_cyclic_gc,
    part_name,
    parts_among,
    snapshot_problem,
)
from ledger.replay import code_version as snapshot_code
from ledger.store import open_store
from ledger.store.base import Reader, Snapshot, SnapshotReader
from ledger.usage import UsageFold
from ledger.usage import snapshot as usage_snapshot
from ledger.usage.share import ShareMeter

PROGRESS_EVERY = 20_000


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
    replay runs, and a transition is illegal exactly when that fold records an anomaly."""

    def __init__(self, transitions: bool) -> None:
        self.transitions = transitions
        self.checker = RowChecker()
        self.versions: dict[str, int] = {}
        self.state = LedgerState()
        self.prev_hash = GENESIS_HASH
        self.expected_seq = 1
        self.count = 0
        self.problem: Report | None = None

    def run(self, rows: Iterable[tuple], *, chain: bool = True, progress: Callable[[int], None] | None = None) -> Report:
        """Walk `rows` (raw_rows' layout). chain=False takes fold_rows' layout and leaves out
        what depends on the row alone (hash, schema, the link to the row before), for a
        range another process checks."""
        self.problem = None
        checked = self._checked(rows, chain, progress)
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

    def _checked(self, rows: Iterable[tuple], chain: bool, progress: Callable[[int], None] | None) -> Iterator[tuple]:
        """The rows in fold_rows' layout, each checked before the fold sees it; the first
        problem (a row's, or the fold's anomaly on the row before) ends the walk."""
        checker, versions, jobs = self.checker, self.versions, self.state.jobs
        prev_hash, expected_seq, count = self.prev_hash, self.expected_seq, self.count
        folding = self.transitions
        last: tuple[str, int, int] | None = None  # (stream, anomalies before, seq) of the row just folded
        try:
            for row in rows:
                if last is not None and len(jobs[last[0]].anomalies) > last[1]:
                    self.problem = self._illegal(last, count)
                    return
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
                    last = (stream, len(job.anomalies) if job is not None else 0, seq)
                yield seq, stream, version, type_, time_, data_json
                if progress is not None and count % PROGRESS_EVERY == 0:
                    progress(count)
            if last is not None and len(jobs[last[0]].anomalies) > last[1]:
                self.problem = self._illegal(last, count)
        finally:
            self.prev_hash, self.expected_seq, self.count = prev_hash, expected_seq, count

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


def verify_store(store: Reader, *, parallel_from: int = PARALLEL_FROM, **kwargs) -> Report:
    head = store.head() if parallel_from else 0
    url = getattr(store, "url", None)
    if not parallel_from or head < parallel_from or url is None or kwargs.get("progress") is not None:
        with no_cyclic_gc():
            return verify_rows(store.raw_rows(), **kwargs)
    return _verify_split(store, url, head, **kwargs)


def _verify_split(store: Reader, url: str, head: int, *, transitions: bool = True) -> Report:
    mid = head - int(head * CHILD_SHARE)
    # forkserver, not fork: a process with other threads (the dashboard verifies from one)
    # could fork while one of them holds SQLite's or the allocator's lock, and the child
    # would hang on it. The server is started once per process, with this module loaded.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, url, mid, head), daemon=True)
    try:
        child.start()
    except OSError:  # no process to be had (a process limit, no room for the server's socket)
        receive.close()
        send.close()
        with no_cyclic_gc():
            return verify_rows(store.raw_rows(), transitions=transitions)
    send.close()
    walk = _Walk(transitions)
    with no_cyclic_gc():
        first = walk.run(store.raw_rows(0, mid))
        boundary = walk.prev_hash  # the hash of seq `mid`, checked
        rest = first if not first.ok or first.head != mid else walk.run(store.fold_rows(mid, head), chain=False)
    if not first.ok or first.head != mid:
        child.kill()
        child.join()
        return first
    try:
        answer = receive.recv()
    except EOFError:  # the child died without an answer (killed: out of memory, a signal)
        with no_cyclic_gc():
            answer = _check_range(store.raw_rows(mid, head), mid)  # its range, here
    child.join()
    if isinstance(answer, Exception):
        raise answer
    tail_problem, first_prev, tail_count = answer
    problems = [p for p in (rest.problem, tail_problem) if p is not None]
    if first_prev is not None and first_prev != boundary:
        problems.append(Problem(mid + 1, f"prev_hash does not match the hash of seq {mid}: the chain is broken"))
    if tail_count != head - mid and tail_problem is None:
        problems.append(Problem(mid + tail_count + 1, "seq is not contiguous"))
    if not problems:
        return Report(head, head, None)
    worst = min(problems, key=lambda p: p.position)
    return Report(worst.position, worst.position, worst)


def _child(send, url: str, after: int, until: int) -> None:
    """In the child: seq, the chain within the range, hash and schema of rows (after, until]."""
    try:
        store = open_store(url, create=False)
        with no_cyclic_gc():
            result = _check_range(store.raw_rows(after, until), after)
        store.close()
        send.send(result)
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


def verify_snapshots(store: SnapshotReader) -> list[SnapshotVerdict]:
    """Check every stored snapshot; call it on a ledger whose events verified sound.

    Each one's own hash and its tie to the chain (the checks replay makes before using one,
    `replay.snapshot_problem`). Each one made by this fold's code is then decoded and its
    state compared with the state rebuilt from the events at its position, which is what
    catches a snapshot forged with consistent hashes. The rebuild is one read of the ledger
    up to the newest snapshot, visiting the snapshots in position order, its rows given to
    each fold a snapshot asks for (`_Rebuilt`): the jobs' states, the usage fold of each
    half-life, the capacity memory (ledger.capacity_snapshot). Snapshots of other code are
    checked by hash only (replay never uses them)."""
    verdicts = []
    code, usage_code, capacity_code = snapshot_code(), usage_snapshot.code_version(), capacity_snapshot.code_version()
    parts = {part_name(SNAPSHOT_NAME, p) for p in (PIECES, ROWS)}
    with no_cyclic_gc():
        snapshots = store.list_snapshots()  # by position
        problems = {id(snap): snapshot_problem(store, snap) for snap in snapshots}
        sound = [snap for snap in snapshots if problems[id(snap)] is None]
        rebuilt = _Rebuilt(store,
                           jobs=any(s.code_version == code and s.name not in parts for s in sound),
                           usage={s.name for s in sound if s.code_version == usage_code},
                           capacity=any(s.code_version == capacity_code for s in sound))
        for snap in snapshots:
            problem = problems[id(snap)]
            if problem is None and snap.code_version == usage_code:
                rebuilt.advance(snap.position)
                verdicts.append(SnapshotVerdict(snap, True, _usage_problem(snap, rebuilt.usage)))
                continue
            if problem is None and snap.code_version == capacity_code:
                rebuilt.advance(snap.position)
                verdicts.append(SnapshotVerdict(snap, True, _capacity_problem(snap, rebuilt.memory)))
                continue
            # A part is checked by its own hash here, and as what its manifest names below.
            if problem is not None or snap.code_version != code or snap.name in parts:
                verdicts.append(SnapshotVerdict(snap, False, problem))
                continue
            rebuilt.advance(snap.position)
            try:
                decoded = decode_state(snap.state, parts_among(snapshots, snap), check=True)
            except SnapshotPartError as exc:
                verdicts.append(SnapshotVerdict(snap, True, str(exc)))
                continue
            if decoded is None or decoded.position != snap.position:
                problem = "its state does not decode to its position"
            else:
                problem = _difference(decoded.jobs, rebuilt.state.jobs)
            verdicts.append(SnapshotVerdict(snap, True, problem))
    return verdicts


class _Rebuilt:
    """What the snapshots are compared with, folded from one read of the ledger: each
    stretch of rows is read once and given to every fold some snapshot asks for (the jobs'
    states; the usage fold of each usage snapshot's name, by the half-life the name says;
    the capacity memory). Three reads of a million rows cost ~2 s more."""

    CHUNK = 20_000  # rows held at once

    def __init__(self, store: Reader, *, jobs: bool, usage: Collection[str], capacity: bool) -> None:
        self._store, self.position = store, 0
        self.state = LedgerState()
        self._jobs = jobs
        self.usage: dict[str, usage_snapshot.Kept] = {}
        for name in usage:
            half_life = usage_snapshot.half_life_of(name)
            if half_life is not None:  # else the name is not one a meter writes: reported as such
                meter = ShareMeter(half_life)
                self.usage[name] = meter, UsageFold(on_interval=meter.add)
        self.memory = CapacityMemory()
        self._capacity = capacity

    def advance(self, to: int) -> None:
        if to <= self.position:
            return
        rows = self._store.fold_rows(self.position, to)
        while chunk := list(islice(rows, self.CHUNK)):
            if self._jobs:
                fold_into(self.state, chunk)
            for _, usage in self.usage.values():
                usage.apply_rows(chunk)
            if self._capacity:
                self.memory.apply_rows(chunk)
        self.position = self.state.position = self.memory.position = to
        for _, usage in self.usage.values():
            usage.position = to


def _usage_problem(snap: Snapshot, folds: dict[str, usage_snapshot.Kept]) -> str | None:
    """A usage snapshot against the usage fold of the events up to its position."""
    saved = usage_snapshot.decode(snap.state)
    if saved is None or saved[1].position != snap.position:
        return "its state does not decode to its position"
    half_life = saved[0].half_life_hours
    if snap.name != usage_snapshot.snapshot_name(half_life) or snap.name not in folds:
        return f"its meter's half-life ({half_life:g} h) is not its name's"
    rebuilt = usage_snapshot.body_of(*folds[snap.name])  # copied once, compared twice
    return usage_snapshot.difference(saved, rebuilt) or usage_snapshot.admission_difference(snap.state, rebuilt)


def _capacity_problem(snap: Snapshot, rebuilt: CapacityMemory) -> str | None:
    """A capacity snapshot against the memory of the events up to its position."""
    saved = capacity_snapshot.decode(snap.state)
    if saved is None or saved.position != snap.position:
        return "its state does not decode to its position"
    if snap.name != capacity_snapshot.SNAPSHOT_NAME:
        return f"it is a capacity memory under another name ({snap.name})"
    return capacity_snapshot.difference(saved, rebuilt)


def _difference(saved: dict[str, fold.JobState], rebuilt: dict[str, fold.JobState]) -> str | None:
    """The first job (by id) whose saved state differs from the rebuilt one, said plainly."""
    for job_id in sorted(saved.keys() | rebuilt.keys()):
        a, b = saved.get(job_id), rebuilt.get(job_id)
        if a == b:
            continue
        if a is None:
            return f"job {job_id} is missing from it"
        if b is None:
            return f"it holds job {job_id}, which the events do not"
        name = next(f.name for f in dataclasses.fields(fold.JobState) if getattr(a, f.name) != getattr(b, f.name))
        return (f"job {job_id}: {name} is {_short(getattr(a, name))} in it, "
                f"{_short(getattr(b, name))} from the events")
    return None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
