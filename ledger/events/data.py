"""What each event type carries in `data`: one typed class per type, the one source of truth.

Writers construct these classes; `NewEvent` checks and encodes them; `ledger verify` checks
each stored `data` against them (msgspec, in C, once per distinct stored text); the
published `schemas/event.schema.json` is generated from them (`ledger.events.schema`).
So a writer cannot record what verify rejects, and the schema cannot drift from the code.

Conventions:
- A field without a default is required. An optional field defaults to `UNSET` and is left
  out of the stored JSON when not given: what a writer passes is exactly what is stored.
- A closed set of values is a `Literal`; adding a value is adding it to the Literal.
- Fields a class does not know are ignored when reading (a ledger written by newer code
  still verifies with older code) but refused when writing (`encode` below): every field
  written is declared here.

To add an event type: write its class below (a docstring, `event_type`, its fields), add it
to `_CLASSES`; if it changes a job's state, a handler and an `ALLOWED_FROM` entry in
`ledger.fold`; a line in `ledger.describe.summarize`; construct it where it is appended (a
new `NewEvent(...)` call is counted in tests/ledger/test_event_writers.py `APPEND_SITES`);
then `make schemas` and commit the schema. To add a field: add it to its class (optional =
`Opt[...] = UNSET` unless every writer always gives it), then `make schemas`."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from msgspec import inspect as mi

from ledger.errors import UsageError

_T = TypeVar("_T")
# An optional field: absent from the stored JSON unless a writer gives it.
Opt = Union[_T, UnsetType]  # noqa: UP007 - `X | Y` cannot hold a TypeVar for a generic alias

NonEmpty = Annotated[str, Meta(min_length=1)]
Count = Annotated[int, Meta(ge=0)]
SpecHash = Annotated[str, Meta(pattern="^[0-9a-f]{8,128}$", description="SHA-256 of the normalized spec's canonical JSON")]
Worker = Annotated[int, Meta(ge=0, description="worker index within the TPU slice")]
# A TPU's name, as a job's state and a snapshot's columns keep it: any text but control
# characters (Cloud TPU's own names are [a-z0-9-]). A NUL is the separator of a snapshot's
# packed names; a newline or an escape would break a line of `ledger tpus`.
TpuName = Annotated[str, Meta(min_length=1, pattern="^[^\\x00-\\x1f\\x7f]+$",
                              description="the TPU's name: no control characters")]

# -- closed vocabularies -------------------------------------------------------------------
# What ended an attempt: the TPU was preempted, a GRPC error or another failure pattern
# appeared in the output ("failure" also covers a command that could not start), a worker
# exited non-zero, a host was lost, setup failed, the TPU could not be provisioned, the host
# checks before a start found what they may not repair (`host_unhealthy`), the output said
# the TPU was held by another process or its lock could not be taken (`tpu_busy`).
FailureKind = Literal["exit", "grpc", "lost_host", "failure", "setup", "preempted", "provision",
                      "host_unhealthy", "tpu_busy"]
# Why a failure is final: the job's rule for that kind is `pass`, or its restart budget is spent.
FinalRule = Literal["pass", "exhausted"]
# How a job runs again: a recovery rule, an operator's override, a spec change, `job.loop`.
RecoveryRule = Literal["reapply", "resume", "rerun", "manual", "spec_updated", "loop"]
RecoveryCause = Literal[FailureKind, "spec_updated", "loop"]
# `clean`: the host checks' safe repairs (reconciler.doctor), found before, done after.
ActionKind = Literal["provision", "setup", "start", "release", "cancel", "recover", "restart", "clean"]
TpuKind = Literal["node", "queued_resource"]
# Why admission holds a job back: over a quota (user, team, lab), its chip-hours of the
# week spent, behind others for the lab's chips, or waiting for preempted jobs to let go.
WaitCause = Literal["quota", "capacity", "preempting"]
# Why admission took a running job's TPU back: for a higher class, for the team that lent
# the chips, or at a checkpoint once its weekly chip-hours quota ran out.
PreemptCause = Literal["priority", "reclaim", "quota"]
# What a running job does when a weekly chip-hours quota it counts against runs out.
SpentAction = Literal["finish", "checkpoint-and-stop"]
# Before the fix of failure kinds, a final failure recorded its rule as its kind, and the
# first schema listed "budget". Ledgers hold such events forever: they are read, never written.
LegacyFailureKind = Literal["pass", "exhausted", "budget"]


class EventDataError(UsageError):
    """A writer asked to record data its event type does not allow (or a type that does not
    exist): refused before anything is stored."""


# -- parts shared by several types ---------------------------------------------------------
class _Part(Struct, kw_only=True, frozen=True):
    pass


class Tpu(_Part):
    """A TPU a job holds or asks for. `placement`: which of the job's choices it is (0, or
    absent: the `tpu` block; i: `tpu.fallbacks[i-1]`), with its `pricing`; `slices`: a
    multislice TPU is one queued resource `name` whose nodes are `name-0` .. `name-(N-1)`
    (absent: one slice). Older events lack them: choice 0, one slice, the spec's pricing."""

    name: TpuName
    zone: Opt[str] = UNSET
    kind: Opt[TpuKind] = UNSET
    accelerator: Opt[str] = UNSET
    shared: Opt[bool] = UNSET
    attempt: Opt[Count] = UNSET
    placement: Opt[Count] = UNSET
    pricing: Opt[str] = UNSET
    slices: Opt[Annotated[int, Meta(ge=1)]] = UNSET


