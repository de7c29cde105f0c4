"""The failure classification (ledger/failures.py): every status of the TPU API, in the call
and in the operation, maps to one kind; the one-line summary says what to do."""

from __future__ import annotations

import pytest

from ledger.failures import ApiFailure, kind_of, status, summary

CASES = [
    # (code, reason, method, in_operation) -> kind
    ("UNAVAILABLE", "", "ListNodes", False, "transient"),
    ("DEADLINE_EXCEEDED", "", "CreateNode", False, "transient"),
    ("INTERNAL", "", "CreateNode", True, "transient"),
    ("ABORTED", "", "DeleteNode", False, "transient"),
    ("CANCELLED", "", "CreateNode", True, "transient"),
    ("UNKNOWN", "", "GetNode", False, "transient"),
    ("RESOURCE_EXHAUSTED", "", "CreateNode", True, "stockout"),
    ("RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", "CreateNode", False, "quota"),
    ("RESOURCE_EXHAUSTED", "RATE_LIMIT_EXCEEDED", "ListNodes", False, "transient"),
    ("PERMISSION_DENIED", "IAM_PERMISSION_DENIED", "CreateNode", True, "permanent"),
    ("UNAUTHENTICATED", "ACCESS_TOKEN_EXPIRED", "ListNodes", False, "permanent"),
    ("INVALID_ARGUMENT", "", "CreateNode", False, "permanent"),
    ("NOT_FOUND", "", "CreateNode", False, "permanent"),  # the zone (the parent) is unknown
    ("NOT_FOUND", "", "GetNode", False, "absent"),
    ("NOT_FOUND", "", "DeleteNode", True, "absent"),
    ("ALREADY_EXISTS", "", "CreateNode", False, "exists"),
    ("FAILED_PRECONDITION", "", "CreateNode", False, "permanent"),
    ("FAILED_PRECONDITION", "", "DeleteNode", False, "transient"),  # being deleted: passes
]


@pytest.mark.parametrize(("code", "reason", "method", "in_op", "kind"), CASES)
def test_each_status_has_one_kind(code: str, reason: str, method: str, in_op: bool, kind: str) -> None:
    failure = ApiFailure(code, "msg", method=method, reason=reason, in_operation=in_op)
    assert kind_of(failure) == kind
    assert status(failure).kind == kind


def test_quota_is_told_from_stockout_by_the_message_when_no_reason_is_given() -> None:
    assert kind_of(ApiFailure("RESOURCE_EXHAUSTED", "Quota 'TPUV4PodPerProjectPerZone' exceeded", method="CreateNode")) == "quota"
    assert kind_of(ApiFailure("RESOURCE_EXHAUSTED", "There is no more capacity in the zone", method="CreateNode")) == "stockout"


def test_a_permission_error_says_what_was_denied_where_and_what_to_do() -> None:
    failure = ApiFailure("PERMISSION_DENIED", "Permission 'tpu.nodes.create' denied", method="CreateNode",
                         reason="IAM_PERMISSION_DENIED", domain="iam.googleapis.com",
                         metadata={"permission": "tpu.nodes.create", "resource": "projects/P/locations/Z"})
    line = summary(failure)
    assert line.startswith("PERMISSION_DENIED: tpu.nodes.create on projects/P/locations/Z: grant roles/tpu.admin "
                           "to the reconciler's service account")
    assert "\n" not in line
    assert status(failure).permission == "tpu.nodes.create"


def test_a_failure_inside_the_operation_says_so() -> None:
    line = summary(ApiFailure("PERMISSION_DENIED", "denied", method="CreateNode", in_operation=True, resource="projects/P/locations/Z"))
    assert "(in the operation)" in line


def test_a_ledger_holding_the_old_refused_create_verifies_and_its_job_can_be_resumed(tmp_path) -> None:
    """What a reconciler before the fix wrote for a create refused outright: `provision_failed`
    (final) while the job was `pending`. `ledger verify` called that ledger unsound for good;
    the transition is legal now, so it verifies as it is, and `ledger resume` applies."""
    from ledger.events import NewEvent, actor
    from ledger.fold import FAILED_FINAL, replay
    from ledger.spec.model import spec_hash
    from ledger.store import open_store
    from ledger.verify import verify_store

    spec = {"tpu": {"accelerator": "v4-8", "zone": "us-nowhere1-a"}}
    store = open_store(f"sqlite:///{tmp_path / 'ledger.db'}")
    store.append("bob/zone", [NewEvent("submitted", {"spec": spec, "spec_hash": spec_hash(spec), "commit": "c0ffee00",
                                                     "path": "jobs/bob/zone.yaml"}, actor("git", "bob"))])
    store.append("bob/zone", [NewEvent("provision_failed", {"reason": "Google refused v4-8 in us-nowhere1-a: unknown zone",
                                                            "final": True}, actor("reconciler", "old"))])
    assert verify_store(store).ok
    job = replay(store.read_all()).jobs["bob/zone"]
    assert job.state == FAILED_FINAL and not job.anomalies
    store.close()
