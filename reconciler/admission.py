"""Admission: which waiting jobs may take TPUs now, which wait and why, whom to preempt. Pure.

`admit(jobs, policy, usage)` looks at every job that waits for a TPU (pending, queued, or
recovering without one) and decides, in one pass over them in **admission order**:

1. higher priority first (the job spec's 0-1000 priority);
2. then the fair tree (ledger.usage.fairtree): the team owed the most share for its decayed
   recent usage first, then within it the user owed the most;
3. then submission order (the ledger's seq), then the job id.

A job is admitted when the chips it needs fit, next to what is held already and what this
pass admitted before it, under its owner's quota, each quota'd team's and the lab's
(`policy.quotas`: concurrent chips per accelerator family, chip-hours per rolling week).
Each job that waits gets one reason, its **own first blocker**, looked for in this order:
its user's quota, its teams' quotas, the lab's weekly quota, then the lab's chips. So a job
over its own quota says so even behind the head of the line. Over its own (or its team's)
quota it waits and the jobs after it go on, except that a lower class never takes chips of a
scope a higher class waits for (`held back`). When the lab's chips of a family are used up,
every later job of that family waits behind the first (no backfilling past the head of the
line: a big job is never starved by small ones).

With `quotas.borrowing`, the teams with a quota for a family form a cohort (as Kueue's): a
team over its own quota may use what the others leave idle, and a team within its own quota
that finds its chips lent out reclaims them by preempting the borrowers' jobs, whatever their
class (`preempted`, cause `reclaim`).

When the head of the line cannot get the lab's chips and `policy.priorities` lets its class
preempt some lower class, running jobs of those classes are chosen as victims: as few chips
wasted as possible, then the most recent checkpoint (the least work lost). The victims are
recorded `preempted` (cause: priority, winner: the job), stop, release their TPU by their
recovery rule and wait again like any job; the winner waits (`preempting`) until their
chips are free. A job never preempts one of its own or a higher class, never more jobs than
it needs, and never one that would not come back (its `on_preempted` rule is `pass`, or its
restart budget is spent).

A running job whose weekly chip-hours quota runs out is reported in `Decision.spent`; the
planner records it (`quota_spent`) and, under `quotas.on_spent: checkpoint-and-stop`, takes
its TPU back at its next reported checkpoint (`preempted`, cause `quota`).

Chips are counted held from the intent to provision until the TPU is released, so what is
held never exceeds a quota at any moment (an operator's `ledger admit` excepted: it lets
one job past its user and team quotas; the lab's chips still bound it).
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from ledger import fold
from ledger.events import data as ev
from ledger.fold import TERMINAL, JobState
from ledger.spec.placement import Choice
from ledger.spec.policy import Policy, Quota
from ledger.usage.fairtree import FairTree, fair_tree
from ledger.usage.fold import Interval
from ledger.usage.share import ShareMeter
from reconciler.needs import Need, is_spot, need_of
from reconciler.victims import choose_victims, job_chips, resumes
from reconciler.waits import COHORT, KEPT, LAB, NO_IDLE, TOO_BIG, WEEK, Wait, is_admission_reason

__all__ = ["COHORT", "LAB", "Decision", "Need", "Usage", "Wait", "active", "admit", "choose_victims", "explain",
           "checkpointed_since_spent", "given_back", "need_of", "preemption", "queued", "quota_spent", "recorded",
           "resumes", "spent_recorded", "stopped_for_quota", "usage_at", "when_spent"]

WAITING_STATES = frozenset({fold.PENDING, fold.QUEUED, fold.RECOVERING})
# A running job may be preempted for another only once its TPU is up and nothing is under way.
PREEMPTIBLE_STATES = frozenset({fold.PROVISIONED, fold.SETTING_UP, fold.READY, fold.RUNNING})


@dataclass(frozen=True, slots=True)
class Usage:
    """What the usage fold says at the moment of the pass (ledger.usage.share): decayed
    chip-hours per owner (fair share) and chip-hours per (owner, family) over the last 7 days."""

    decayed: Mapping[str, float] = field(default_factory=dict)
    week: Mapping[tuple[str, str], float] = field(default_factory=dict)


NO_USAGE = Usage()


def usage_at(meter: ShareMeter, open_now: Iterable[Interval], now_us: int) -> Usage:
    """The figures a pass at `now_us` plans with: the meter's closed intervals plus the usage
    fold's open ones (`UsageFold.open_intervals(now_us)`)."""
    open_now = list(open_now)
    return Usage(decayed=meter.decayed(now_us, open_now), week=meter.week(now_us, open_now))