class Host(_Part):
    """One worker of a provisioned TPU, as the TPU API lists it (`slice`: of a multislice
    TPU, which slice; absent: 0)."""

    worker: Worker
    slice: Opt[Count] = UNSET
    internal_address: Opt[str] = UNSET  # the address the hosts reach each other by (Megascale)
    address: Opt[str] = UNSET
    port: Opt[int] = UNSET
    host_key: Opt[str | None] = UNSET


class Finding(_Part):
    """A problem or warning about a job spec (`ledger.spec.Message` as data)."""

    message: str
    file: Opt[str] = UNSET
    line: Opt[int] = UNSET
    column: Opt[int] = UNSET
    pointer: Opt[str] = UNSET
    hint: Opt[str] = UNSET
    severity: Opt[str] = UNSET


class ReviewRecord(_Part):
    """An approving review of the merged pull request on its merged head commit, from the
    forge's API: who, on which commit, and whether they may approve the path (CODEOWNERS
    or the policy's approvers)."""

    login: NonEmpty
    codeowner: bool
    commit: Opt[str] = UNSET


class FailureRecord(_Part):
    """One failed attempt in a job's history."""

    kind: FailureKind
    attempt: Count


# What a failure of the TPU API means (ledger.failures.kind_of).
ApiFailureKind = Literal["transient", "stockout", "quota", "permanent", "absent", "exists"]
PricingModel = Literal["spot", "ondemand", "preemptible", "reserved"]


class ApiStatus(_Part):
    """An error the Cloud TPU API returned, as `ledger.failures.ApiFailure` holds it: the
    canonical code, its message, google.rpc.ErrorInfo's reason and domain when given, the
    method, and whether the call was accepted and its operation failed (`in_operation`)."""

    code: NonEmpty
    kind: ApiFailureKind
    message: Opt[str] = UNSET
    method: Opt[str] = UNSET
    reason: Opt[str] = UNSET
    domain: Opt[str] = UNSET
    in_operation: Opt[bool] = UNSET
    resource: Opt[str] = UNSET
    permission: Opt[str] = UNSET


class Placement(_Part):
    """Where a TPU was asked for: what the capacity memory (ledger.capacity) folds stockouts
    and quotas by; `index`: which of the job's choices (absent: 0, the `tpu` block)."""

    zone: str
    accelerator: str
    pricing: Opt[PricingModel] = UNSET
    kind: Opt[TpuKind] = UNSET
    index: Opt[Count] = UNSET
    slices: Opt[Annotated[int, Meta(ge=1)]] = UNSET


class OverrideSignature(_Part):
    """An operator's override signed with an SSH key (`ledger cancel --sign-with KEY`): the
    exact statement signed and its armored OpenSSH signature, namespace
    `tpu-ledger-override` (ledger.overrides), so anyone can check it again, with
    `ssh-keygen -Y verify` too. `signer` is the principal the allowed-signers file gave the
    key, `key` its fingerprint."""

    signer: NonEmpty
    key: NonEmpty
    statement: NonEmpty
    signature: NonEmpty


