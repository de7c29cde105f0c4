"""Recovery rules per failure kind, and the `tpu` tool's shorthand rules mapped onto them.

Kinds: preempted (the TPU was taken back), grpc_error (the job died of a GRPC /
DEADLINE_EXCEEDED error: the TPU is fine, the run is not), failure (any other non-zero exit),
host_unhealthy (the checks before a start found what they may not repair: default reapply),
tpu_busy (the TPU was in use by another process: default resume, after the checks clean it).
Actions: reapply (delete and re-create the TPU, then resume), resume (run again on the same
TPU from the last checkpoint), rerun (from scratch), pass (record it, do nothing).
"""

from __future__ import annotations

from typing import Any

ACTIONS = ("reapply", "resume", "rerun", "pass")
KINDS = ("on_preempted", "on_grpc_error", "on_failure", "on_host_unhealthy", "on_tpu_busy")
# Host hygiene (reconciler.doctor): a host the checks cannot repair wants fresh hosts; a TPU
# another process held is cleaned by the checks before the next start, then resumed.
HOST_DEFAULTS = {"on_host_unhealthy": "reapply", "on_tpu_busy": "resume"}

# The `tpu` tool's `rule=` values (its README, "More on Resuming/Rerunning"), as stored in
# its job records ({"preempted": ..., "grpc": ...}).
SHORTHAND: dict[str, dict[str, str]] = {
    "pre": {"on_preempted": "reapply", "on_grpc_error": "resume"},  # default for preemptible TPUs
    "reapply": {"on_preempted": "reapply", "on_grpc_error": "reapply"},
    "rerun": {"on_preempted": "reapply", "on_grpc_error": "rerun"},
    "resume": {"on_preempted": "pass", "on_grpc_error": "resume"},  # default for other TPUs
    "pass": {"on_preempted": "pass", "on_grpc_error": "pass"},
}

PREEMPTIBLE_PRICING = ("spot", "preemptible")
DEFAULT_MAX_RESTARTS = 5
DEFAULT_ATTEMPT_FLAG = "--config.stage"


def default_rule(pricing: str | None) -> str:
    """spot/preemptible: reapply on preemption, resume on GRPC; others: resume on GRPC only."""
    return "pre" if pricing in PREEMPTIBLE_PRICING else "resume"


def resolve(raw: dict[str, Any] | None, pricing: str | None) -> dict[str, Any]:
    """Normalized recovery section from a schema-valid one (explicit keys beat the rule)."""
    raw = dict(raw or {})
    rule = raw.get("rule") or default_rule(pricing)
    out: dict[str, Any] = {"rule": rule, **SHORTHAND[rule], "on_failure": "pass", **HOST_DEFAULTS}
    for kind in KINDS:
        if raw.get(kind) is not None:
            out[kind] = raw[kind]
    out["max_restarts"] = int(raw.get("max_restarts", DEFAULT_MAX_RESTARTS))
    out["error_patterns"] = list(raw.get("error_patterns") or [])
    flag = raw.get("attempt_flag")
    passing = bool(raw.get("pass_attempt", flag is not None))
    out["pass_attempt"] = passing
    out["attempt_flag"] = (flag or DEFAULT_ATTEMPT_FLAG) if passing else None
    return out


def recovery_rules(spec: dict[str, Any]) -> dict[str, Any]:
    """The recovery rules of a normalized spec (computed from pricing if the section is absent)."""
    section = spec.get("recovery")
    if isinstance(section, dict) and all(k in section for k in (*KINDS[:3], "max_restarts")):
        out = resolve(section, None)  # a spec normalised before the host kinds existed gets their defaults
        out.update({k: section[k] for k in KINDS if k in section})
        return {k: out[k] for k in (*KINDS, "max_restarts", "error_patterns", "pass_attempt", "attempt_flag")}
    pricing = (spec.get("tpu") or {}).get("pricing") if isinstance(spec.get("tpu"), dict) else None
    out = resolve(section if isinstance(section, dict) else None, pricing)
    return {k: out[k] for k in (*KINDS, "max_restarts", "error_patterns", "pass_attempt", "attempt_flag")}