def given_back(job: JobState) -> bool:
    """Admission took the job's TPU back in its current attempt (for a higher class, for the
    team that lent the chips, or at a checkpoint after its weekly quota ran out): its TPU is
    up and must be given back. A former victim that runs again (a later attempt) is not one."""
    err = job.last_error or {}
    if err.get("kind") != "preempted" or not err.get("cause"):
        return False
    last = job.failures[-1] if job.failures else {}
    return last.get("kind") == "preempted" and last.get("attempt") == job.attempt


@dataclass(slots=True)
class Decision:
    """The outcome of one admission pass."""

    order: list[str] = field(default_factory=list)  # every waiting job, in admission order
    admitted: set[str] = field(default_factory=set)
    waits: dict[str, Wait] = field(default_factory=dict)
    preempt: dict[str, str] = field(default_factory=dict)  # victim -> the job it makes room for
    reclaim: set[str] = field(default_factory=set)  # the victims taken back by a lending team
    spent: dict[str, Wait] = field(default_factory=dict)  # running job -> the weekly quota it ran out of
    held: dict[tuple[str, str], int] = field(default_factory=dict)  # (scope, family) -> chips, before this pass
    tree: FairTree | None = None


def active(policy: Policy | None) -> bool:
    """Does the policy ask for admission at all? Without quotas and preemption rules every
    waiting job goes on, as before admission existed."""
    return policy is not None and (policy.quotas.any or policy.priorities.preempts)


Scopes = tuple[tuple[str, Quota | None], ...]