def tpu(value: Mapping[str, Any]) -> Tpu:
    """A TPU dict (a plan's request, or as the fold read it back) as a checked `Tpu`."""
    return check(value, Tpu, "tpu")


def hosts(values: list[Mapping[str, Any]]) -> list[Host]:
    return [check(h, Host, "host") for h in values]


def history(failures: list[Mapping[str, Any]]) -> list[FailureRecord]:
    """A job's failed attempts (`JobState.failures`) as checked records."""
    return [check(f, FailureRecord, "failure record") for f in failures]


# -- one class per event type --------------------------------------------------------------
class EventData(Struct, kw_only=True, frozen=True):
    """Base of every event type's data."""

    event_type: ClassVar[str]

    def to_builtins(self) -> dict[str, Any]:
        """The plain JSON value stored for this data (checked, as `NewEvent` stores it)."""
        return encode(self.event_type, self)


class SpecUpdated(EventData):
    """A live job's spec changed in git (merged and approved)."""

    event_type: ClassVar[str] = "spec_updated"
    spec: dict[str, Any]
    spec_hash: SpecHash
    commit: Opt[NonEmpty] = UNSET
    path: Opt[NonEmpty] = UNSET
    blob: Opt[str] = UNSET
    # Who asked: the author of the change of this file (for a merge, of the merged commits
    # that touched it; `authors` lists them all when several did; `author` is the first).
    author: Opt[str] = UNSET
    author_name: Opt[str] = UNSET
    authors: Opt[list[str]] = UNSET
    approvers: Opt[list[str]] = UNSET
    merger: Opt[str] = UNSET  # who landed it on the branch (a merge's author, a squashing committer)
    signed_by: Opt[str] = UNSET  # the allowed signer, when the policy requires signatures
    reviews: Opt[list[ReviewRecord]] = UNSET  # the forge's approving reviews (ledger.forge)
    owner: Opt[str] = UNSET
    name: Opt[str] = UNSET
    committed_at: Opt[int] = UNSET  # committer time, seconds since the epoch
    pr: Opt[int] = UNSET
    warnings: Opt[list[Finding]] = UNSET


class Submitted(SpecUpdated):
    """A job spec arrived in git (merged and approved): the job exists from here."""

    event_type: ClassVar[str] = "submitted"
    commit: NonEmpty
    path: NonEmpty


class Rejected(EventData):
    """A change in git was refused: an invalid spec, or a missing approval."""

    event_type: ClassVar[str] = "rejected"
    reason: NonEmpty
    errors: Opt[list[Finding | str]] = UNSET
    commit: Opt[str] = UNSET
    path: Opt[str] = UNSET
    blob: Opt[str] = UNSET
    removal: Opt[bool] = UNSET
    would_approve: Opt[list[str]] = UNSET
    author: Opt[str] = UNSET


class CancelRequested(EventData):
    """Stop the job: its spec was deleted in git, or an operator cancelled it."""

    event_type: ClassVar[str] = "cancel_requested"
    reason: Opt[str] = UNSET
    by: Opt[str] = UNSET
    manual: Opt[bool] = UNSET
    signed: Opt[OverrideSignature] = UNSET
    commit: Opt[str] = UNSET
    path: Opt[str] = UNSET
    blob: Opt[str] = UNSET


class Queued(EventData):
    """The job waits: for capacity, a queued resource, or a shared TPU held by another job;
    or admission held it back (`wait`): over a quota, or for the lab's chips to free up
    (reconciler.admission). Then `scope`, `family` and the figures say which limit: the
    scope `holds` `held` of its `limit` (chips, or chip-hours over the last week) and the
    job `needs` more."""

    event_type: ClassVar[str] = "queued"
    reason: Opt[str] = UNSET
    wait: Opt[WaitCause] = UNSET
    scope: Opt[str] = UNSET  # "user alice", "team @lab/nlp", "lab"
    family: Opt[str] = UNSET
    unit: Opt[Literal["chips", "chip_hours_per_week"]] = UNSET
    held: Opt[float] = UNSET
    limit: Opt[float] = UNSET
    needs: Opt[float] = UNSET
    victims: Opt[list[str]] = UNSET  # jobs being preempted for this one
    # Waiting for capacity because the TPU API said so (a stockout or a quota, in the call or
    # in the create's operation): its answer, and the placement it was about.
    api: Opt[ApiStatus] = UNSET
    placement: Opt[Placement] = UNSET
    # Held back by the lab's capacity memory (every choice out of capacity, or its probe not
    # due: reconciler.placement.Hold), no try of its own: its retry backoff does not grow.
    paced: Opt[bool] = UNSET


