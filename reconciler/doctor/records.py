"""The doctor and the ledger: what the ledger knows of the processes it started, and the
intent + outcome of every repair, recorded before and after it acts."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from ledger.events import NewEvent, event_id
from ledger.events import data as ev
from ledger.fold import JobState, replay
from ledger.store import Reader, Store
from reconciler.doctor.model import Context, JobInfo
from reconciler.doctor.run import Doctor, Repair, Report


class LedgerJobs(Mapping[str, JobInfo]):
    """Jobs read from the ledger when a process names one (rarely more than a few)."""

    def __init__(self, store: Reader) -> None:
        self.store = store
        self._cache: dict[str, JobInfo | None] = {}

    def __getitem__(self, job_id: str) -> JobInfo:
        if job_id not in self._cache:
            events = self.store.read_stream(job_id)
            job = replay(events).jobs.get(job_id) if events else None
            self._cache[job_id] = None if job is None else info(job)
        found = self._cache[job_id]
        if found is None:
            raise KeyError(job_id)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(k for k, v in self._cache.items() if v is not None)

    def __len__(self) -> int:
        return sum(1 for v in self._cache.values() if v is not None)


def info(job: JobState) -> JobInfo:
    ended_at = _epoch(max(job.times.values())) if job.terminal and job.times else None
    return JobInfo(state=job.state, ended=job.terminal, ended_at=ended_at, attempt=job.attempt)


def _epoch(iso: str) -> float | None:
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def started_pids(events: Sequence[Any], attempt: int, tpu: str) -> dict[int, dict[int, int]]:
    """worker -> {pid: attempt} of the earlier attempts this job started on TPU `tpu`. Pure."""
    out: dict[int, dict[int, int]] = {}
    on = ""
    for e in events:
        if e.type in ("provisioning", "provisioned"):
            on = ((e.data or {}).get("tpu") or {}).get("name", on)
        elif e.type == "started" and on == tpu:
            a = (e.data or {}).get("attempt")
            if a is None or a >= attempt:
                continue
            for w, pid in ((e.data or {}).get("pids") or {}).items():
                out.setdefault(int(w), {})[int(pid)] = int(a)
    return out


def context(store: Reader, job: JobState | None, *, tpu: Mapping[str, Any] | None = None) -> Context:
    """The checks' context for `job` (None: a TPU no job holds), from the ledger."""
    held = tpu or (job.tpu if job else None) or {}
    name = str(held.get("name", ""))
    started = started_pids(store.read_stream(job.id), job.attempt, name) if job else {}
    return Context(job_id=job.id if job else None, attempt=job.attempt if job else 0,
                   spec=job.spec if job else {}, tpu=name, shared=bool(held.get("shared")),
                   started=started, jobs=LedgerJobs(store), now=time.time())


def clean(doctor: Doctor, store: Store, job: JobState, hosts: Sequence[Any], report: Report,
          ctx: Context, actor: dict[str, Any], *, key: str, holder: str = "", reason: str) -> tuple[Report, dict[str, Any]]:
    """Record what was found (intent), repair it, record what was done (outcome). Returns the
    report after the repairs (a fresh look) and the outcome's result."""
    action_id = event_id(job.id, key)
    found = [f.to_dict() for f in report.findings if f.status != "ok"]
    # `tpu_name`, not `tpu`: the planner reads a pending intent's params.tpu as a TPU dict
    intent = ev.ActionIntent(action_id=action_id, action="clean", params={"found": found, "tpu_name": ctx.tpu},
                             holder=holder, reason=reason)
    res = store.append(job.id, [NewEvent("action_intent", intent, actor, key=key)])
    if res.duplicate:
        return report, {}
    repairs = doctor.repair(report, hosts)
    after = repaired(report, repairs)
    result = {
        "tpu": ctx.tpu, "health": "unhealthy" if after.failures or any(not r.ok for r in repairs) else "fixed",
        "done": [{"worker": r.finding.worker, "check": r.finding.check, "what": r.finding.fix.done}
                 for r in repairs if r.ok and r.finding.fix is not None],
        "failed": [{"worker": r.finding.worker, "check": r.finding.check, "what": r.finding.message}
                   for r in repairs if not r.ok],
    }
    ok = not result["failed"]
    outcome = ev.ActionOutcome(action_id=action_id, action="clean", ok=ok, result=result,
                               **({} if ok else {"error": f"{len(result['failed'])} repair(s) failed"}))
    store.append(job.id, [NewEvent("action_outcome", outcome, actor, key=f"{action_id}:outcome")])
    return after, result


def repaired(report: Report, repairs: Sequence[Repair]) -> Report:
    """The report once the repairs ran, without probing again: each repair checked at the
    moment it acted that it was still safe and that it worked (the pid gone, no holder of the
    lock left, gcsfuse's exit status), so its answer is the host's state. Pure."""
    ok = {(r.finding.worker, r.finding.fix) for r in repairs if r.ok}
    tried = {(r.finding.worker, r.finding.fix) for r in repairs}
    findings = []
    for f in report.findings:
        if f.status != "fix" or (f.worker, f.fix) not in tried:
            findings.append(f)
        elif (f.worker, f.fix) in ok and f.fix is not None:
            findings.append(replace(f, status="ok", message=f.fix.done, fix=None))
        else:
            findings.append(replace(f, status="fail", message=f"{f.message} (the repair failed)", fix=None))
    return Report(report.facts, findings)


class Gate:
    """The checks before every start (the executor calls it): repairs what is safe, and
    says what cannot be repaired. Returns (health, problem or None)."""

    def __init__(self, doctor: Doctor, holder: str = "") -> None:
        self.doctor = doctor
        self.holder = holder

    def __call__(self, store: Store, job: JobState, hosts: Sequence[Any], actor: dict[str, Any]) -> tuple[str, str | None]:
        ctx = context(store, job)
        report = _judged(self.doctor.examine(hosts, ctx))
        if not report.fixable:
            return (report.health, None) if not report.failures else ("unhealthy", report.problem())
        after, _ = clean(self.doctor, store, job, hosts, report, ctx, actor, key=f"v{job.version}:clean",
                         holder=self.holder, reason="host check before start")
        after = _judged(after)
        # repaired, yet still there: the host is not fit to start on
        after.findings = [f if f.status != "fix" else replace(f, status="fail", message=f"{f.message} (the repair did not hold)")
                          for f in after.findings]
        return ("fixed", None) if not after.failures else ("unhealthy", after.problem())


def _judged(report: Report) -> Report:
    """A host the probe could not reach is not judged before a start: the start reaches for it
    next and fails its own way (a lost host), as it did before the checks."""
    report.findings = [f for f in report.findings if f.check != "ssh"]
    return report
