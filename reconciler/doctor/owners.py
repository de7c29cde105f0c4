"""Whose is a process? The ledger's answer, from what it started and what the job's env says.

A process started for a job carries LEDGER_JOB_ID / LEDGER_ATTEMPT / LEDGER_WORKER_ID
(the start script exports them, and children inherit them, setsid daemons included); a
process whose env cannot be read still belongs to an attempt whose recorded pid is its
process group. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from reconciler.doctor.model import Context, Fix, Proc

Verdict = Literal["current", "earlier", "ended", "live", "unknown"]


@dataclass(frozen=True)
class Owner:
    verdict: Verdict
    label: str  # "alice/old-run, ended 2 h ago" / "this job's attempt 1" / "owner unknown"


def owner(p: Proc, worker: int, ctx: Context) -> Owner:
    if ctx.job_id and p.job == ctx.job_id or not p.job and p.pgid in ctx.started.get(worker, {}):
        attempt = p.attempt if p.job else ctx.started[worker][p.pgid]
        if attempt is not None and attempt >= ctx.attempt:
            return Owner("current", f"this job's attempt {attempt}")
        return Owner("earlier", f"this job's attempt {attempt if attempt is not None else '?'}")
    if p.job:
        info = ctx.jobs.get(p.job)
        if info is None:
            return Owner("unknown", f"{p.job}, a job this ledger does not know")
        if info.ended:
            return Owner("ended", f"{p.job}, ended {ago(ctx.now - info.ended_at) if info.ended_at else 'earlier'}")
        return Owner("live", f"{p.job}, {info.state}: a live job")
    return Owner("unknown", f"owner unknown: {p.cmd[:60] or 'no command line'}")


def kill(p: Proc, label: str, what: str) -> Fix:
    return Fix("kill", f"killed pid {p.pid} ({label}) {what}", pids=((p.pid, p.start_ticks),))


def ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s ago"
    if s < 2 * 3600:
        return f"{s // 60} min ago"
    if s < 2 * 86400:
        return f"{s // 3600} h ago"
    return f"{s // 86400} d ago"
