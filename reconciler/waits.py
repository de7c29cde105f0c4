"""Why a job waits (admission's answer for a job it holds back), in the ledger and in words.

A `Wait` names the job's own first blocker: whose limit (`scope`), of which family, and the
figures at the moment of the decision. What the ledger records (`recorded`, the `queued`
event's reason) names only the cause: the scope, the limit as the policy writes it, what the
job needs, the victims. It never holds a live figure (chips held now, chip-hours used this
week), so a waiting job whose cause does not change writes nothing, however the figures
move. The figures go to `ledger queue`, the dashboard and metrics (`explain`), and the
`queued` event keeps them, unrounded, as they were when the cause changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger.describe import figure
from ledger.events import data as ev

LAB = "lab"
COHORT = "cohort"  # the teams that lend each other their idle chips (quotas.borrowing)
WEEK = "chip_hours_per_week"

# How a `Wait` of a cause reads, beyond its cause: `detail`.
TOO_BIG = "too_big"  # more than the limit itself: it never fits, and holds no place in line
KEPT = "kept"  # a higher class waits on this scope's chips: no lower class takes them first
NO_IDLE = "no_idle"  # over its team's quota, and the other teams have nothing idle to lend
# The first words of every reason admission records: what tells them from the planner's own
# (a shared TPU, a queued resource, the cloud's capacity).
PREFIXES = ("over quota:", "too big:", "held back:", "waiting for the lab's", "waiting for lent",
            "preempting", "reclaiming")


@dataclass(frozen=True, slots=True)
class Wait:
    """Why a job waits. `scope` is whose limit: "user alice", "team @lab/nlp", "lab", or
    `COHORT` (the teams' chips, some lent)."""

    cause: str  # quota | capacity | preempting
    scope: str
    family: str
    unit: str = "chips"  # or WEEK
    held: float = 0  # what the scope holds (chips) or used (chip-hours) at the decision
    limit: float = 0
    needs: float = 0
    victims: tuple[str, ...] = ()
    behind: str = ""  # capacity: the job at the head of the line for these chips
    detail: str = ""  # TOO_BIG | KEPT | NO_IDLE
    kept_for: str = ""  # KEPT: the higher-class job the chips are kept for
    # The reason recorded in the ledger: it changes only when the cause does.
    recorded: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "recorded", self._text())

    def _text(self) -> str:
        fam, limit, needs = self.family, figure(self.limit), figure(self.needs)
        if self.cause == "preempting":
            if self.scope == COHORT:
                return f"reclaiming lent {fam} chips from {', '.join(self.victims)}"
            return f"preempting {', '.join(self.victims)} for {fam} chips"
        if self.cause == "capacity":
            return f"waiting for lent {fam} chips to come back" if self.scope == COHORT else f"waiting for the lab's {fam} chips"
        if self.unit == WEEK:
            return f"over quota: {self.scope} has used its {limit} {fam} chip-hours of the week"
        if self.detail == TOO_BIG:
            return f"too big: {self.scope} may hold {limit} {fam} chips, this job needs {needs}"
        if self.detail == KEPT:
            return f"held back: {self.scope}'s {fam} chips are kept for a job of a higher class"
        idle = " and no other team's are idle" if self.detail == NO_IDLE else ""
        return f"over quota: {self.scope} may hold {limit} {fam} chips{idle}, needs {needs}"

    def explain(self, ahead: int = 0) -> str:
        """The reason in words, with the live figures (`ledger queue`, `ledger inspect`)."""
        fam, held, limit, needs = self.family, figure(self.held, self.limit), figure(self.limit), figure(self.needs)
        if self.cause == "capacity":
            whose = "the teams hold" if self.scope == COHORT else "the lab holds"
            text = f"capacity: {whose} {held} of {limit} {fam} chips, this job needs {needs}"
            if self.behind:
                text += f"; behind {self.behind}"
        elif self.cause == "quota" and self.unit == WEEK:
            text = f"over quota: {self.scope} used {held} of {limit} {fam} chip-hours this week"
        elif self.cause == "quota" and self.detail == KEPT:
            text = f"{self.recorded} ({self.kept_for}); {self.scope} holds {held} of {limit}, needs {needs}"
        elif self.cause == "quota" and self.detail != TOO_BIG:
            idle = "; no other team's are idle" if self.detail == NO_IDLE else ""
            text = f"over quota: {self.scope} holds {held} of {limit} {fam} chips, needs {needs}{idle}"
        else:
            text = self.recorded
        if ahead:
            text += f" (behind {ahead} higher-priority job{'s' if ahead > 1 else ''})"
        return text

    def event(self) -> ev.Queued:
        """The `queued` event that records this wait: the figures as they are, unrounded."""
        extra: dict[str, Any] = {"victims": list(self.victims)} if self.victims else {}
        return ev.Queued(reason=self.recorded, wait=self.cause, scope=self.scope, family=self.family,  # type: ignore[arg-type]
                         unit=self.unit, held=float(self.held), limit=float(self.limit), needs=float(self.needs),  # type: ignore[arg-type]
                         **extra)


def is_admission_reason(reason: str) -> bool:
    """Was this recorded reason admission's (not the planner's own)?"""
    return reason.startswith(PREFIXES)
