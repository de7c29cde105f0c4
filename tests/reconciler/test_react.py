"""react (reconciler/react.py): what each answer of the TPU API to a create means, from every
state a create is planned in, written only as events the fold's table allows."""

from __future__ import annotations

import pytest

from ledger import fold
from ledger.events import data as ev
from ledger.failures import ApiFailure, kind_of
from reconciler import react
from tests.reconciler.sim import API_FAULTS

TPU = {"name": "tl-a-b-12345678-a1", "zone": "us-central2-b", "kind": "node", "accelerator": "v4-8", "shared": False}
SPEC = {"tpu": {"accelerator": "v4-8", "zone": "us-central2-b", "pricing": "spot"}}
# Where the planner acquires a TPU (plan._acquire), and where a lost create is seen.
ACQUIRING = (fold.PENDING, fold.QUEUED, fold.RECOVERING)


def job_in(state: str) -> fold.JobState:
    job = fold.JobState(id="a/b", state=state, spec=SPEC, attempt=1)
    if state == fold.PROVISIONING:
        job.tpu = dict(TPU)
    return job


def failures() -> list[ApiFailure]:
    return [ApiFailure(code, f"{code} said the API", method="CreateNode", reason=reason, in_operation=in_op,
                       resource="projects/p/locations/us-central2-b")
            for code, reason in API_FAULTS for in_op in (False, True)]


@pytest.mark.parametrize("state", ACQUIRING)
def test_a_refused_create_records_only_legal_events_from_every_state_it_is_planned_in(state: str) -> None:
    for failure in failures():
        events = react.refused(job_in(state), TPU, failure)
        assert fold.illegal(job_in(state), [(d.event_type, d.to_builtins()) for d in events]) is None, (state, failure)
        kind = kind_of(failure)
        if kind == "permanent":
            assert [d.event_type for d in events] == ["provision_failed"]
            after = fold.evolve(job_in(state), "provision_failed", events[0].to_builtins())
            assert after.state == fold.BLOCKED and not after.terminal
        elif kind in ("stockout", "quota"):
            (queued,) = events
            assert isinstance(queued, ev.Queued) and queued.api.code == failure.code  # type: ignore[union-attr]
            assert queued.placement == ev.Placement(zone="us-central2-b", accelerator="v4-8", pricing="spot", kind="node")
        else:
            assert events == []  # transient: the outcome says it failed, nothing else is recorded


def test_a_create_that_failed_in_its_operation_releases_the_tpu_it_never_had_from_provisioning() -> None:
    for failure in [f for f in failures() if f.in_operation] + [None]:
        events = react.lost_create(job_in(fold.PROVISIONING), TPU, failure)
        assert fold.illegal(job_in(fold.PROVISIONING), [(d.event_type, d.to_builtins()) for d in events]) is None
        assert events[0].existed is False  # type: ignore[union-attr]


def test_the_table_is_what_the_writer_checks_against() -> None:
    """A refused create from `pending` (what made ledgers unsound) is legal now, and a
    transition the table forbids is named."""
    pending = job_in(fold.PENDING)
    assert fold.illegal(pending, [("provision_failed", {"reason": "x"})]) is None
    assert fold.illegal(pending, [("finished", {})]) == "finished from pending"


def test_a_blocked_job_is_unblocked_by_a_new_spec_a_resume_or_a_cancel() -> None:
    blocked = fold.evolve(job_in(fold.PENDING), "provision_failed", {"reason": "PERMISSION_DENIED: ..."})
    assert blocked.state == fold.BLOCKED
    assert fold.evolve(blocked, "spec_updated", {"spec": SPEC, "spec_hash": "ab" * 8}).state == fold.PENDING
    assert fold.evolve(blocked, "resumed", {"attempt": 2, "restarts": 0, "rule": "manual"}).state == fold.RECOVERING
    assert fold.evolve(blocked, "cancel_requested", {}).state == fold.CANCELLING


def test_a_blocked_job_is_tried_again_once_the_policy_changes() -> None:
    """The planner: blocked before the policy in force was recorded -> queued to try again;
    blocked after it -> nothing (no API call)."""
    from reconciler.model import Observed, PlanConfig
    from reconciler.plan import plan

    blocked = fold.evolve(job_in(fold.PENDING), "provision_failed", {"reason": "PERMISSION_DENIED: ..."},
                          time="2026-11-25T10:00:00.000000Z")
    obs = Observed(now=0.0, zones=frozenset({"us-central2-b"}))
    assert plan({"a/b": blocked}, obs, config=PlanConfig(policy_since="2026-11-25T09:00:00.000000Z")) == []
    (action,) = plan({"a/b": blocked}, obs, config=PlanConfig(policy_since="2026-11-25T11:00:00.000000Z"))
    (queued,) = action.params["events"]
    assert action.kind == "record" and isinstance(queued, ev.Queued)
    assert fold.evolve(blocked, "queued", queued.to_builtins()).state == fold.QUEUED