class _Pass:
    """One admission pass: what is held, per scope and family, as it goes."""

    def __init__(self, jobs: Mapping[str, JobState], policy: Policy, usage: Usage, busy: set[str]) -> None:
        self.jobs, self.policy, self.usage, self.busy = jobs, policy, usage, busy
        q = policy.quotas
        self.lab = q.lab
        self.borrowing = q.borrowing
        self.nominal: dict[str, int] = {}  # family -> the cohort's chips: every team quota's, summed
        if self.borrowing:
            for quota in q.teams.values():
                for family, chips in quota.chips.items():
                    self.nominal[family] = self.nominal.get(family, 0) + chips
        self._scopes: dict[str, Scopes] = {}
        self._classes: dict[int, int] = {}
        self.held: dict[tuple[str, str], int] = {}
        self.freeing: dict[tuple[str, str], int] = {}  # chips being given back, per scope
        self.given: dict[str, list[JobState]] = {}  # family -> jobs giving their TPU back
        self.holders: dict[str, list[JobState]] = {}  # family -> jobs holding chips of it (victims come from these)
        self.week: dict[tuple[str, str], float] = {}
        # (scope, family) -> class -> the chips its held-back jobs wait for (kept from lower classes)
        self.kept: dict[tuple[str, str], dict[int, int]] = {}
        self.kept_for: dict[tuple[str, str], str] = {}  # (scope, family) -> the first job of its highest class
        self._keeping: dict[tuple[str, str, int], int] = {}  # (owner, family, class) -> chips to keep, not spread yet
        self._first: dict[tuple[str, str, int], str] = {}
        self.version = 0  # counts what was added to `held`: a remembered first blocker is good for one version
        self._own: dict[tuple[Any, ...], Wait | None] = {}

    def scopes(self, owner: str) -> Scopes:
        """Whom the owner's chips count against: the user, their quota'd teams, the lab."""
        found = self._scopes.get(owner)
        if found is None:
            q = self.policy.quotas
            teams = q.teams_of(owner, self.policy.teams)
            found = self._scopes[owner] = ((f"user {owner}", q.of_user(owner)), *((f"team {t}", q.teams[t]) for t in teams),
                                           (LAB, q.lab))
        return found

    def in_cohort(self, owner: str, family: str) -> bool:
        return family in self.nominal and any(
            quota is not None and family in quota.chips for scope, quota in self.scopes(owner) if scope.startswith("team "))

    def class_of(self, priority: int) -> int:
        value = self._classes.get(priority)
        if value is None:
            value = self._classes[priority] = self.policy.priorities.class_of(priority)[1]
        return value

    def add(self, into: dict[tuple[str, str], int], owner: str, need: Need) -> None:
        self.version += 1
        for scope, _ in self.scopes(owner):
            key = (scope, need.family)
            into[key] = into.get(key, 0) + need.chips
        if self.borrowing and self.in_cohort(owner, need.family):
            into[(COHORT, need.family)] = into.get((COHORT, need.family), 0) + need.chips

    def weekly(self) -> None:
        for (owner, family), hours in self.usage.week.items():
            for scope, _ in self.scopes(owner):
                self.week[(scope, family)] = self.week.get((scope, family), 0.0) + hours

    def own(self, job: JobState, need: Need, cls: int) -> Wait | None:
        """`_first_blocker`, remembered while nothing is admitted: it depends on the owner, the need,
        the class `cls` (the chips kept for the classes above it are all known by the time a job
        of that class is looked at: jobs come by priority) and what is held."""
        key = (job.owner, need, cls, job.admitted_by, self.version)
        found = self._own.get(key, self)
        if found is self:
            if len(self._own) > 65536:
                self._own.clear()
            found = self._own[key] = self._first_blocker(job, need)
        return found  # type: ignore[return-value]

    def _first_blocker(self, job: JobState, need: Need) -> Wait | None:
        """The job's own first blocker, None when none stops it. The most lasting first: a
        limit smaller than the job (it never fits), then a weekly quota spent (time frees
        it), then chips: a quota its user or a team holds (with borrowing, when no other
        team has chips idle either), or chips kept for the higher classes that wait on
        them. Within each, its user's, then its teams', then the lab's. The lab's chips
        themselves are the line's (`short`), not the job's own."""
        family, chips = need.family, need.chips
        mine = self.class_of(job.priority)
        scopes = [(s, q) for s, q in self.scopes(job.owner) if q is not None and (s == LAB or not job.admitted_by)]
        for scope, quota in scopes:
            limit = quota.chips.get(family)
            if limit is not None and chips > self._most(scope, family, limit):
                return Wait("quota", scope, family, held=self.held.get((scope, family), 0), limit=limit, needs=chips,
                            detail=TOO_BIG)
        for scope, quota in scopes:
            hours = quota.chip_hours_per_week.get(family)
            if hours is not None and (used := self.week.get((scope, family), 0.0)) >= hours:
                return Wait("quota", scope, family, unit=WEEK, held=used, limit=hours, needs=chips)
        for scope, quota in scopes:
            limit = quota.chips.get(family)
            if scope == LAB or limit is None:
                continue
            now = self.held.get((scope, family), 0)
            if now + chips > limit and not self._may_borrow(scope, family, chips):
                return Wait("quota", scope, family, held=now, limit=limit, needs=chips,
                            detail=NO_IDLE if self.borrowing and scope.startswith("team ") else "")
            kept = self.kept_above(scope, family, mine)
            if kept and now + chips + kept > limit and not self._may_borrow(scope, family, chips + kept):
                return Wait("quota", scope, family, held=now, limit=limit, needs=chips, detail=KEPT,
                            kept_for=self.kept_for[(scope, family)])
        return None

    def _most(self, scope: str, family: str, limit: int) -> int:
        """The most a scope can ever hold: its limit, or for a team that may borrow, every
        chip of the cohort (were the other teams idle)."""
        if self.borrowing and scope.startswith("team ") and family in self.nominal:
            return max(limit, self.nominal[family])
        return limit

    def _may_borrow(self, scope: str, family: str, chips: int) -> bool:
        """A team over its own quota may use the cohort's idle chips (quotas.borrowing)."""
        if not self.borrowing or not scope.startswith("team ") or family not in self.nominal:
            return False
        return self.held.get((COHORT, family), 0) + chips <= self.nominal[family]

    def keep(self, job: JobState, need: Need, count: int = 1) -> None:
        """A job held back by chips (not by its week, nor too big): what it needs is kept in
        each of its user's and teams' quotas from every lower class, so that no lower class
        takes chips it waits for. Counted per owner here, spread over the scopes by `flush`
        before the first job of a lower class is looked at. `count`: alike jobs held back
        together (a run, from `job` on), each keeping what it needs."""
        key = (job.owner, need.family, self.class_of(job.priority))
        self._keeping[key] = self._keeping.get(key, 0) + need.chips * count
        self._first.setdefault(key, job.id)

    def flush(self) -> None:
        for (owner, family, cls), chips in self._keeping.items():
            for scope, quota in self.scopes(owner):
                if quota is None or scope == LAB or family not in quota.chips:
                    continue
                by_class = self.kept.setdefault((scope, family), {})
                by_class[cls] = by_class.get(cls, 0) + chips
                self.kept_for.setdefault((scope, family), self._first[(owner, family, cls)])
        self._keeping.clear()

    def kept_above(self, scope: str, family: str, mine: int) -> int:
        """The chips of `scope` kept for the classes above `mine`."""
        by_class = self.kept.get((scope, family))
        return sum(n for c, n in by_class.items() if c > mine) if by_class else 0

    def short(self, job: JobState, need: Need) -> dict[str, int]:
        """How many chips the lab (and the cohort, for a job within its team's quota) lacks."""
        out: dict[str, int] = {}
        limit = self.lab.chips.get(need.family) if self.lab else None
        if limit is not None and (s := self.held.get((LAB, need.family), 0) + need.chips - limit) > 0:
            out[LAB] = s
        if self.borrowing and not job.admitted_by and self.in_cohort(job.owner, need.family):
            s = self.held.get((COHORT, need.family), 0) + need.chips - self.nominal[need.family]
            if s > 0:
                out[COHORT] = s
        return out

    def capacity(self, need: Need, shorts: Mapping[str, int], behind: str = "") -> Wait:
        scope = COHORT if COHORT in shorts else LAB
        if scope == COHORT:
            limit: float = self.nominal[need.family]
        else:
            limit = self.lab.chips.get(need.family, 0) if self.lab else 0
        return Wait("capacity", scope, need.family, held=self.held.get((scope, need.family), 0), limit=limit,
                    needs=need.chips, behind=behind)