class Provisioning(EventData):
    """A TPU was asked for (or a shared one taken) for this attempt."""

    event_type: ClassVar[str] = "provisioning"
    attempt: Count
    tpu: Opt[Tpu] = UNSET
    how: Opt[Literal["created", "adopted"]] = UNSET
    operation: Opt[str] = UNSET  # the create's long-running operation, looked up if the TPU never shows


class Provisioned(EventData):
    """The TPU is READY; its hosts are known."""

    event_type: ClassVar[str] = "provisioned"
    tpu: Opt[Tpu] = UNSET
    hosts: Opt[list[Host]] = UNSET


class ProvisionFailed(EventData):
    """The TPU API refused the job's TPU in a way trying again cannot fix (permission, an
    invalid argument, an unknown zone, runtime version or accelerator): the job is `blocked`
    (`reason` says why in one line, `api` is the API's answer) and makes no more calls until
    its spec or the policy changes or someone runs `ledger resume`. `final` (written by older versions)
    ended the job instead."""

    event_type: ClassVar[str] = "provision_failed"
    reason: str
    final: Opt[bool] = UNSET
    api: Opt[ApiStatus] = UNSET
    placement: Opt[Placement] = UNSET


class SetupStarted(EventData):
    """Setup (environment, mounts, code) began on the hosts."""

    event_type: ClassVar[str] = "setup_started"
    attempt: Opt[Count] = UNSET


class SetupDone(EventData):
    """Setup succeeded on every host."""

    event_type: ClassVar[str] = "setup_done"
    attempt: Opt[Count] = UNSET


class SetupFailed(EventData):
    """A setup module failed on a worker."""

    event_type: ClassVar[str] = "setup_failed"
    attempt: Opt[Count] = UNSET
    module: Opt[str] = UNSET
    worker: Opt[int | str | None] = UNSET
    reason: Opt[str] = UNSET
    final: Opt[bool] = UNSET
    slice: Opt[Count] = UNSET  # of a multislice job: the slice of `worker`


class Started(EventData):
    """The job's command runs on its workers."""

    event_type: ClassVar[str] = "started"
    attempt: Opt[Count] = UNSET
    workers: Opt[list[Worker]] = UNSET
    pids: Opt[dict[str, int]] = UNSET
    resume: Opt[bool] = UNSET
    spec_hash: Opt[str] = UNSET
    how: Opt[str] = UNSET
    # What the host checks before the start said: healthy | fixed | warning.
    health: Opt[str] = UNSET


class Preempted(EventData):
    """The TPU was preempted (or announced it), or vanished."""

    event_type: ClassVar[str] = "preempted"
    reason: Opt[str] = UNSET
    tpu_state: Opt[str] = UNSET
    attempt: Opt[Count] = UNSET
    # Set when admission took the TPU back (reconciler.admission): for `winner`, a job of a
    # higher class (`priority`) or of a team reclaiming the chips it lent (`reclaim`); or at a
    # checkpoint after its weekly chip-hours quota ran out (`quota`).
    cause: Opt[PreemptCause] = UNSET
    winner: Opt[str] = UNSET
    slice: Opt[Count] = UNSET  # of a multislice TPU: the slice that was lost (the whole attempt is)


class Failed(EventData):
    """An attempt failed; `kind` says what ended it. A final failure (`final: true`) ends the
    job; `rule` says why no recovery follows: the job's rule for that kind is `pass`, or its
    restart budget is `exhausted`."""

    event_type: ClassVar[str] = "failed"
    kind: FailureKind
    message: Opt[str] = UNSET
    exit_code: Opt[int | None] = UNSET
    worker: Opt[int | str | None] = UNSET
    final: Opt[bool] = UNSET
    rule: Opt[FinalRule] = UNSET
    history: Opt[list[FailureRecord]] = UNSET
    attempt: Opt[Count] = UNSET
    slice: Opt[Count] = UNSET  # of a multislice job: the slice of `worker`


