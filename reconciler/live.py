"""The jobs a pass looks at: every job the ledger knows except the settled ones.

A settled job has ended, holds no TPU and has no intent without its outcome: nothing a pass
decides can concern it. A lab's ledger keeps every job it ever ran, so without this view
every pass would walk its whole history (several times: admission, placement, the planner,
the probes), a cost that grows with the months and not with the work. The view is kept by
the streams each fold touched, so keeping it costs what the new events do.

A settled job (ledger.shelf.settled) is held apart, small (reconciler.shelf): looking one up by id (`find`) decodes
it, and an event for it brings it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ledger.fold import JobState, LedgerState
from ledger.replay import no_cyclic_gc
from ledger.shelf import settled
from reconciler.shelf import Shelf


class LiveJobs:
    """The reconciler's fold, kept to the jobs a pass walks: `state` holds the unsettled
    jobs only (`jobs`); the settled ones leave it for `shelf` (reconciler.shelf) after the
    fold that settled them, and come back into it before an event for them is folded."""

    def __init__(self) -> None:
        self.state = LedgerState()
        self.shelf = Shelf()

    @property
    def jobs(self) -> dict[str, JobState]:
        return self.state.jobs

    def rebuild(self, state: LedgerState, shelf: Shelf | None = None) -> None:
        """From a freshly loaded state, and the `shelf` of what its load kept apart, if any
        (ledger.replay.load_state_apart): its settled jobs go to the shelf."""
        self.state, self.shelf = state, shelf if shelf is not None else Shelf()
        with no_cyclic_gc():
            for job in [j for j in state.jobs.values() if settled(j)]:
                self._shelve(job)

    def folding(self, rows: Iterable[tuple], touched: set[str]) -> Iterator[tuple]:
        """The fold's rows (seq, stream, ...) as they are, each one's stream added to
        `touched`; a shelved job is put back into the state before its first event is folded."""
        shelf, state = self.shelf, self.state
        for row in rows:
            stream = row[1]
            if stream not in touched:
                touched.add(stream)
                if stream in shelf:
                    state.jobs[stream] = shelf.take(stream)  # type: ignore[assignment]
                    state.owned.add(stream)  # a fresh object: the fold may change it in place
            yield row

    def refresh(self, touched: Iterable[str]) -> None:
        """After a fold: the jobs it touched that it settled go to the shelf."""
        jobs = self.state.jobs
        for job_id in touched:
            job = jobs.get(job_id)
            if job is not None and settled(job):
                self._shelve(job)

    def find(self, job_id: str) -> JobState | None:
        """Any job the ledger knows, shelved or not (a shelved one decoded: a copy)."""
        job = self.state.jobs.get(job_id)
        return job if job is not None else self.shelf.get(job_id)

    def _shelve(self, job: JobState) -> None:
        self.shelf.put(job)
        del self.state.jobs[job.id]
        self.state.owned.discard(job.id)
