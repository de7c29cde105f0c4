"""Plain data the planner reads (observations) and writes (actions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger import defaults
from ledger.failures import ApiFailure
from ledger.spec.policy import Policy

# Node states as the TPU API names them (google.cloud.tpu_v2.Node.State).
NODE_READY = "READY"
NODE_CREATING = "CREATING"
NODE_GONE_STATES = frozenset({"PREEMPTED", "TERMINATED"})
QR_LOST_STATES = frozenset({"SUSPENDED", "SUSPENDING", "FAILED"})
QR_WAITING_STATES = frozenset({"ACCEPTED", "WAITING_FOR_RESOURCES", "CREATING", "PROVISIONING"})


@dataclass(frozen=True, slots=True)
class NodeObs:
    name: str  # short node id
    zone: str
    state: str
    labels: dict[str, str] = field(default_factory=dict)
    hosts: tuple[dict[str, Any], ...] = ()  # {worker, address, port}
    health: str = ""
    create_time: float = 0.0  # epoch seconds
    accelerator: str = ""
    queued_resource: str = ""  # the id of the queued resource that asked for it (any slice of one)


@dataclass(frozen=True, slots=True)
class QueuedObs:
    name: str
    zone: str
    state: str
    node_name: str = ""
    message: str = ""  # failed_data / waiting reason
    error: ApiFailure | None = None  # why it FAILED, when the API says


@dataclass(frozen=True, slots=True)
class OperationObs:
    """A create's long-running operation, looked up when its TPU never showed."""

    name: str
    done: bool
    error: ApiFailure | None = None


@dataclass(frozen=True, slots=True)
class HostObs:
    state: str  # running | exited | gone | unknown | not_started
    exit_code: int | None = None
    matches: tuple[str, ...] = ()  # failure kinds matched in new output: grpc, preempted, failure
    error: str | None = None
    checkpoint: int | None = None  # the newest checkpoint step the attempt printed on this host


@dataclass(slots=True)
class Observed:
    """What the TPU API and the hosts said at `now`. A zone missing from `zones` was not
    observed (API error): the planner does not conclude anything about its nodes."""

    now: float
    zones: frozenset[str] = frozenset()
    nodes: dict[str, NodeObs] = field(default_factory=dict)  # by node name
    queued: dict[str, QueuedObs] = field(default_factory=dict)  # by queued-resource name
    hosts: dict[str, dict[int, HostObs]] = field(default_factory=dict)  # job id -> worker -> status
    # job id -> when the probe first saw one of its workers gone or killed while the node
    # read READY: the planner waits for the TPU API to say why before choosing a kind.
    suspect_since: dict[str, float] = field(default_factory=dict)
    # Operation name -> what it says (only the creates of TPUs that never showed are asked).
    operations: dict[str, OperationObs] = field(default_factory=dict)
    # Zone -> why the API refused to list it for good (a permission, an unknown zone): the
    # jobs that want a TPU there are told, instead of waiting for a zone never observed.
    refused: dict[str, ApiFailure] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Action:
    """One thing to do for one job. `kind` names the executor; `params` is plain data."""

    kind: str
    job_id: str
    params: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PlanConfig:
    orphan_grace_s: float = defaults.ORPHAN_GRACE_S
    queued_retry_s: float = 10.0  # first retry after capacity ran out; doubles, capped
    queued_retry_max_s: float = 300.0
    provision_timeout_s: float = 1800.0
    holder: str = "reconciler"  # this reconciler's id: its own unfinished intents are resolved at once
    intent_timeout_s: float = 600.0  # another reconciler's intent older than this is taken over
    policy: Policy | None = None  # quotas, priority classes, fair share (reconciler.admission); None = admit all
    lost_host_confirm_s: float = defaults.LOST_HOST_CONFIRM_S
    release_refused_retry_s: float = defaults.RELEASE_REFUSED_RETRY_S
    # When the policy in force was last recorded (the `_policy` stream's newest event, ISO
    # UTC): a job the TPU API blocked before that is tried again.
    policy_since: str = ""
