"""The jobs a pass looks at: every job the ledger knows except the settled ones.

A settled job has ended, holds no TPU and has no intent without its outcome: nothing a pass
decides can concern it. A lab's ledger keeps every job it ever ran, so without this view
every pass would walk its whole history (several times: admission, placement, the planner,
the probes), a cost that grows with the months and not with the work. The view is kept by
the streams each fold touched, so keeping it costs what the new events do.

Looking a job up by id still goes to the whole state: a settled job is only left out of the
walks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ledger.fold import TERMINAL, JobState, LedgerState


def settled(job: JobState) -> bool:
    """Ended, no TPU held, nothing under way: no pass has anything to do with it."""
    return job.state in TERMINAL and job.tpu is None and not job.pending_action


class LiveJobs:
    """`jobs`: the unsettled jobs of a `LedgerState`, by id (the same objects)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobState] = {}

    def rebuild(self, state: LedgerState) -> None:
        """From the whole state (a fresh load)."""
        self.jobs = {job_id: job for job_id, job in state.jobs.items() if not settled(job)}

    def refresh(self, state: LedgerState, touched: Iterable[str]) -> None:
        """After a fold: the streams it touched are what may have moved in or out (a fold
        may also have replaced a job's object with its copy)."""
        for job_id in touched:
            job = state.jobs.get(job_id)
            if job is None or settled(job):
                self.jobs.pop(job_id, None)
            else:
                self.jobs[job_id] = job


def noting_streams(rows: Iterable[tuple], touched: set[str]) -> Iterator[tuple]:
    """The fold's rows (seq, stream, ...) as they are, each one's stream added to `touched`."""
    for row in rows:
        touched.add(row[1])
        yield row
