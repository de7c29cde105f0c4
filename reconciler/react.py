"""react: what the TPU API's answer to an action means for the job, as events. Pure: no I/O.

The executor performs the effect (a create, a delete) and hands the result here; the planner
does the same with what it observed of an operation or a queued resource that failed. Both
thus record the same events for the same answer, and only events the fold's table allows
from the states they are decided in (tests/reconciler/test_react.py checks every kind of
failure from every state).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.events import data as ev
from ledger.failures import CAPACITY, ApiFailure, kind_of, status, summary
from ledger.fold import JobState
from reconciler.tpu import Created

Events = list[ev.EventData]
_PRICING = frozenset({"spot", "ondemand", "preemptible", "reserved"})


def placement(job: JobState, tpu: Mapping[str, Any]) -> ev.Placement:
    """Where the TPU was asked for: zone, accelerator, pricing, kind, and which of the job's
    choices it was (`index`) with its slices (typed, for the capacity memory: ledger.capacity)."""
    want = job.spec.get("tpu") or {}
    pricing = tpu.get("pricing") or want.get("pricing", "ondemand")
    kind = tpu.get("kind")
    index, slices = tpu.get("placement"), tpu.get("slices")
    return ev.Placement(
        zone=str(tpu.get("zone") or want.get("zone") or ""),
        accelerator=str(tpu.get("accelerator") or want.get("accelerator") or ""),
        pricing=pricing if pricing in _PRICING else ev.UNSET,
        kind=kind if kind in ("node", "queued_resource") else ev.UNSET,
        index=index if type(index) is int and index > 0 else ev.UNSET,
        slices=slices if type(slices) is int and slices > 1 else ev.UNSET,
    )


def provisioned(job: JobState, params: Mapping[str, Any], answer: Created) -> Events:
    """The create was accepted: the job is provisioning this TPU."""
    tpu = params["tpu"]
    return [ev.Provisioning(attempt=params["attempt"], tpu=ev.tpu(tpu), how=answer.how,  # type: ignore[arg-type]
                            **({"operation": answer.operation} if answer.operation else {}))]


def refused(job: JobState, tpu: Mapping[str, Any], failure: ApiFailure, *, lost: bool = False) -> Events:
    """A create refused, in the call or in its operation (`lost`: after the job had recorded
    `provisioning`, so it must wait again whatever the kind).

    Capacity (stockout, quota): `queued`, with the API's answer and the placement, and the
    planner's backoff. Permanent: `provision_failed`, the job `blocked` with one line that
    says what to do. Transient: nothing when the call failed (the loop backs off and the
    action's outcome says it failed), `queued` to try again when a TPU asked for was lost."""
    kind = kind_of(failure)
    where = placement(job, tpu)
    api = status(failure)
    if kind in CAPACITY:
        what = "no quota" if kind == "quota" else "no capacity"
        return [ev.Queued(reason=f"{what} for {where.accelerator} in {where.zone}: {failure.message}"[:2000],
                          api=api, placement=where)]
    if kind == "permanent":
        return [ev.ProvisionFailed(reason=summary(failure), api=api, placement=where)]
    if lost:
        return [ev.Queued(reason=f"TPU {tpu.get('name', '?')} was not created ({summary(failure)}); retrying"[:2000],
                          api=api, placement=where)]
    return []


def lost_create(job: JobState, tpu: Mapping[str, Any], failure: ApiFailure | None) -> Events:
    """The create's operation ended without the TPU (`failure` is its error; None: it was
    accepted and the TPU then vanished): the TPU is no longer the job's, and Google never
    gave it (`existed` False: usage bills none of it); then what the failure means."""
    released = ev.Released(tpu=ev.tpu(tpu), reason="the create failed" if failure else "vanished while provisioning",
                           existed=False)
    if failure is None:
        return [released, ev.Queued(reason=f"TPU {tpu.get('name', '?')} vanished while provisioning; retrying")]
    return [released, *refused(job, tpu, failure, lost=True)]


def released(job: JobState, params: Mapping[str, Any]) -> Events:
    """A release done (the TPU deleted, or a shared one handed back), then what follows it:
    a retry on a new TPU, or what the API's refusal (`params["refused"]`, an ApiStatus as
    plain data) means."""
    tpu = params["tpu"]
    existed = {"existed": False} if params.get("refused") else {}
    events: Events = [ev.Released(tpu=ev.tpu(tpu), reason=params.get("next") or "job ended",
                                  deleted=not tpu.get("shared"), **existed)]
    if params.get("refused"):
        from_api = ApiFailure(**params["refused"])
        events += refused(job, tpu, from_api, lost=True)
    elif params.get("next") == "retry":
        events.append(ev.Queued(reason="retrying on a new TPU"))
    return events


def failure_params(failure: ApiFailure) -> dict[str, Any]:
    """An ApiFailure as the plain data an action's params carry (stored in its intent)."""
    return {"code": failure.code, "message": failure.message, "method": failure.method, "reason": failure.reason,
            "domain": failure.domain, "metadata": dict(failure.metadata), "in_operation": failure.in_operation,
            "resource": failure.resource}