class _FailedAsRead(Failed):
    # What verify accepts: the kinds written before the fix too (see LegacyFailureKind).
    kind: FailureKind | LegacyFailureKind


class _Recovery(EventData):
    attempt: Count
    restarts: Count
    rule: Opt[RecoveryRule] = UNSET
    reapply: Opt[bool] = UNSET
    kind: Opt[RecoveryCause] = UNSET
    signed: Opt[OverrideSignature] = UNSET  # an operator's `ledger resume` / `rerun`, signed


class Resumed(_Recovery):
    """The job runs again from its checkpoint (`reapply`: on a re-created TPU)."""

    event_type: ClassVar[str] = "resumed"


class Rerun(_Recovery):
    """The job runs again from scratch."""

    event_type: ClassVar[str] = "rerun"


class Finished(EventData):
    """Every selected worker exited 0."""

    event_type: ClassVar[str] = "finished"
    attempt: Opt[Count] = UNSET
    exit_codes: Opt[dict[str, int]] = UNSET
    exit_code: Opt[int | None] = UNSET


class Admitted(EventData):
    """An operator let this job past its quotas (`ledger admit`): admission no longer holds
    it back by a quota (the lab's capacity still counts), until it is submitted again."""

    event_type: ClassVar[str] = "admitted"
    reason: NonEmpty
    by: Opt[str] = UNSET
    manual: Opt[bool] = UNSET
    signed: Opt[OverrideSignature] = UNSET


class PolicyApplied(EventData):
    """The sharing policy a reconciler enforces from now on (stream `_policy`): the blocks of
    `.ledger/policy.yaml` that admission reads (quotas, priorities, fair_share, and the teams
    the quotas name), as the schema filled them. Recorded when it starts with a policy that
    differs from the last one recorded, so `ledger queue` and `inspect` explain by it."""

    event_type: ClassVar[str] = "policy_applied"
    digest: SpecHash  # SHA-256 of the blocks' canonical JSON
    blocks: dict[str, Any]
    source: Opt[str] = UNSET  # the file it was read from
    holder: Opt[str] = UNSET  # the reconciler that enforces it


class QuotaSpent(EventData):
    """A weekly chip-hours quota this running job counts against ran out (`scope` used `used`
    of its `limit` chip-hours of `family` over the last 7 days): by the policy's
    `quotas.on_spent`, the job runs to its end (`finish`) or is stopped at its next reported
    checkpoint (`checkpoint-and-stop`: a `preempted` event with cause `quota` follows) and
    waits for the quota. Recorded once per attempt."""

    event_type: ClassVar[str] = "quota_spent"
    scope: NonEmpty  # "user alice", "team @lab/nlp", "lab"
    family: NonEmpty
    used: Annotated[float, Meta(ge=0)]
    limit: Annotated[float, Meta(ge=0)]
    then: SpentAction
    attempt: Opt[Count] = UNSET


class Cancelled(EventData):
    """The job was stopped (and its TPU released) after a cancel request."""

    event_type: ClassVar[str] = "cancelled"
    reason: Opt[str] = UNSET


class Released(EventData):
    """A TPU was deleted, or a shared one handed back."""

    event_type: ClassVar[str] = "released"
    tpu: Opt[Tpu] = UNSET
    reason: Opt[str] = UNSET
    deleted: Opt[bool] = UNSET
    labels: Opt[dict[str, str]] = UNSET
    # False: the create failed and Google never gave the job this TPU (usage bills none of it).
    existed: Opt[bool] = UNSET


class Checkpointed(EventData):
    """The job reported a checkpoint: its output printed a line matching its checkpoint
    pattern (`job.checkpoints.pattern`) with a step newer than the last one recorded.
    Throttled by the reconciler (at most one per `job.checkpoints.every_s`)."""

    event_type: ClassVar[str] = "checkpointed"
    attempt: Count
    step: Count
    worker: Opt[Worker] = UNSET