def admit(
    jobs: Mapping[str, JobState], policy: Policy, usage: Usage = NO_USAGE, *, busy: Iterable[str] = (),
    asks: Mapping[str, Choice] | None = None,
) -> Decision:
    """Decide one pass (see the module's docstring). `busy`: jobs with an action in flight;
    `asks`: the placement choice each waiting job would try (reconciler.placement), charged
    for its chips (else its first choice)."""
    asks = asks or {}
    p = _Pass(jobs, policy, usage, set(busy))
    by_owner: defaultdict[str, list[JobState]] = defaultdict(list)  # the jobs that wait, by owner
    running: list[JobState] = []
    needs: dict[str, Need | None] = {}
    unsettled: set[str] = set()  # families with a waiting job's action in flight: no preemption now
    for job in jobs.values():
        if job.state in TERMINAL and job.tpu is None:  # job.terminal, without a call per job of the ledger
            continue  # most of a ledger: nothing held, nothing asked
        need = needs[job.id] = need_of(job, asks.get(job.id))
        holds = job.tpu is not None or bool(job.pending_action and (job.pending_action.get("params") or {}).get("tpu"))
        if not holds and job.state in WAITING_STATES and not job.cancel_requested:  # (no waiting state is terminal)
            if job.id in p.busy and need is not None:
                p.add(p.held, job.owner, need)  # what it asks for may be under way
                unsettled.add(need.family)
            elif not job.pending_action:
                by_owner[job.owner].append(job)
            continue
        if holds and need is not None:
            p.add(p.held, job.owner, need)
            p.holders.setdefault(need.family, []).append(job)
            if given_back(job):
                p.add(p.freeing, job.owner, need)
                p.given.setdefault(need.family, []).append(job)
            elif job.state == fold.RUNNING and not job.cancel_requested:
                running.append(job)
    tree = fair_tree(policy, usage.decayed, by_owner)
    segments = _in_order(by_owner, tree.rank)
    p.weekly()
    decision = Decision(order=[j.id for segment in segments for j in segment], held=dict(p.held), tree=tree)
    head: dict[str, str] = {}  # family -> the first job that found the lab's (or the cohort's) chips short
    behind: dict[tuple[Any, ...], Wait] = {}
    taken: set[str] = {v.id for vs in p.given.values() for v in vs}
    # Held back by their own quotas (runs of alike jobs, with their need and class): their
    # reason is settled at the end.
    blocked: list[tuple[list[JobState], Need, int]] = []
    current = None  # the class being looked at: segments come by priority, so by class

    def alike(job: JobState) -> tuple[Need | None, str]:
        return needs[job.id], job.admitted_by

    for segment in segments:
        cls = p.class_of(segment[0].priority)
        if cls != current:
            p.flush()  # what the higher classes wait for is kept from this one
            current = cls
        # A run: consecutive jobs of one owner and class with the same need and operator's
        # admission. What holds one back holds the rest back alike as long as nothing is
        # admitted in between (nothing else `own`, `short` or the line look at moves), so
        # a run is decided job by job only until its first wait.
        for (need, _), grouped in groupby(segment, alike):
            run = list(grouped)
            if need is None or need.chips == 0:
                decision.admitted.update(j.id for j in run)  # nothing to count: an unknown type fails at provisioning
                continue
            family = need.family
            for i, job in enumerate(run):
                wait = p.own(job, need, cls)
                if wait is None and family not in head:
                    shorts = p.short(job, need)
                    if not shorts:
                        decision.admitted.add(job.id)
                        p.add(p.held, job.owner, need)
                        continue
                    head[family] = job.id
                    wait = p.capacity(need, shorts)
                    if family not in unsettled:  # counted held may be a mere record in flight: decide next pass
                        wait = _make_room(job, need, wait, shorts, p, taken, decision)
                    decision.waits[job.id] = wait
                    continue
                rest = run[i:]
                if wait is not None:
                    if wait.unit != WEEK and wait.detail != TOO_BIG and not job.admitted_by:
                        blocked.append((rest, need, cls))  # held back by chips: what admissions after it take may move its blocker
                        p.keep(job, need, len(rest))
                else:  # nothing more of this family is admitted: no backfill past the head
                    key = (job.owner, need, head[family])  # nothing of the family is held anew: one Wait serves alike
                    if (wait := behind.get(key)) is None:
                        wait = behind[key] = p.capacity(need, p.short(job, need), behind=head[family])
                decision.waits.update(dict.fromkeys([j.id for j in rest], wait))
                break
    # What this pass admitted counts now: a job held back by chips gets its first blocker as
    # things stand after the pass (the same a next pass would find: one reason, kept). Its
    # week and its size do not move within a pass, nor do the chips kept for higher classes.
    p.flush()
    for rest, need, cls in blocked:
        if (wait := p.own(rest[0], need, cls)) is not None:
            decision.waits.update(dict.fromkeys([j.id for j in rest], wait))
    spent: dict[tuple[Any, ...], Wait | None] = {}
    for job in running:
        key = (job.owner, needs[job.id], bool(job.admitted_by))
        if key not in spent:
            spent[key] = _spent(job, needs[job.id], p)
        if (wait := spent[key]) is not None:
            decision.spent[job.id] = wait
    return decision


