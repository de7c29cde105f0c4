"""What a failure of the Cloud TPU API means: one kind per status. Pure: no I/O.

The TPU adapter (reconciler/tpu.py) turns every error the API returns, in the call or inside
its long-running operation, into an `ApiFailure` (plain data: the canonical status, its
message, and google.rpc.ErrorInfo's reason and domain when the API sent one). `kind_of`
says what it means, and every decision about it is taken from that kind:

- `transient`: try again later, with backoff, and record nothing per try
  (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ABORTED, CANCELLED, UNKNOWN, a rate limit);
- `stockout` / `quota`: the capacity path (the job waits in `queued`, with the API's answer);
- `permanent`: the same request will be refused again until someone changes something
  (PERMISSION_DENIED, UNAUTHENTICATED, INVALID_ARGUMENT, FAILED_PRECONDITION, an unknown
  zone, runtime version or accelerator): the job is `blocked`, and says why in one line;
- `absent` / `exists`: NOT_FOUND of what was read or deleted, ALREADY_EXISTS of what was
  created: no failure at all, the answer the caller wanted (gone; ours already).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ledger.events import data as ev
from ledger.tpu_types import PERMISSIONS

Kind = Literal["transient", "stockout", "quota", "permanent", "absent", "exists"]
CAPACITY: frozenset[str] = frozenset({"stockout", "quota"})

# The canonical codes (google/rpc/code.proto) that say "try again": the service could not
# answer now, not that the request is wrong.
TRANSIENT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "ABORTED", "CANCELLED", "UNKNOWN"})
# ErrorInfo reasons (domain googleapis.com) of RESOURCE_EXHAUSTED that are a request rate,
# not chips: they clear within a minute, so they are transient.
RATE_REASONS = frozenset({"RATE_LIMIT_EXCEEDED", "CONSUMER_RATE_LIMIT_EXCEEDED"})
# ... and those that are an allocation quota (chips per project and zone): the capacity path.
QUOTA_REASONS = frozenset({"QUOTA_EXCEEDED", "RESOURCE_QUOTA_EXCEEDED", "QUOTA_LIMIT_EXCEEDED"})
# Methods that create: NOT_FOUND there is the parent (an unknown zone), not the resource.
CREATES = frozenset({"CreateNode", "CreateQueuedResource"})
# Methods whose target may legitimately be gone or going: NOT_FOUND means absent, and a
# FAILED_PRECONDITION (a node being deleted, stopped, created) passes with time.
TARGETED = frozenset({"GetNode", "GetQueuedResource", "DeleteNode", "DeleteQueuedResource",
                      "GetOperation", "GetGuestAttributes", "StopNode", "StartNode"})


@dataclass(frozen=True, slots=True)
class ApiFailure:
    """One error of the TPU API, as data. `method` is the RPC's name ("CreateNode");
    `in_operation`: the call was accepted and its long-running operation ended in this error."""

    code: str  # canonical status name: "PERMISSION_DENIED"
    message: str = ""
    method: str = ""
    reason: str = ""  # google.rpc.ErrorInfo.reason, when the API sent one
    domain: str = ""  # google.rpc.ErrorInfo.domain
    metadata: dict[str, str] = field(default_factory=dict)  # ErrorInfo.metadata (permission, resource, ...)
    in_operation: bool = False
    resource: str = ""  # what was asked for: projects/P/locations/Z[/nodes/N]

    @property
    def kind(self) -> Kind:
        return kind_of(self)


def kind_of(f: ApiFailure) -> Kind:
    code = f.code.upper()
    if code == "NOT_FOUND":
        return "absent" if f.method in TARGETED else "permanent"
    if code == "ALREADY_EXISTS":
        return "exists" if f.method in CREATES else "permanent"
    if code == "RESOURCE_EXHAUSTED":
        if f.reason in RATE_REASONS:
            return "transient"
        if f.reason in QUOTA_REASONS or "quota" in f.message.lower():
            return "quota"
        return "stockout"
    if code == "FAILED_PRECONDITION" and f.method in TARGETED:
        return "transient"
    if code in TRANSIENT_CODES:
        return "transient"
    return "permanent"


# What to do about a permanent failure, by the ErrorInfo reason first, then by the code.
_REASON_HINTS = {
    "IAM_PERMISSION_DENIED": "grant roles/tpu.admin to the reconciler's service account",
    "SERVICE_DISABLED": "enable the Cloud TPU API: gcloud services enable tpu.googleapis.com",
    "ACCESS_TOKEN_EXPIRED": "refresh the credentials: gcloud auth application-default login",
    "CREDENTIALS_MISSING": "set up Application Default Credentials: gcloud auth application-default login",
    "BILLING_DISABLED": "enable billing on the project",
}
_CODE_HINTS = {
    "PERMISSION_DENIED": "grant roles/tpu.admin to the reconciler's service account",
    "UNAUTHENTICATED": "set up Application Default Credentials: gcloud auth application-default login, "
                       "or GOOGLE_APPLICATION_CREDENTIALS",
    "INVALID_ARGUMENT": "check tpu.accelerator, tpu.zone and tpu.version in the job spec",
    "NOT_FOUND": "check tpu.zone (and tpu.accelerator, tpu.version) in the job spec",
    "FAILED_PRECONDITION": "check the job spec and the project's state, then `ledger resume`",
    "UNIMPLEMENTED": "the endpoint does not serve this method of the Cloud TPU v2 API",
}


def hint(f: ApiFailure) -> str:
    """What a person should do about `f` (empty for kinds nobody needs to act on)."""
    kind = kind_of(f)
    if kind == "quota":
        return "ask for more TPU quota in the project, or wait for chips to free up"
    if kind == "stockout":
        return "the zone has no capacity now: the job waits and tries again"
    if kind != "permanent":
        return ""
    return _REASON_HINTS.get(f.reason) or _CODE_HINTS.get(f.code.upper(), "fix the cause, then `ledger resume` the job")


def summary(f: ApiFailure) -> str:
    """One line for people: the code, what was refused on what, and what to do, e.g.
    "PERMISSION_DENIED: tpu.nodes.create on projects/P/locations/Z: grant roles/tpu.admin ..."."""
    what = f.metadata.get("permission") or (PERMISSIONS.get(f.method, f.method) if f.code.upper() == "PERMISSION_DENIED" else f.method)
    where = f.metadata.get("resource") or f.resource
    head = f.code.upper() + (f": {what}" if what else "") + (f" on {where}" if where else "")
    if f.in_operation:
        head += " (in the operation)"
    tail = hint(f)
    message = " ".join(f.message.split())[:300]
    if f.code.upper() == "PERMISSION_DENIED" and what:
        message = ""  # the API's words only repeat the permission and the resource
    return ": ".join(p for p in (head, tail or message) if p) + (f" ({message})" if tail and message else "")


def status(f: ApiFailure) -> ev.ApiStatus:
    """`f` as the typed part events carry (`api`)."""
    permission = f.metadata.get("permission") or (PERMISSIONS.get(f.method, "") if f.code.upper() == "PERMISSION_DENIED" else "")
    given = {"message": f.message[:2000], "method": f.method, "reason": f.reason, "domain": f.domain,
             "resource": f.metadata.get("resource") or f.resource, "permission": permission}
    return ev.ApiStatus(code=f.code.upper(), kind=kind_of(f), in_operation=True if f.in_operation else ev.UNSET,
                        **{k: v for k, v in given.items() if v})


def from_status(d: Mapping[str, Any]) -> ApiFailure:
    """An `ApiStatus` read back from an event (or an observation) as an `ApiFailure`."""
    meta = {k: str(d[k]) for k in ("permission", "resource") if d.get(k)}
    return ApiFailure(code=str(d.get("code", "UNKNOWN")), message=str(d.get("message", "")), method=str(d.get("method", "")),
                      reason=str(d.get("reason", "")), domain=str(d.get("domain", "")), metadata=meta,
                      in_operation=bool(d.get("in_operation")), resource=str(d.get("resource", "")))