class Price(_Part):
    """One price of the policy's table: USD per chip-hour of a family under a pricing model."""

    family: NonEmpty
    pricing: PricingModel
    usd_per_chip_hour: Annotated[float, Meta(ge=0)]


class PolicyChanged(EventData):
    """`.ledger/policy.yaml` changed in an ingested commit (on the `_policy` stream): the
    price table in force from this event on, as parsed (a broken or absent `prices` block
    records no prices: costs are then unknown, never guessed)."""

    event_type: ClassVar[str] = "policy_changed"
    commit: NonEmpty
    prices: list[Price]
    blob: Opt[str] = UNSET  # the policy file's blob; absent when the file was deleted
    branch: Opt[str] = UNSET
    broken: Opt[bool] = UNSET  # the file's `prices` block had errors (the table is empty)
    # The sharing rules in force from here (quotas, priorities, fair_share and the teams the
    # quotas name: `ledger.spec.policy.sharing_blocks`); what a reconciler without --policy follows.
    sharing: Opt[dict[str, Any]] = UNSET


class HistoryRewritten(EventData):
    """The watched branch no longer contains the last ingested commit: ingestion pauses."""

    event_type: ClassVar[str] = "history_rewritten"
    old_head: NonEmpty
    new_head: NonEmpty
    old_head_exists: Opt[bool] = UNSET


class RewriteAccepted(EventData):
    """An operator accepted a rewritten history: ingestion resumes from the new head."""

    event_type: ClassVar[str] = "rewrite_accepted"
    old_head: Opt[str] = UNSET
    new_head: Opt[str] = UNSET
    by: Opt[str] = UNSET


class ActionIntent(EventData):
    """The reconciler is about to act; recorded before the effect."""

    event_type: ClassVar[str] = "action_intent"
    action_id: NonEmpty
    action: ActionKind
    params: Opt[dict[str, Any]] = UNSET
    holder: Opt[str] = UNSET
    reason: Opt[str] = UNSET


class ActionOutcome(EventData):
    """How an intended action ended; an outcome that is not `ok` names its `error`."""

    event_type: ClassVar[str] = "action_outcome"
    # JSON Schema of the rule __post_init__ enforces (added to the generated schema).
    schema_extra: ClassVar[dict[str, Any]] = {
        "if": {"properties": {"ok": {"const": False}}}, "then": {"required": ["error"]},
    }
    action_id: NonEmpty
    ok: bool
    action: Opt[ActionKind] = UNSET
    result: Opt[Any] = UNSET
    error: Opt[str] = UNSET
    interrupted: Opt[bool] = UNSET
    api: Opt[ApiStatus] = UNSET  # the TPU API's error that failed the action, if that was it

    def __post_init__(self) -> None:
        if self.ok is False and self.error is UNSET:
            raise ValueError("an outcome that is not ok names its `error`")


class ApiUnreachable(EventData):
    """The TPU API of a zone could not be reached (or refused to list it) for a while (stream
    `_cloud`): nothing is decided about the zone's jobs until `api_reachable`. Recorded once
    per outage, however many tries it takes; the tries back off and record nothing."""

    event_type: ClassVar[str] = "api_unreachable"
    zone: NonEmpty
    api: ApiStatus
    since: Opt[str] = UNSET  # when the first failed call of the outage was made
    holder: Opt[str] = UNSET


class ApiReachable(EventData):
    """The zone's TPU API answers again (stream `_cloud`) after `down_s` seconds."""

    event_type: ClassVar[str] = "api_reachable"
    zone: NonEmpty
    down_s: Opt[Annotated[float, Meta(ge=0)]] = UNSET
    calls: Opt[Count] = UNSET  # calls tried while it was down
    holder: Opt[str] = UNSET


class Quarantined(EventData):
    """A commit the watcher could not turn into events at all (its error is not one a retry
    fixes): set aside once, with this event and one alert, so every later commit is still
    ingested. Its job files are not acted on; fix them in a new commit."""

    event_type: ClassVar[str] = "quarantined"
    commit: NonEmpty
    error: NonEmpty
    kind: Opt[str] = UNSET  # the exception's class, for the operator


