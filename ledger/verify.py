"""`ledger verify`: walk the whole chain and the invariants, stop at the first bad position.

Checked for every event, in seq order: seq is contiguous from 1; prev_hash is the previous
event's hash; hash is sha256(prev_hash + canonical(envelope without hash)), rebuilt from the
stored columns; the stream's version is contiguous from 1; the envelope and its data fit the
event classes (ledger/events; schemas/event.schema.json is generated from them); and the
transition is legal for the job (fold anomalies).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ledger import fold
from ledger.events import GENESIS_HASH, body_text, row_hash
from ledger.events.schema import RowChecker

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
    checker = RowChecker()
    versions: dict[str, int] = {}
    # The fold of `fold.apply_rows`, inlined: this state is verify's own (every job is built
    # here), data is not decoded for types whose fold ignores it, and repeated texts once.
    jobs: dict[str, fold.JobState] = {}
    transition, initial, allowed_from, data_free = fold._transition, fold.initial, fold.ALLOWED_FROM, fold._DATA_FREE
    no_data: dict = {}
    decoded: dict[str, object] = {}
    loads = json.loads
    prev_hash = GENESIS_HASH
    expected_seq = 1
    count = 0
    for row in rows:
        seq, stream, version, type_, time_, actor_json, id_, causation, data_json, row_prev, hash_ = row
        count += 1
        if seq != expected_seq:
            return Report(count, expected_seq - 1, Problem(expected_seq, f"seq is not contiguous: expected {expected_seq}, found {seq}"))
        if row_prev != prev_hash:
            return Report(count, seq, Problem(seq, f"prev_hash does not match the hash of seq {seq - 1}: the chain is broken"))
        try:
            actual = row_hash(row_prev, body_text(*row[:10]))
        except (TypeError, ValueError) as exc:
            return Report(count, seq, Problem(seq, f"a column has the wrong type: {exc}"))
        if actual != hash_:
            return Report(count, seq, Problem(seq, "hash mismatch: the event was altered after it was written"))
        expected_version = versions.get(stream, 0) + 1
        if version != expected_version:
            return Report(count, seq, Problem(seq, f"stream {stream!r} version is not contiguous: expected {expected_version}, found {version}"))
        versions[stream] = version
        error = checker.check(row, hashes_checked=True)
        if error is not None:
            return Report(count, seq, Problem(seq, f"schema: {error}"))
        if transitions and stream[:1] != "_":  # fold.is_job_stream
            job = jobs.get(stream)
            if job is None:
                job = jobs[stream] = initial(stream)
            # Exactly the condition under which the fold records an anomaly.
            allowed = allowed_from.get(type_)
            if allowed is not None and job.state not in allowed:
                return Report(count, seq, Problem(seq, f"illegal transition in {stream}: {type_} from state {job.state or '(new)'}"))
            if type_ in data_free:
                data = no_data
            else:
                data = decoded.get(data_json)
                if data is None:
                    if len(decoded) >= 16_384:
                        decoded.clear()
                    text, value = checker.last_decoded  # the schema check may have just decoded it
                    data = decoded[data_json] = value if text is data_json else loads(data_json)
            transition(job, type_, data, time_, seq, version)
        prev_hash = hash_
        expected_seq += 1
        if progress is not None and count % PROGRESS_EVERY == 0:
            progress(count)
    if progress is not None:
        progress(count)
    return Report(count, expected_seq - 1, None)


def verify_store(store, **kwargs) -> Report:
    from ledger.replay import no_cyclic_gc

    rows = store.raw_rows() if hasattr(store, "raw_rows") else (e.row() for e in store.read_all())
    with no_cyclic_gc():
        return verify_rows(rows, **kwargs)
