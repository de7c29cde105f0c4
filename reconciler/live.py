"""The jobs a pass looks at: every job the ledger knows except the settled ones.

A settled job has ended, holds no TPU and has no intent without its outcome: nothing a pass
decides can concern it. A lab's ledger keeps every job it ever ran, so without this view
every pass would walk its whole history (several times: admission, placement, the planner,
the probes), a cost that grows with the months and not with the work. The view is kept by
the streams each fold touched, so keeping it costs what the new events do.

A settled job is held apart, small (reconciler.shelf): looking one up by id (`find`) decodes
it, and an event for it brings it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ledger.fold import TERMINAL, JobState, LedgerState
from ledger.replay import no_cyclic_gc
from reconciler.shelf import Shelf


def settled(job: JobState) -> bool:
    """Ended, no TPU held, nothing under way: no pass has anything to do with it."""
    return job.state in TERMINAL and job.tpu is None and not job.pending_action


class LiveJobs:
    """`jobs`: the unsettled jobs of a `LedgerState`, by id (the same objects). The settled
    ones leave the state for `shelf` (reconciler.shelf), and come back into it when an event
    comes for them (`folding`), so the state holds what `jobs` holds."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobState] = {}
        self.shelf = Shelf()

    def rebuild(self, state: LedgerState, shelf: Shelf | None = None) -> None:
        """From the whole state (a fresh load), or from a state and the `shelf` of what its
        load kept apart (ledger.replay.load_state_apart)."""
        self.jobs, self.shelf = {}, shelf if shelf is not None else Shelf()
        with no_cyclic_gc():
            for job_id, job in list(state.jobs.items()):
                if settled(job):
                    self._shelve(state, job)
                else:
                    self.jobs[job_id] = job

    def folding(self, state: LedgerState, rows: Iterable[tuple], touched: set[str]) -> Iterator[tuple]:
        """The fold's rows (seq, stream, ...) as they are, each one's stream added to
        `touched`; a shelved job is put back into `state` before its first event is folded."""
        shelf, jobs = self.shelf, state.jobs
        for row in rows:
            stream = row[1]
            if stream not in touched:
                touched.add(stream)
                if stream in shelf:
                    jobs[stream] = shelf.take(stream)  # type: ignore[assignment]
                    state.owned.add(stream)  # a fresh object: the fold may change it in place
            yield row

    def refresh(self, state: LedgerState, touched: Iterable[str]) -> None:
        """After a fold: the streams it touched are what may have moved in or out (a fold
        may also have replaced a job's object with its copy)."""
        for job_id in touched:
            job = state.jobs.get(job_id)
            if job is None or settled(job):
                self.jobs.pop(job_id, None)
                if job is not None:
                    self._shelve(state, job)
            else:
                self.jobs[job_id] = job

    def find(self, state: LedgerState, job_id: str) -> JobState | None:
        """Any job the ledger knows, shelved or not (a shelved one decoded: a copy)."""
        job = state.jobs.get(job_id)
        return job if job is not None else self.shelf.get(job_id)

    def _shelve(self, state: LedgerState, job: JobState) -> None:
        self.shelf.put(job)
        del state.jobs[job.id]
        state.owned.discard(job.id)