_BY_SUBMISSION = operator.attrgetter("submitted_seq", "id")
_BY_PRIORITY = operator.attrgetter("priority")
_SEGMENT_KEY = operator.itemgetter(0, 1)  # (-priority, rank): unique per segment


def _in_order(by_owner: Mapping[str, list[JobState]], rank: Mapping[str, int]) -> list[list[JobState]]:
    """The waiting jobs in admission order (higher priority first, then the fair tree's rank,
    then submission order, then the id), as segments of one owner and one priority. The fair
    tree ranks each owner it is given once, so sorting each owner's jobs and then the
    segments gives the order one sort of every job by a 4-tuple gives, for less: no tuple
    made per job, and each owner's jobs come as a segment whose runs are decided together."""
    segments: list[tuple[int, int, list[JobState]]] = []
    for owner, mine in by_owner.items():
        mine.sort(key=_BY_SUBMISSION)
        mine.sort(key=_BY_PRIORITY, reverse=True)  # a stable sort: submission order within a priority
        at = rank[owner]
        segments.extend((-priority, at, list(jobs)) for priority, jobs in groupby(mine, _BY_PRIORITY))
    segments.sort(key=_SEGMENT_KEY)
    return [jobs for _, _, jobs in segments]


def _spent(job: JobState, need: Need | None, p: _Pass) -> Wait | None:
    """The first weekly quota the running job counts against that has run out."""
    if need is None:
        return None
    for scope, quota in p.scopes(job.owner):
        if quota is None or job.admitted_by and scope != LAB:
            continue
        hours = quota.chip_hours_per_week.get(need.family)
        if hours is not None and (used := p.week.get((scope, need.family), 0.0)) >= hours:
            return Wait("quota", scope, need.family, unit=WEEK, held=used, limit=hours, needs=need.chips)
    return None


