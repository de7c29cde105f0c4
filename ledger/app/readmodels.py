"""Answers to the ledger's questions, shaped once for every reader: the CLI's `--json` and the
dashboard's pages and `/api/` call these, so a script and a page never disagree.

Pure functions over the fold's states (`ledger.fold.JobState`); no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ledger.fold import JobState
from ledger.usage import CATEGORIES, UsageReport


def job_json(job: JobState) -> dict[str, Any]:
    """One job's state as `ledger list --json` and `ledger replay --json` print it.

    `times` is copied: it is the one field the fold edits in place, and a reader that
    encodes the answer later (the dashboard, while its tail folds new events) must not
    see it change under its feet."""
    out = job.to_dict()
    out["times"] = dict(job.times)
    return out


def tpu_rows(jobs: Iterable[JobState]) -> list[dict[str, Any]]:
    """`ledger tpus --json`: every TPU a job holds, and every shared TPU a live job waits for,
    in job id order."""
    rows = []
    for job in sorted(jobs, key=lambda j: j.id):
        if job.tpu:
            since = job.times.get("provisioned") or job.times.get("provisioning", "")
            rows.append({"tpu": job.tpu.get("name"), "zone": job.tpu.get("zone"), "accelerator": job.tpu.get("accelerator"),
                         "shared": bool(job.tpu.get("shared")), "job": job.id, "owner": job.owner,
                         "job_state": job.state, "since": since})
        elif not job.terminal and (want := job.spec.get("tpu") or {}).get("shared"):
            rows.append({"tpu": want.get("name"), "zone": want.get("zone"), "accelerator": want.get("accelerator"),
                         "shared": True, "job": job.id, "owner": job.owner, "job_state": f"waiting ({job.state})",
                         "since": job.times.get("queued", "")})
    return rows


def tpu_health(events: Iterable[Any]) -> dict[str, dict[str, str]]:
    """TPU name -> {"health", "time"} of the last host check on it (reconciler.doctor): the
    health a `started` event carries, a start refused as `host_unhealthy`, or the result of
    a `clean` (the checks' repairs). Events in ledger order."""
    on: dict[str, str] = {}
    out: dict[str, dict[str, str]] = {}
    for e in events:
        d = e.data or {}
        if e.type in ("provisioning", "provisioned") and isinstance(d.get("tpu"), dict):
            on[e.stream] = str(d["tpu"].get("name", ""))
        elif e.type == "started" and d.get("health") and on.get(e.stream):
            out[on[e.stream]] = {"health": str(d["health"]), "time": e.time}
        elif e.type == "failed" and d.get("kind") == "host_unhealthy" and on.get(e.stream):
            out[on[e.stream]] = {"health": "unhealthy", "time": e.time}
        elif e.type == "action_outcome" and d.get("action") == "clean" and isinstance(d.get("result"), dict):
            name = str(d["result"].get("tpu") or on.get(e.stream, ""))
            if name:
                out[name] = {"health": str(d["result"].get("health", "")), "time": e.time}
    return out


def accelerator_of(job: JobState) -> str:
    """The accelerator a job holds, or else the one its spec asks for."""
    held = job.tpu.get("accelerator") if isinstance(job.tpu, dict) else None
    asked = job.spec.get("tpu") if isinstance(job.spec, dict) else None
    return str(held or (asked.get("accelerator") if isinstance(asked, dict) else "") or "")


def last_change(job: JobState) -> str:
    """When the job's latest event happened (ISO UTC), '' for none."""
    return max(job.times.values()) if job.times else ""


# How `select_jobs` can order jobs: name -> key. Ties are broken by id, so a page is stable.
SORTS: dict[str, Any] = {
    "id": lambda j: j.id,
    "owner": lambda j: j.owner,
    "state": lambda j: j.state,
    "accelerator": accelerator_of,
    "attempt": lambda j: j.attempt,
    "restarts": lambda j: j.restarts,
    "changed": last_change,
    "submitted": lambda j: j.submitted_seq,
}


def select_jobs(jobs: Iterable[JobState], *, owner: str | None = None, state: str | None = None,
                accelerator: str | None = None, text: str | None = None, sort: str = "id",
                descending: bool = False) -> list[JobState]:
    """The jobs `ledger list` shows (and the dashboard's jobs page): filtered by owner, state,
    accelerator and a case-insensitive search in the id, TPU and accelerator, then sorted."""
    needle = text.lower() if text else None
    chosen = [
        j for j in jobs
        if (owner is None or j.owner == owner) and (state is None or j.state == state)
        and (accelerator is None or accelerator_of(j) == accelerator)
        and (needle is None or needle in j.id.lower() or needle in accelerator_of(j).lower()
             or (isinstance(j.tpu, dict) and needle in str(j.tpu.get("name", "")).lower()))
    ]
    chosen.sort(key=lambda j: j.id)
    if sort != "id" or descending:
        chosen.sort(key=SORTS[sort], reverse=descending)  # stable: ties stay in id order
    return chosen


def usage_json(report: UsageReport, since: str | None, until: str, position: int,
               prices: list[dict] | None = None) -> dict:
    """`ledger usage --json`: the report, the window it covers and the seq it stands at (the
    dashboard's usage page and /api/usage answer the same), and the prices in force at its
    end (`UsageFold.prices.in_force()`)."""
    return {"by": report.by, "since": since, "until": until, "position": position,
            "categories": list(CATEGORIES), "rows": [r.to_dict() for r in report.rows],
            "total": report.total.to_dict(), "missing_prices": list(report.missing),
            "prices_in_force": prices or []}
