"""GitOps: the jobs repository's protected branch -> ledger events, exactly once.

Public API:
- `ingest(repo, store, branch="main", *, accept_rewrite=False, ...) -> IngestReport`
- `Watcher(source, store, branch, *, interval, ...)`: `.run()`, `.run_once()`, `.stop()`, `.wake()`
- `plan(repo, ref, branch="main", *, store=None) -> PlanReport`
- `install_hook(repo, store_url, branch="main", *, force=False) -> Path`
- `read_position(store, branch) -> Position`; `GitRepo` (the git adapter)
"""

from ledger.gitops.hook import install_hook
from ledger.gitops.ingest import IngestReport, ingest, read_position
from ledger.gitops.plan import PlanItem, PlanReport, plan
from ledger.gitops.position import Position, stream_for
from ledger.gitops.repo import Change, Commit, GitError, GitRepo
from ledger.gitops.watch import Watcher

__all__ = [
    "Change", "Commit", "GitError", "GitRepo", "IngestReport", "PlanItem", "PlanReport", "Position",
    "Watcher", "ingest", "install_hook", "plan", "read_position", "stream_for",
]
