"""The table of jobs that `ledger list` and `ledger replay` print: a row per job.

A module of its own so that `ledger list` loads only what the table needs, not what
`ledger replay` refreshes after a read (the usage and capacity folds, admission).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ledger.app.commands.common import print_table
from ledger.app.readmodels import last_change

JOB_COLUMNS = ("id", "owner", "state", "attempt", "restarts", "tpu", "last change")


def job_row(job: Any) -> tuple[str, ...]:
    """A job's cells: a JobState, or the few fields of one (`snapshots.jobs.lines_decoder`)."""
    tpu = job.tpu.get("name", "") if isinstance(job.tpu, dict) else ""
    return (job.id, job.owner, job.state or "-", str(job.attempt), str(job.restarts), tpu, last_change(job))


def print_jobs(jobs: Iterable[Any], title: str) -> None:
    print_table(title, JOB_COLUMNS, [job_row(job) for job in jobs], no_wrap=("id", "state"))
