"""The fold: a job's state from its events. Pure functions over plain data.

`evolve(job, event) -> job` never raises on a surprising event: an illegal transition is
kept in `job.anomalies` for `ledger verify` to report, and replay goes on.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger import capacity

# Job states. Terminal ones never change again (a resubmission is a new `submitted`).
PENDING = "pending"
REJECTED = "rejected"
QUEUED = "queued"
PROVISIONING = "provisioning"
PROVISIONED = "provisioned"
SETTING_UP = "setting_up"
READY = "ready"
RUNNING = "running"
PREEMPTED = "preempted"
FAILED = "failed"  # a failed attempt; `final` in the event makes it terminal
RECOVERING = "recovering"
CANCELLING = "cancelling"
# The TPU API refused the job's TPU for a reason trying again cannot fix (permission, invalid
# argument, unknown zone...): no more API calls until its spec changes or `ledger resume`.
BLOCKED = "blocked"
FINISHED = "finished"
CANCELLED = "cancelled"
FAILED_FINAL = "failed_final"

TERMINAL = frozenset({REJECTED, FINISHED, CANCELLED, FAILED_FINAL})
LIVE = frozenset({PENDING, QUEUED, PROVISIONING, PROVISIONED, SETTING_UP, READY, RUNNING, PREEMPTED, FAILED, RECOVERING,
                  CANCELLING, BLOCKED})

# Which states each event type may follow; anything else is an anomaly (still applied).
_ANY_LIVE = LIVE
# An action already under way when a cancel is requested still records how it ended:
# its outcome events are legal in CANCELLING (the fold then keeps the job cancelling).
_IN_FLIGHT = frozenset({CANCELLING})
# The states a provision is planned from (reconciler.plan acquires a TPU there): the create
# the reconciler then makes may be refused from any of them, so `provision_failed` may follow
# each. (Before this was one table for writer and reader, a create refused outright was
# recorded from `pending`, which the table then forbade: those ledgers verify now.)
_ACQUIRING = frozenset({PENDING, QUEUED, PROVISIONING, PREEMPTED, FAILED, RECOVERING})
ALLOWED_FROM: dict[str, frozenset[str]] = {
    "submitted": frozenset({"", REJECTED, FINISHED, CANCELLED, FAILED_FINAL}),
    "rejected": frozenset({"", *TERMINAL, *LIVE}),
    "spec_updated": _ANY_LIVE,
    "cancel_requested": frozenset({*_ANY_LIVE, *TERMINAL}),
    "queued": frozenset({*_ACQUIRING, BLOCKED, *_IN_FLIGHT}),
    "provisioning": frozenset({*_ACQUIRING, *_IN_FLIGHT}),
    "provisioned": frozenset({PROVISIONING, QUEUED, *_IN_FLIGHT}),
    "provision_failed": frozenset({*_ACQUIRING, BLOCKED, *_IN_FLIGHT}),
    "setup_started": frozenset({PROVISIONED, SETTING_UP, READY, RECOVERING, PREEMPTED, FAILED}),
    "setup_done": frozenset({SETTING_UP, *_IN_FLIGHT}),
    "setup_failed": frozenset({SETTING_UP, *_IN_FLIGHT}),
    "started": frozenset({READY, SETTING_UP, RECOVERING, FAILED, *_IN_FLIGHT}),
    # QUEUED too: a job holding a queued resource waits in `queued` (WAITING_FOR_RESOURCES, or
    # one slice ACTIVE before the others), and a node of it may be preempted before it is used.
    "preempted": frozenset({PROVISIONED, SETTING_UP, READY, RUNNING, PROVISIONING, QUEUED, RECOVERING, CANCELLING}),
    "failed": _ANY_LIVE,
    "resumed": frozenset({PREEMPTED, FAILED, RECOVERING, RUNNING, READY, FAILED_FINAL, BLOCKED, *_IN_FLIGHT}),
    "rerun": frozenset({PREEMPTED, FAILED, RECOVERING, RUNNING, READY, FINISHED, FAILED_FINAL, CANCELLED, BLOCKED, *_IN_FLIGHT}),
    "finished": frozenset({RUNNING, *_IN_FLIGHT}),
    "cancelled": frozenset({CANCELLING, *_ANY_LIVE}),
    "admitted": _ANY_LIVE,
    "quota_spent": frozenset({RUNNING, *_IN_FLIGHT}),  # no handler: its time says when (admission)
    "released": frozenset({*_ANY_LIVE, *TERMINAL}),
    "checkpointed": frozenset({RUNNING, *_IN_FLIGHT}),
}


@dataclass(slots=True)
class JobState:
    id: str
    owner: str = ""
    name: str = ""
    state: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    spec_hash: str = ""
    commit: str = ""
    path: str = ""
    author: str = ""
    approvers: list[str] = field(default_factory=list)
    attempt: int = 0  # incremented by each provisioning/resume/rerun; passed to the job
    restarts: int = 0  # recoveries spent from the job's budget
    tpu: dict[str, Any] | None = None  # the TPU held: name, zone, kind, shared, accelerator
    operation: str = ""  # the create's long-running operation, while provisioning
    hosts: list[dict[str, Any]] = field(default_factory=list)
    times: dict[str, str] = field(default_factory=dict)  # event type -> time it last happened
    last_error: dict[str, Any] | None = None
    queued_reason: str = ""
    cancel_requested: bool = False
    pending_action: dict[str, Any] | None = None  # an intent whose outcome is not recorded yet
    recovery: dict[str, Any] | None = None  # the decided rule while recovering
    run_spec_hash: str = ""  # the spec the running attempt was started with
    queued_count: int = 0  # failed tries since its last TPU the capacity memory does not pace: its retry backoff
    submitted_seq: int = 0  # queue order among equals in a shared-TPU pool
    priority: int = 0
    admitted_by: str = ""  # an operator let this submission past its quotas (`ledger admit`)
    failures: list[dict[str, Any]] = field(default_factory=list)  # every failed attempt, in order
    released: list[list[str]] = field(default_factory=list)  # [tpu name, time] of the latest releases
    checkpoint: dict[str, Any] | None = None  # the last checkpoint the job reported: {attempt, step}
    version: int = 0  # stream version this state reflects
    position: int = 0  # global seq this state reflects
    anomalies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def copy(self) -> JobState:
        """A private copy: a replay folds its own jobs in place, so whoever keeps a job
        beyond the next fold (an action in flight) takes a copy."""
        return _clone(self)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELD_NAMES}  # dataclasses.fields() per call was half the cost

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobState:
        return cls(**d)


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(JobState))


def split_job_id(job_id: str) -> tuple[str, str]:
    owner, _, name = job_id.partition("/")
    return owner, name


def initial(job_id: str) -> JobState:
    owner, name = split_job_id(job_id)
    return JobState(id=job_id, owner=owner, name=name)


def evolve(job: JobState, type_: str, data: Mapping[str, Any], *, time: str = "", seq: int = 0, version: int = 0) -> JobState:
    """The next state of `job` after one event. Returns a new JobState; `job` is untouched."""
    nxt = _clone(job)
    _transition(nxt, type_, data, time, seq, version)
    return nxt


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(JobState))


def _clone(job: JobState) -> JobState:
    """A copy that shares nothing a transition mutates in place (only `times` is; every
    other field is replaced, never edited). Much cheaper than dataclasses.replace."""
    new = JobState.__new__(JobState)
    for name in _FIELD_NAMES:
        setattr(new, name, getattr(job, name))
    new.times = dict(job.times)
    return new


def _transition(j: JobState, type_: str, data: Mapping[str, Any], time: str, seq: int, version: int) -> None:
    """Apply one event to a JobState the caller owns (a fresh clone, or replay's own copy)."""
    allowed = ALLOWED_FROM.get(type_)
    if allowed is not None and j.state not in allowed:
        j.anomalies = [*j.anomalies, {"seq": seq, "type": type_, "from": j.state or "(new)"}]
    handler = _HANDLERS.get(type_)
    if handler is not None:
        handler(j, data)
    if type_ == "submitted":
        j.submitted_seq = seq
    elif type_ == "released" and isinstance(data.get("tpu"), dict):
        # Kept so a node that was ours moments ago is not mistaken for an orphan.
        j.released = [*j.released[-4:], [data["tpu"].get("name", ""), time]]
    if time:
        j.times[type_] = time
    j.version = version or j.version + 1
    j.position = seq or j.position


# -- handlers: each mutates the fresh copy made by evolve ----------------------------------
def _submitted(j: JobState, d: Mapping[str, Any]) -> None:
    j.state = PENDING
    j.spec = d.get("spec", {})
    j.spec_hash = d.get("spec_hash", "")
    j.commit = d.get("commit", "")
    j.path = d.get("path", "")
    j.author = d.get("author", "")
    j.approvers = list(d.get("approvers", []))
    j.attempt = 0
    j.restarts = 0
    j.tpu = None
    j.operation = ""
    j.hosts = []
    j.last_error = None
    j.checkpoint = None
    j.cancel_requested = False
    j.recovery = None
    j.queued_reason = ""
    j.queued_count = 0
    j.run_spec_hash = ""
    j.failures = []
    j.submitted_seq = 0
    j.admitted_by = ""
    job = j.spec.get("job") or {}
    j.priority = int(j.spec.get("priority", job.get("priority", 0)) or 0)


def _rejected(j: JobState, d: Mapping[str, Any]) -> None:
    # A rejected update of a live job leaves the job as it was: the old spec keeps running.
    if j.state in ("", *TERMINAL):
        j.state = REJECTED
    j.last_error = {"kind": "rejected", "message": d.get("reason", "")}


def _spec_updated(j: JobState, d: Mapping[str, Any]) -> None:
    j.spec = d.get("spec", j.spec)
    j.spec_hash = d.get("spec_hash", j.spec_hash)
    j.commit = d.get("commit", j.commit)
    if j.state == BLOCKED:  # a new spec may fix what the API refused: ask again
        j.state = PENDING


def _cancel_requested(j: JobState, d: Mapping[str, Any]) -> None:
    if j.state in LIVE:
        j.cancel_requested = True
        j.state = CANCELLING


def _queued(j: JobState, d: Mapping[str, Any]) -> None:
    if j.state != CANCELLING:
        j.state = QUEUED
    j.queued_reason = d.get("reason", "")
    # Held back by admission or by the lab's capacity memory, or refused for capacity (which
    # the memory counts and paces the job by), is no failed try of its own: no backoff grows.
    if not (d.get("wait") or d.get("paced") or capacity.is_stockout(d)):
        j.queued_count += 1


def _provisioning(j: JobState, d: Mapping[str, Any]) -> None:
    if j.state != CANCELLING:
        j.state = PROVISIONING
    j.attempt = d.get("attempt", j.attempt)
    j.tpu = d.get("tpu", j.tpu)
    j.operation = d.get("operation", "")
    j.queued_reason = ""


def _provisioned(j: JobState, d: Mapping[str, Any]) -> None:
    if j.state != CANCELLING:
        j.state = PROVISIONED
    j.tpu = d.get("tpu", j.tpu)
    j.hosts = list(d.get("hosts", []))
    j.queued_count = 0


def _provision_failed(j: JobState, d: Mapping[str, Any]) -> None:
    j.last_error = {"kind": "provision", "message": d.get("reason", "")}
    api = d.get("api")
    if isinstance(api, Mapping) and api.get("code"):
        j.last_error["code"] = api["code"]
    if j.state != CANCELLING:
        j.state = FAILED_FINAL if d.get("final") else BLOCKED


def _setup_started(j: JobState, d: Mapping[str, Any]) -> None:
    if j.state != CANCELLING:
        j.state = SETTING_UP


def _setup_done(j: JobState, d: Mapping[str, Any]) -> None:
    if j.state != CANCELLING:
        j.state = READY


def _setup_failed(j: JobState, d: Mapping[str, Any]) -> None:
    j.last_error = {"kind": "setup", **{k: d[k] for k in ("module", "worker", "reason") if k in d}}
    j.failures = [*j.failures, {"kind": "setup", "attempt": j.attempt}]
    if j.state != CANCELLING:
        j.state = FAILED_FINAL if d.get("final", False) else FAILED


def _started(j: JobState, d: Mapping[str, Any]) -> None:
    if j.state != CANCELLING:
        j.state = RUNNING
    j.recovery = None
    j.run_spec_hash = d.get("spec_hash", j.spec_hash)


def _preempted(j: JobState, d: Mapping[str, Any]) -> None:
    j.last_error = {"kind": "preempted", "message": d.get("reason", ""), "tpu_state": d.get("tpu_state", "")}
    if d.get("cause"):  # preempted for another job (admission): its TPU is still up
        j.last_error = {**j.last_error, "cause": d["cause"], "winner": d.get("winner", "")}
    j.failures = [*j.failures, {"kind": "preempted", "attempt": j.attempt}]
    if j.state != CANCELLING:
        j.state = PREEMPTED


# Before failure kinds were fixed, a final verdict recorded its rule as its kind.
_LEGACY_VERDICT_KINDS = frozenset({"pass", "exhausted"})


def _failed(j: JobState, d: Mapping[str, Any]) -> None:
    j.last_error = {k: d[k] for k in ("kind", "message", "exit_code", "worker", "rule") if k in d}
    # A final failure with a `rule` is the verdict on the failure before it (its rule is
    # `pass`, or the budget is spent), not another failed attempt.
    verdict = d.get("final") and ("rule" in d or d.get("kind") in _LEGACY_VERDICT_KINDS)
    if not verdict:
        j.failures = [*j.failures, {"kind": d.get("kind", ""), "attempt": j.attempt}]
    if d.get("final"):
        j.state = FAILED_FINAL
    elif j.state != CANCELLING:
        j.state = FAILED


def illegal(job: JobState, events: Iterable[tuple[str, Mapping[str, Any]]]) -> str | None:
    """The first of `events` ((type, data) pairs, appended in order after `job`) that the
    table forbids, as "TYPE from STATE"; None when all are legal. What a writer asks before
    it appends, with the table verify reads."""
    probe = job
    for type_, data in events:
        allowed = ALLOWED_FROM.get(type_)
        if allowed is not None and probe.state not in allowed:
            return f"{type_} from {probe.state or '(new)'}"
        probe = evolve(probe, type_, data)
    return None


def _recovery(kind: str) -> Callable[[JobState, Mapping[str, Any]], None]:
    def apply(j: JobState, d: Mapping[str, Any]) -> None:
        j.restarts = d.get("restarts", j.restarts + 1)
        j.attempt = d.get("attempt", j.attempt + 1)
        j.recovery = {"rule": d.get("rule", kind), "reapply": bool(d.get("reapply", False))}
        if j.state != CANCELLING:
            j.state = RECOVERING

    return apply


def _checkpointed(j: JobState, d: Mapping[str, Any]) -> None:
    j.checkpoint = {"attempt": d.get("attempt", j.attempt), "step": d.get("step", 0)}


def _admitted(j: JobState, d: Mapping[str, Any]) -> None:
    j.admitted_by = str(d.get("by") or "operator")


def _finished(j: JobState, d: Mapping[str, Any]) -> None:
    j.state = FINISHED


def _cancelled(j: JobState, d: Mapping[str, Any]) -> None:
    j.state = CANCELLED


def _released(j: JobState, d: Mapping[str, Any]) -> None:
    name = d.get("tpu", {}).get("name") if isinstance(d.get("tpu"), dict) else d.get("name")
    if j.tpu is None or name in (None, j.tpu.get("name")):
        j.tpu = None
        j.hosts = []
        if (j.last_error or {}).get("kind") == "release":
            j.last_error = None  # deleted at last: nothing is wrong any more


def _action_intent(j: JobState, d: Mapping[str, Any]) -> None:
    j.pending_action = dict(d)


# The actions that delete a job's TPU: a refusal for good of one of them leaves the TPU
# billing with no way to end it until someone grants what the API asks for.
RELEASING_ACTIONS = frozenset({"release", "cancel"})


def _action_outcome(j: JobState, d: Mapping[str, Any]) -> None:
    if j.pending_action and j.pending_action.get("action_id") == d.get("action_id"):
        j.pending_action = None
    api = d.get("api")
    if d.get("ok") is False and d.get("action") in RELEASING_ACTIONS and isinstance(api, Mapping) \
            and api.get("kind") == "permanent":
        # The state stays what it was (the job ended, or is cancelling): its error says why
        # its TPU is still held, and the planner retries the release only now and then.
        j.last_error = {"kind": "release", "message": d.get("error", ""), "code": api.get("code", ""),
                        **({"permission": api["permission"]} if api.get("permission") else {})}


_HANDLERS = {
    "submitted": _submitted,
    "rejected": _rejected,
    "spec_updated": _spec_updated,
    "cancel_requested": _cancel_requested,
    "queued": _queued,
    "provisioning": _provisioning,
    "provisioned": _provisioned,
    "provision_failed": _provision_failed,
    "setup_started": _setup_started,
    "setup_done": _setup_done,
    "setup_failed": _setup_failed,
    "started": _started,
    "preempted": _preempted,
    "failed": _failed,
    "resumed": _recovery("resume"),
    "rerun": _recovery("rerun"),
    "finished": _finished,
    "admitted": _admitted,
    "cancelled": _cancelled,
    "released": _released,
    "checkpointed": _checkpointed,
    "action_intent": _action_intent,
    "action_outcome": _action_outcome,
}


# -- the whole ledger ----------------------------------------------------------------------
@dataclass(slots=True)
class LedgerState:
    """Every job's state at `position`. Streams that are not jobs (e.g. `_system`) are skipped."""

    position: int = 0
    jobs: dict[str, JobState] = field(default_factory=dict)
    # Jobs this state copied itself: only those may change in place (copy on first write,
    # so a state built from another state or a snapshot never edits what it shares).
    owned: set[str] = field(default_factory=set, repr=False, compare=False)

    def detached(self) -> LedgerState:
        """A copy that later folds into this state never change, for a reader on another
        thread (the reconciler's snapshot saver): this state gives up every job it owns, so
        it copies a job again before changing it. Costs one dict copy; the jobs are shared."""
        self.owned.clear()
        return LedgerState(self.position, dict(self.jobs))

    def to_json(self) -> bytes:
        return json.dumps(
            {"position": self.position, "jobs": [j.to_dict() for j in self.jobs.values()]},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> LedgerState:
        d = json.loads(blob)
        return cls(d["position"], {j["id"]: JobState.from_dict(j) for j in d["jobs"]})


def is_job_stream(stream: str) -> bool:
    return not stream.startswith("_")


def apply(state: LedgerState, stream: str, type_: str, data: Mapping[str, Any], *, time: str, seq: int, version: int) -> None:
    """Fold one event into `state` in place: what `evolve` does, without a copy per event.
    Each job is copied once, on the first event that touches it, so nothing shared changes."""
    state.position = seq
    if not is_job_stream(stream):
        return
    job = state.jobs.get(stream)
    if job is None:
        job = state.jobs[stream] = initial(stream)
        state.owned.add(stream)
    elif stream not in state.owned:
        job = state.jobs[stream] = _clone(job)
        state.owned.add(stream)
    _transition(job, type_, data, time, seq, version)


# Types whose fold never reads `data`: their handlers ignore it, and `_transition` itself
# only reads it for `released`. Replay does not decode their data at all.
_DATA_FREE = frozenset(
    {"setup_started", "setup_done", "finished", "cancelled", "cancel_requested"}
    | {t for t in ALLOWED_FROM.keys() | {"note", "history_rewritten", "rewrite_accepted"}
       if t not in _HANDLERS and t != "released"}
)
_NO_DATA: Mapping[str, Any] = {}
_DECODED_LIMIT = 16_384


def apply_rows(state: LedgerState, rows: Iterable[tuple], loads: Any = json.loads) -> LedgerState:
    """`apply` for every (seq, stream, version, type, time, data JSON text) row, in place.

    The same result as decoding each row's data and calling `apply`, made cheaper for replay:
    data is not decoded for types whose fold ignores it, and identical data texts (a
    preemption reason, `{}`, the same TPU on provisioning and provisioned) are decoded once
    per few thousand rows. A decoded value may then be shared by several jobs' states, which
    is safe because states never edit a field in place (see `_clone`)."""
    jobs, owned, transition, data_free = state.jobs, state.owned, _transition, _DATA_FREE
    decoded: dict[str, Any] = {}
    last = None
    try:
        for seq, stream, version, type_, time_, data in rows:
            last = seq
            if stream[:1] == "_":  # not a job stream (is_job_stream)
                continue
            job = jobs.get(stream)
            if job is None:
                job = jobs[stream] = initial(stream)
                owned.add(stream)
            elif stream not in owned:
                job = jobs[stream] = _clone(job)
                owned.add(stream)
            if type_ in data_free:
                d = _NO_DATA
            else:
                d = decoded.get(data)
                if d is None:
                    if len(decoded) >= _DECODED_LIMIT:
                        decoded.clear()
                    d = decoded[data] = loads(data)
            transition(job, type_, d, time_, seq, version)
    finally:
        if last is not None:
            state.position = last
    return state


def replay(events: Iterable[Any], start: LedgerState | None = None) -> LedgerState:
    """Fold events (Event objects) onto a copy of `start` (or an empty ledger)."""
    state = LedgerState(start.position, dict(start.jobs)) if start else LedgerState()
    for ev in events:
        apply(state, ev.stream, ev.type, ev.data, time=ev.time, seq=ev.seq, version=ev.version)
    return state


@functools.cache  # the code does not change under a running process: read once, not at each load and turn
def code_version() -> str:
    """Identifies the fold's code: a snapshot made by other code is ignored, never trusted.
    The code is this module and what its transitions ask of another (`capacity.is_stockout`
    and the kinds it counts), not the rest of that module."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(inspect.getsource(capacity.is_stockout).encode())
    digest.update(repr(sorted(capacity.CAPACITY)).encode())
    return digest.hexdigest()[:16]
