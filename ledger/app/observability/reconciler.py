"""A reconciler's metrics and readiness: its passes, the TPU API and SSH through their hooks
(`Reconciler.pass_observers` and `snapshot_observers`, `TpuApi.observers`, `SSHPool.observers`), its fold's jobs and
queue, its leases and orphans at scrape time."""

from __future__ import annotations

import time
from typing import Any

from ledger import defaults
from ledger.app.observability.collectors import JobSources, stable_jobs
from ledger.app.observability.health import Check, recent_check
from ledger.app.observability.metrics import ReconcilerMetrics
from ledger.app.observability.service import Service
from ledger.app.queueview import waiting_summary
from reconciler.loop import Reconciler
from reconciler.membership import JOB_PREFIX, MEMBER_PREFIX
from reconciler.model import Action


class PassRecord:
    """What the last complete pass left: when, and how many orphans it planned to collect."""

    def __init__(self, metrics: ReconcilerMetrics) -> None:
        self.metrics = metrics
        self.last: float | None = None
        self.orphans: int | None = None

    def __call__(self, seconds: float, actions: list[Action]) -> None:
        self.metrics.pass_seconds.observe(seconds)
        self.orphans = sum(1 for a in actions if a.kind == "collect_orphan")
        self.last = time.time()


def member_lease(rec: Reconciler) -> bool | None:
    """Whether the reconciler holds its member lease (None: it runs without leases)."""
    if rec.membership is None:
        return None
    return rec.membership.keeper.holds(MEMBER_PREFIX + rec.config.holder)


def observe_reconciler(service: Service, rec: Reconciler, interval: float) -> PassRecord:
    metrics = ReconcilerMetrics(service.registry)
    rec.tpu.observers.append(metrics.api_call)
    pool = getattr(rec.runner, "pool", None)
    if pool is not None:
        pool.observers.append(metrics.ssh_event)
    rec.snapshot_observers.append(metrics.snapshot_saved)
    record = PassRecord(metrics)
    rec.pass_observers.append(record)
    holder = rec.config.holder

    def values() -> dict[str, Any]:
        held = member_lease(rec)
        jobs_held = None
        if rec.membership is not None:
            jobs_held = sum(1 for name in rec.membership.keeper.held() if name.startswith(JOB_PREFIX))
        return {
            "tpu_ledger_reconcile_last_success_timestamp_seconds": record.last,
            "tpu_ledger_orphaned_tpus": record.orphans,
            "tpu_ledger_lease_holder": None if held is None else [((holder,), 1 if held else 0)],
            "tpu_ledger_leases_held": jobs_held,
        }

    def queue() -> dict[str, Any]:
        return waiting_summary(stable_jobs(rec.live.jobs))

    service.gauges(values)
    service.jobs(JobSources(jobs=lambda: rec.state.jobs, policy=lambda: rec.config.policy, queue=queue,
                            settled=lambda: rec.live.shelf.states))
    max_age = max(defaults.READY_PASS_MIN_S, defaults.READY_PASS_INTERVALS * interval)
    service.readiness.add("pass", recent_check("pass", lambda: record.last, max_age))
    if rec.membership is not None:
        service.readiness.add("lease", lambda: Check(True, f"{holder} holds its member lease") if member_lease(rec)
                              else Check(False, f"{holder} does not hold its member lease (the store is unreachable, "
                                                "or another reconciler runs with the same --id)"))
    return record
