"""A synthetic but realistic ledger: jobs that are submitted, provisioned, preempted and
recovered, with reconciler intents and outcomes, until they finish. Shared by the benchmark
and the tests so both exercise the same shapes of data."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from ledger.events import NewEvent, actor, format_time

_T0 = datetime(2026, 1, 1, tzinfo=UTC)
_RECONCILER = actor("reconciler", "reconciler@ledger-host")

_CYCLE = ("action_intent", "action_outcome", "preempted", "resumed", "provisioning", "provisioned",
          "setup_started", "setup_done", "started")


def spec_for(job: str) -> dict:
    owner, name = job.split("/")
    return {
        "job": {"name": name, "owner": owner, "priority": 5, "max_restarts": 1000, "tags": ["bench", "v4"]},
        "tpu": {"accelerator": "v4-32", "zone": "us-central2-b", "spot": True, "runtime": "tpu-ubuntu2204-base"},
        "command": {"run": f"python train.py --config configs/{name}.yaml", "workers": "all"},
        "recovery": {"preempted": "reapply", "grpc": "resume", "other": "pass"},
        "conda": {"env": "jax", "packages": ["jax[tpu]", "optax", "flax"]},
    }


def job_events(job: str, count: int, index: int) -> list[NewEvent]:
    """`count` events of one job's life, each with an idempotency key."""
    out: list[NewEvent] = []
    t = _T0 + timedelta(seconds=index)
    tpu = {"name": f"tpu-{index}", "zone": "us-central2-b", "kind": "node", "accelerator": "v4-32", "shared": False}
    spec = spec_for(job)
    spec_hash = hashlib.sha256(repr(spec).encode()).hexdigest()
    git = actor("git", "alice@example.com", approvers=["bob@example.com"])

    def add(type_: str, data: dict, who: dict = _RECONCILER) -> None:
        nonlocal t
        t += timedelta(seconds=7)
        out.append(NewEvent(type_, data, who, key=f"{job}:{len(out)}", time=format_time(t)))

    add("submitted", {"spec": spec, "spec_hash": spec_hash, "commit": "c0ffee" * 6 + "abcd",
                      "path": f"jobs/{job}.yaml", "author": "alice@example.com",
                      "approvers": ["bob@example.com"]}, git)
    add("queued", {"reason": "waiting for capacity"})
    add("provisioning", {"attempt": 1, "tpu": tpu})
    add("provisioned", {"tpu": tpu, "hosts": [{"worker": w, "address": f"10.0.{index % 250}.{w}", "port": 22} for w in range(4)]})
    add("setup_started", {"attempt": 1})
    add("setup_done", {})
    add("started", {"attempt": 1, "workers": [0, 1, 2, 3]})
    attempt = 1
    while len(out) < count - 2:
        step = _CYCLE[(len(out) - 7) % len(_CYCLE)]
        action_id = f"{job}:a{len(out)}"
        if step == "action_intent":
            add(step, {"action_id": action_id, "action": "provision", "params": {"tpu": tpu["name"]}})
        elif step == "action_outcome":
            add(step, {"action_id": f"{job}:a{len(out) - 1}", "ok": True, "result": {"state": "PREEMPTED"}})
        elif step == "preempted":
            add(step, {"reason": "TPU is being preempted", "tpu_state": "PREEMPTED"})
        elif step == "resumed":
            attempt += 1
            add(step, {"attempt": attempt, "restarts": attempt - 1, "rule": "reapply", "reapply": True})
        elif step == "provisioning":
            add(step, {"attempt": attempt, "tpu": tpu})
        elif step == "provisioned":
            add(step, {"tpu": tpu})
        else:
            add(step, {})
    add("finished", {"exit_code": 0})
    add("released", {"tpu": tpu, "reason": "job finished"})
    return out[:count]


def workload(events: int, jobs: int) -> Iterator[tuple[str, list[NewEvent]]]:
    """(job id, its events) for `jobs` jobs sharing `events` events (at least 9 per job)."""
    per_job = max(9, events // jobs)
    for i in range(jobs):
        job = f"user{i % 97}/job-{i:06d}"
        yield job, job_events(job, per_job, i)