class Note(EventData):
    """Free text for people, or a marker: `kind: ingested` records how far the watcher got."""

    event_type: ClassVar[str] = "note"
    text: Opt[str] = UNSET
    kind: Opt[Literal["ingested"]] = UNSET
    commit: Opt[str] = UNSET
    base: Opt[str | None] = UNSET
    governing: Opt[dict[str, str]] = UNSET  # path -> blob of the files that governed it
    events: Opt[Count] = UNSET


_CLASSES: tuple[type[EventData], ...] = (
    Submitted, Rejected, SpecUpdated, CancelRequested, Queued, Provisioning, Provisioned,
    ProvisionFailed, SetupStarted, SetupDone, SetupFailed, Started, Preempted, Failed, Resumed,
    Rerun, Finished, Admitted, QuotaSpent, PolicyApplied, Cancelled, Released, HistoryRewritten, RewriteAccepted,
    ActionIntent, ActionOutcome, Note, Quarantined, Checkpointed, PolicyChanged, ApiUnreachable, ApiReachable,
)

# Every type the domain knows, in the order the schema lists them.
EVENT_TYPES: tuple[str, ...] = tuple(c.event_type for c in _CLASSES)
# type -> the class writers construct.
DATA_TYPES: dict[str, type[EventData]] = {c.event_type: c for c in _CLASSES}
# type -> the class a stored event's data is checked with (the writers' class, or a wider
# one that also accepts what older versions wrote).
READ_TYPES: dict[str, type[EventData]] = {**DATA_TYPES, "failed": _FailedAsRead}


def check(value: Any, cls: Any, what: str) -> Any:
    """`value` as a `cls`, checked; EventDataError names the field when it does not fit."""
    try:
        return msgspec.convert(value, cls)
    except msgspec.ValidationError as exc:
        raise EventDataError(f"invalid {what}: {exc}", hint="a bug in the writer; nothing was recorded") from None


def encode(type_: str, data: EventData | Mapping[str, Any]) -> dict[str, Any]:
    """`data` checked against `type_`'s class, as the plain JSON value that is stored.

    Writers in the product pass an instance of the class; a mapping (tests, benchmarks,
    hand-written data) is held to the same class, a field it does not declare refused."""
    cls = DATA_TYPES.get(type_)
    if cls is None:
        raise EventDataError(f"unknown event type {type_!r}", hint="event types are the classes in ledger/events/data.py")
    if isinstance(data, EventData):
        if type(data) is not cls:
            raise EventDataError(f"a {type_!r} event cannot carry {type(data).__name__} data", hint=f"use {cls.__name__}")
        # Constructing a Struct checks nothing: the round trip through builtins does.
        value = msgspec.to_builtins(data)
        check(value, cls, f"{type_!r} data")
        return value
    value = msgspec.to_builtins(check(data, cls, f"{type_!r} data"))
    # msgspec drops fields a class does not declare; equal means none was (the usual case,
    # one comparison in C), else find it to say which (or a tuple just became a list).
    if value != data and (undeclared := _undeclared(data, _info(cls), "$")) is not None:
        raise EventDataError(f"{type_!r} data has no field {undeclared}", hint=f"declare it in {cls.__name__} (ledger/events/data.py)")
    return value


@functools.cache
def _info(cls: type) -> mi.Type:
    return mi.type_info(cls)


def _undeclared(value: Any, t: mi.Type, path: str) -> str | None:
    """The path of the first field in `value` that type `t` does not declare (msgspec
    would drop it silently), or None."""
    if isinstance(t, mi.StructType) and isinstance(value, Mapping):
        fields = {f.name: f.type for f in t.fields}
        for k, v in value.items():
            if k not in fields:
                return f"{path}.{k}"
            if (found := _undeclared(v, fields[k], f"{path}.{k}")) is not None:
                return found
    elif isinstance(t, mi.ListType) and isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if (found := _undeclared(v, t.item_type, f"{path}[{i}]")) is not None:
                return found
    elif isinstance(t, mi.DictType) and isinstance(value, Mapping):
        for k, v in value.items():
            if (found := _undeclared(v, t.value_type, f"{path}.{k}")) is not None:
                return found
    elif isinstance(t, mi.UnionType):
        for sub in t.types:
            if (found := _undeclared(value, sub, path)) is not None:
                return found
    return None
