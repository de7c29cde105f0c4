"""Recovery rules: which rule answers which failure, within the restart budget. Pure.

The kinds come from the `tpu` tool: preemption, GRPC errors in the output, other failures;
and from the host checks: a host they could not repair, a TPU held by another process.
`reapply` = delete and re-create the TPU, then resume; `resume` = run again on the same TPU
from the last checkpoint; `rerun` = start from scratch; `pass` = record and stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.spec.recovery import recovery_rules

# Failure kind (as recorded in `failed`/`preempted` events) -> the spec's rule field.
KIND_TO_RULE_FIELD = {
    "preempted": "on_preempted",
    "grpc": "on_grpc_error",
    "exit": "on_failure",
    "lost_host": "on_failure",
    "failure": "on_failure",
    "setup": "on_failure",
    "host_unhealthy": "on_host_unhealthy",
    "tpu_busy": "on_tpu_busy",
}


def rules_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The job's rules per kind and its restart budget. The spec package owns the defaults
    (by pricing, the `tpu` tool's shorthands); a spec normalised by it already carries them."""
    return recovery_rules(spec)


@dataclass(frozen=True, slots=True)
class Decision:
    rule: str  # reapply | resume | rerun | pass | exhausted
    reapply: bool  # the TPU must be deleted and re-created first
    resume: bool  # continue from the checkpoint (False = from scratch)
    message: str


def decide(spec: dict[str, Any], kind: str, restarts: int, *, tpu_usable: bool) -> Decision:
    """What to do after a failure of `kind`, having spent `restarts` of the budget.

    A TPU that is no longer usable (preempted, terminated) cannot host a resume: the rule
    is upgraded to re-create it first, as Google Cloud leaves a preempted VM dead.
    """
    rules = rules_of(spec)
    rule = rules.get(KIND_TO_RULE_FIELD.get(kind, "on_failure"), "pass")
    if rule == "pass":
        return Decision("pass", False, False, f"{kind}: rule is pass, job stops here")
    if restarts >= rules["max_restarts"]:
        return Decision(
            "exhausted", False, False, f"{kind}: restart budget of {rules['max_restarts']} spent"
        )
    reapply = rule == "reapply" or not tpu_usable
    return Decision(rule, reapply, rule != "rerun", f"{kind}: {rule}")
