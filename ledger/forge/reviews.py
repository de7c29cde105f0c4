"""What a forge says about a merged pull request's reviews: plain data, no I/O.

The adapters (`ledger.forge.github`, `ledger.forge.gitlab`) fill it; the approval rules
(`ledger.gitops.approval`) read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Review:
    """One review of a pull request: who (`login`, the forge's handle), their verdict
    (GitHub's states: APPROVED, CHANGES_REQUESTED, COMMENTED, DISMISSED, PENDING), on which
    commit, when (ISO 8601, for ordering a reviewer's verdicts); `codeowner` is set by the
    approval rules: whether the reviewer may approve the path."""

    login: str
    state: str
    commit: str | None
    submitted_at: str = ""
    codeowner: bool = False

    def display(self) -> str:
        return "@" + self.login

    def standing(self, codeowner: bool) -> Review:
        return replace(self, codeowner=codeowner)


@dataclass(frozen=True, slots=True)
class PullReviews:
    """The reviews of pull request `number` as the forge lists them, and the head commit
    it was merged at (None when the forge did not say)."""

    number: int
    head: str | None
    reviews: tuple[Review, ...] = ()
    approvals_by_commit: bool = True  # False: the forge keeps no commit per approval (GitLab)


# (pull request number, the merged head commit when git knows it) -> the forge's reviews,
# or None when the watcher has no forge to ask.
ReviewLookup = Callable[[int, str | None], PullReviews | None]
