"""The jobs a pass looks at: every job the ledger knows except the settled ones.

A settled job has ended, holds no TPU and has no intent without its outcome: nothing a pass
decides can concern it. A lab's ledger keeps every job it ever ran, so without this view
every pass would walk its whole history (several times: admission, placement, the planner,
the probes), a cost that grows with the months and not with the work.

A settled job (ledger.shelf.settled) is held apart, small (reconciler.shelf): looking one up
by id (`find`) decodes it, and an event for it brings it back (ledger.shelf.LiveJobs).
"""

from __future__ import annotations

from ledger.fold import LedgerState
from ledger.shelf import LiveJobs as _LiveJobs
from reconciler.shelf import Shelf


class LiveJobs(_LiveJobs[Shelf]):
    """The reconciler's fold, kept to the jobs a pass walks, its settled jobs on a Shelf
    that also answers the orphan collector."""

    def __init__(self) -> None:
        super().__init__(Shelf())

    def rebuild(self, state: LedgerState, shelf: Shelf | None = None) -> None:
        super().rebuild(state, shelf if shelf is not None else Shelf())