def _teams_borrowing(job: JobState, family: str, p: _Pass) -> bool:
    """Does one of the job's teams hold more of `family` than its own quota (it borrows)?"""
    for scope, quota in p.scopes(job.owner):
        if scope.startswith("team ") and quota is not None and (limit := quota.chips.get(family)) is not None \
                and p.held.get((scope, family), 0) > limit:
            return True
    return False


def _make_room(
    winner: JobState, need: Need, wait: Wait, shorts: Mapping[str, int], p: _Pass, taken: set[str], decision: Decision,
) -> Wait:
    """Choose victims for `winner`, the head of its family's line: borrowers' jobs when its
    team's lent chips are short (reclaim), then lower classes when the lab's are (priority).
    Chips already being given back count first. Or keep waiting."""
    family = need.family
    prio = p.policy.priorities
    freeing = p.given.get(family, [])

    def candidates(extra: Any) -> list[JobState]:
        return [
            j for j in p.holders.get(family, ())
            if j.state in PREEMPTIBLE_STATES and j.tpu is not None and not j.pending_action and not j.cancel_requested
            and j.id not in taken and j.id not in p.busy and resumes(j) and extra(j)
        ]

    reclaimed: list[JobState] = []
    cohort_short = shorts.get(COHORT, 0) - p.freeing.get((COHORT, family), 0)
    if cohort_short > 0:
        mine = {s for s, _ in p.scopes(winner.owner) if s.startswith("team ")}
        reclaimed = choose_victims(candidates(lambda j: p.in_cohort(j.owner, family) and _teams_borrowing(j, family, p)
                                              and not mine & {s for s, _ in p.scopes(j.owner)}), cohort_short)
    lab_short = shorts.get(LAB, 0) - p.freeing.get((LAB, family), 0) - sum(job_chips(v) for v in reclaimed)
    preempted: list[JobState] = []
    if lab_short > 0 and (cohort_short <= 0 or reclaimed):
        chosen = {v.id for v in reclaimed}
        if prio.preempts:
            preempted = choose_victims(candidates(lambda j: j.id not in chosen and prio.may_preempt(
                winner.priority, j.priority, victim_spot=is_spot(j), winner_spot=is_spot(winner))), lab_short)
        if not preempted:
            reclaimed = []  # the lab would still be short: take nothing back for nothing
    for v in (*reclaimed, *preempted):
        decision.preempt[v.id] = winner.id
        taken.add(v.id)
    decision.reclaim.update(v.id for v in reclaimed)
    victims = [*freeing, *reclaimed, *preempted]
    if not victims:
        return wait
    scope = COHORT if reclaimed and not preempted else wait.scope
    return Wait("preempting", scope, family, held=wait.held, limit=wait.limit, needs=need.chips,
                victims=tuple(sorted(v.id for v in victims)))


def recorded(job: JobState, wait: Wait) -> bool:
    """Is this already the job's recorded reason? (One `queued` per change of cause.)"""
    return job.queued_reason == wait.recorded


def queued(wait: Wait) -> ev.Queued:
    """The `queued` event that records a wait."""
    return wait.event()


def preemption(victim: JobState, winner: str, *, reclaim: bool = False) -> ev.Preempted:
    """The `preempted` event of a victim admission chose for `winner`."""
    if reclaim:
        return ev.Preempted(reason=f"reclaimed for {winner}: its team lent these chips", tpu_state="READY",
                            attempt=victim.attempt, cause="reclaim", winner=winner)
    return ev.Preempted(reason=f"preempted for {winner}, a job of a higher priority class", tpu_state="READY",
                        attempt=victim.attempt, cause="priority", winner=winner)


def quota_spent(job: JobState, spent: Wait, then: str) -> ev.QuotaSpent:
    """The `quota_spent` event of a running job whose weekly quota ran out."""
    return ev.QuotaSpent(scope=spent.scope, family=spent.family, used=float(spent.held), limit=float(spent.limit),
                         then=then, attempt=job.attempt)  # type: ignore[arg-type]


def when_spent(job: JobState, on_spent: str) -> str:
    """What a running job does once its week is spent: the policy's `on_spent`, except that a
    job which would not come back after a preemption (its `on_preempted` rule is `pass`, or
    its budget is spent) is never stopped for a quota: it finishes."""
    return on_spent if on_spent == "finish" or resumes(job) else "finish"


def spent_recorded(job: JobState) -> bool:
    """Is the running attempt's `quota_spent` recorded (after its start)?"""
    return job.times.get("quota_spent", "") > job.times.get("started", "")


def checkpointed_since_spent(job: JobState) -> bool:
    """Has the job reported a checkpoint of this attempt since its quota ran out?"""
    return (job.checkpoint or {}).get("attempt") == job.attempt and \
        job.times.get("checkpointed", "") > job.times.get("quota_spent", "\uffff")


def stopped_for_quota(job: JobState, spent: Wait) -> ev.Preempted:
    """The `preempted` event of a job stopped at its checkpoint, its weekly quota spent."""
    return ev.Preempted(reason=f"stopped at its checkpoint: {spent.scope} has used its weekly {spent.family} chip-hours",
                        tpu_state="READY", attempt=job.attempt, cause="quota")


def explain(jobs: Mapping[str, JobState], policy: Policy | None, usage: Usage = NO_USAGE,
            asks: Mapping[str, Choice] | None = None) -> list[dict[str, Any]]:
    """Every waiting job in admission order, with why it waits: the rows of `ledger queue`
    (and the reason line of `ledger inspect`). Without a sharing policy every waiting job
    is admitted, in the planner's order, and waits only for what the planner recorded
    (a shared TPU held by another job, a queued resource, the cloud's capacity)."""
    asks = asks or {}
    if policy is not None and active(policy):
        decision = admit(jobs, policy, usage, asks=asks)
        prio = policy.priorities
    else:
        decision = Decision(order=[j.id for j in sorted(
            waiting_jobs(jobs.values()), key=lambda j: (-j.priority, j.submitted_seq, j.id))])
        decision.admitted = set(decision.order)
        prio = Policy().priorities
    tree = decision.tree
    shared = {j.tpu["name"]: j.id for j in jobs.values() if j.tpu and j.tpu.get("shared") and not j.terminal}
    rows = []
    higher: dict[str, dict[int, int]] = {}  # family -> priority -> waiting jobs seen so far
    for position, job_id in enumerate(decision.order, 1):
        job = jobs[job_id]
        need = need_of(job, asks.get(job_id))
        family = need.family if need else ""
        ahead = sum(n for p, n in higher.get(family, {}).items() if p > job.priority)
        wait = decision.waits.get(job_id)
        if wait is not None:
            cause, reason = wait.cause, wait.explain(ahead)
        else:
            cause = "admitted"
            reason = "admitted: its TPU is asked for at the next pass"
            if job.queued_reason and not is_admission_reason(job.queued_reason):
                reason = job.queued_reason
                cause = "shared" if "shared TPU" in job.queued_reason else "cloud"
            want = job.spec.get("tpu") or {}
            holder = shared.get(want.get("name", "")) if want.get("shared") else None
            if holder and holder != job_id:
                cause, reason = "shared", f"shared TPU {want['name']} is held by {holder}"
        if wait is not None or cause != "admitted":
            seen = higher.setdefault(family, {})
            seen[job.priority] = seen.get(job.priority, 0) + 1
        rows.append({
            "position": position, "job": job_id, "owner": job.owner, "state": job.state,
            "priority": job.priority, "class": prio.class_of(job.priority)[0],
            "family": family, "chips": need.chips if need else None,
            "team": tree.team.get(job.owner) if tree else None,
            "fair_share_rank": tree.rank_of(job.owner) + 1 if tree else None,
            "fair_share_usage": usage.decayed.get(job.owner, 0.0),
            "wait": cause, "reason": reason, "ahead": ahead,
            "since": waiting_since(job), "admitted_by": job.admitted_by or None,
            "victims": list(wait.victims) if wait else [],
        })
    return rows


def waiting_jobs(jobs: Iterable[JobState]) -> Iterator[JobState]:
    """The jobs that wait for a TPU: none held, not ended, in a waiting state, not being cancelled."""
    return (j for j in jobs if j.tpu is None and not j.terminal and j.state in WAITING_STATES and not j.cancel_requested)


def waiting_since(job: JobState) -> str:
    """When the job began waiting this time: submitted, or sent back to wait by a recovery."""
    return max(job.times.get("submitted", ""), job.times.get("resumed", ""), job.times.get("rerun", ""))
