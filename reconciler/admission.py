"""Admission: which waiting jobs may take TPUs now, which wait and why, whom to preempt. Pure.

`admit(jobs, policy, usage)` looks at every job that waits for a TPU (pending, queued, or
recovering without one) and decides, in one pass over them in **admission order**:

1. higher priority first (the job spec's 0-1000 priority);
2. then fair share: the owner with the least decayed recent usage first (chip-hours held,
   halved every `fair_share.half_life_hours`, as Slurm's fair-share factor);
3. then submission order (the ledger's seq), then the job id.

A job is admitted when the chips it needs fit, next to what is held already and what this
pass admitted before it, under its owner's quota, each quota'd team's and the lab's
(`policy.quotas`: concurrent chips per accelerator family, chip-hours per rolling week).
Over its own (or its team's) quota it waits and the jobs after it go on; when the lab's
chips of a family are used up, every later job of that family waits behind it (no
backfilling past the head of the line: a big job is never starved by small ones).

When the head of the line cannot get the lab's chips and `policy.priorities` lets its class
preempt some lower class, running jobs of those classes are chosen as victims: as few chips
wasted as possible, then the most recent checkpoint (the least work lost). The victims are
recorded `preempted` (cause: priority, winner: the job), stop, release their TPU by their
recovery rule and wait again like any job; the winner waits (`preempting`) until their
chips are free. A job never preempts one of its own or a higher class, never more jobs than
it needs, and never one that would not come back (its `on_preempted` rule is `pass`, or its
restart budget is spent).

Chips are counted held from the intent to provision until the TPU is released, so what is
held never exceeds a quota at any moment (an operator's `ledger admit` excepted: it lets
one job past its user and team quotas; the lab's chips still bound it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger import fold
from ledger.events import data as ev
from ledger.fold import JobState
from ledger.placement import Footprint, takes
from ledger.spec.policy import Policy, Quota
from ledger.usage.fold import Interval
from ledger.usage.share import ShareMeter
from reconciler.rules import decide

LAB = "lab"
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


@dataclass(frozen=True, slots=True)
class Need:
    family: str
    chips: int


def need_of(job: JobState, choice: int | None = None) -> Need | None:
    """The chips the job holds (what was placed, every slice), or else those its next
    attempt asks for (choice `choice` of its placements, as the placement step picked it;
    the first by default); None when its type is unknown (ledger.placement.takes)."""
    found = takes(job, choice)
    if found is None:
        return None
    need = _NEEDS.get(id(found))  # footprints are made once per (type, slices): so are needs
    if need is None or need[0] is not found:
        need = _NEEDS[id(found)] = (found, Need(found.family, found.chips))
    return need[1]


_NEEDS: dict[int, tuple[Footprint, Need]] = {}


def is_spot(job: JobState) -> bool:
    return (job.spec.get("tpu") or {}).get("pricing") in ("spot", "preemptible")


def preempted_for_another(job: JobState) -> bool:
    """Preempted by admission for a higher-priority job: its TPU is up and must be given back."""
    return (job.last_error or {}).get("cause") == "priority"


@dataclass(frozen=True, slots=True)
class Wait:
    """Why a job waits. `scope` is whose limit: "user alice", "team @lab/nlp" or "lab"."""

    cause: str  # quota | capacity | preempting
    scope: str
    family: str
    unit: str = "chips"  # or chip_hours_per_week
    held: float = 0
    limit: float = 0
    needs: float = 0
    victims: tuple[str, ...] = ()
    behind: str = ""  # capacity: the job at the head of the line for these chips
    # The reason recorded in the ledger: it changes only when the reason does (not at every
    # chip another job takes), so a waiting job gets one `queued` per change.
    recorded: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "recorded", self._text())

    def _text(self) -> str:
        if self.cause == "preempting":
            return f"preempting {', '.join(self.victims)} for {self.family} chips"
        if self.cause == "capacity":
            return f"waiting for the lab's {self.family} chips"
        if self.unit == "chip_hours_per_week":
            return f"over quota: {self.scope} used {self.held:g} of {self.limit:g} {self.family} chip-hours this week"
        return f"over quota: {self.scope} holds {self.held:g} of {self.limit:g} {self.family} chips, needs {self.needs:g}"

    def explain(self, ahead: int = 0) -> str:
        """The reason in words, with the live figures (`ledger queue`, `ledger inspect`)."""
        if self.cause == "capacity":
            text = (f"capacity: the lab holds {self.held:g} of {self.limit:g} {self.family} chips, "
                    f"this job needs {self.needs:g}")
            if self.behind:
                text += f"; behind {self.behind}"
        else:
            text = self.recorded
        if ahead:
            text += f" (behind {ahead} higher-priority job{'s' if ahead > 1 else ''})"
        return text

    def event(self) -> ev.Queued:
        extra: dict[str, Any] = {"victims": list(self.victims)} if self.victims else {}
        return ev.Queued(reason=self.recorded, wait=self.cause, scope=self.scope, family=self.family,  # type: ignore[arg-type]
                         unit=self.unit, held=self.held, limit=self.limit, needs=self.needs, **extra)  # type: ignore[arg-type]


@dataclass(slots=True)
class Decision:
    """The outcome of one admission pass."""

    order: list[str] = field(default_factory=list)  # every waiting job, in admission order
    admitted: set[str] = field(default_factory=set)
    waits: dict[str, Wait] = field(default_factory=dict)
    preempt: dict[str, str] = field(default_factory=dict)  # victim -> the job it makes room for
    held: dict[tuple[str, str], int] = field(default_factory=dict)  # (scope, family) -> chips, before this pass


def active(policy: Policy | None) -> bool:
    """Does the policy ask for admission at all? Without quotas and preemption rules every
    waiting job goes on, as before admission existed."""
    return policy is not None and (policy.quotas.any or policy.priorities.preempts)


class _Scopes:
    """Who a job's chips count against: its owner, its quota'd teams, the lab."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.cache: dict[str, tuple[tuple[str, Quota | None], ...]] = {}

    def of(self, owner: str) -> tuple[tuple[str, Quota | None], ...]:
        found = self.cache.get(owner)
        if found is None:
            q = self.policy.quotas
            teams = q.teams_of(owner, self.policy.teams)
            found = ((f"user {owner}", q.of_user(owner)), *((f"team {t}", q.teams[t]) for t in teams), (LAB, q.lab))
            self.cache[owner] = found
        return found


def admit(
    jobs: Mapping[str, JobState], policy: Policy, usage: Usage = NO_USAGE, *, busy: Iterable[str] = (),
    asks: Mapping[str, int] | None = None,
) -> Decision:
    """Decide one pass (see the module's docstring). `busy`: jobs with an action in flight;
    `asks`: the placement choice each waiting job would try (reconciler.placement), charged
    for its chips (else its first choice)."""
    asks = asks or {}
    scopes = _Scopes(policy)
    in_flight = set(busy)
    held: dict[tuple[str, str], int] = {}
    waiting: list[JobState] = []
    needs: dict[str, Need | None] = {}
    freeing: dict[str, list[JobState]] = {}  # family -> jobs preempted for others, still holding chips
    unsettled: set[str] = set()  # families with a waiting job's action in flight: no preemption now
    for job in jobs.values():
        if job.terminal and job.tpu is None:
            continue  # most of a ledger: nothing held, nothing asked
        need = needs[job.id] = need_of(job, asks.get(job.id))
        holds = job.tpu is not None or bool(job.pending_action and (job.pending_action.get("params") or {}).get("tpu"))
        if not holds and not job.terminal and job.state in WAITING_STATES and not job.cancel_requested:
            if job.id in in_flight and need is not None:
                _add(held, scopes.of(job.owner), need)  # what it asks for may be under way
                unsettled.add(need.family)
            elif not job.pending_action:
                waiting.append(job)
            continue
        if holds and need is not None:
            _add(held, scopes.of(job.owner), need)
            if preempted_for_another(job):
                freeing.setdefault(need.family, []).append(job)
    decayed = usage.decayed
    keyed = [((-j.priority, decayed.get(j.owner, 0.0), j.submitted_seq, j.id), j) for j in waiting]
    keyed.sort(key=lambda kv: kv[0])
    waiting = [j for _, j in keyed]
    week: dict[tuple[str, str], float] = {}  # (scope, family) -> chip-hours over the last 7 days
    for (owner, family), hours in usage.week.items():
        for scope, _ in scopes.of(owner):
            week[(scope, family)] = week.get((scope, family), 0.0) + hours
    decision = Decision(order=[j.id for j in waiting], held=dict(held))
    head: dict[str, str] = {}  # family -> the first job that found the lab's chips used up
    behind: dict[tuple[str, int], Wait] = {}  # (family, chips) -> the wait of every job behind the head
    taken: set[str] = {v.id for vs in freeing.values() for v in vs}
    lab = policy.quotas.lab
    for job in waiting:
        need = needs[job.id]
        if need is None or need.chips == 0:
            decision.admitted.add(job.id)  # nothing to count: an unknown type fails at provisioning
            continue
        if need.family in head:  # nothing more of this family is admitted: one Wait serves all alike
            wait = behind.get((need.family, need.chips))
            if wait is None:
                limit = lab.chips.get(need.family, 0) if lab else 0
                wait = behind[(need.family, need.chips)] = Wait(
                    "capacity", LAB, need.family, held=held.get((LAB, need.family), 0), limit=limit,
                    needs=need.chips, behind=head[need.family])
            decision.waits[job.id] = wait
            continue
        wait = _over(job, need, scopes.of(job.owner), held, week)
        if wait is None:
            decision.admitted.add(job.id)
            _add(held, scopes.of(job.owner), need)
            continue
        if wait.cause == "capacity":
            head[need.family] = job.id
            if need.family not in unsettled:  # counted held may be a mere record in flight: decide next pass
                wait = _make_room(job, need, wait, jobs, policy, freeing.get(need.family, []), taken, in_flight, decision)
        decision.waits[job.id] = wait
    return decision


def _add(held: dict[tuple[str, str], int], scopes: Iterable[tuple[str, Quota | None]], need: Need) -> None:
    for scope, _ in scopes:
        key = (scope, need.family)
        held[key] = held.get(key, 0) + need.chips


def _over(job: JobState, need: Need, scopes: Iterable[tuple[str, Quota | None]],
          held: Mapping[tuple[str, str], int], week: Mapping[tuple[str, str], float]) -> Wait | None:
    """The first limit the job would go over, or None when it fits under all of them."""
    for scope, quota in scopes:
        if quota is None or scope != LAB and job.admitted_by:
            continue
        cause = "capacity" if scope == LAB else "quota"
        limit = quota.chips.get(need.family)
        now = held.get((scope, need.family), 0)
        if limit is not None and now + need.chips > limit:
            # More than the limit itself can never fit: that is no place at the head of the line.
            return Wait("quota" if need.chips > limit else cause, scope, need.family, held=now, limit=limit, needs=need.chips)
        hours = quota.chip_hours_per_week.get(need.family)
        if hours is not None:
            used = week.get((scope, need.family), 0.0)
            if used >= hours:
                return Wait("quota", scope, need.family, unit="chip_hours_per_week", held=round(used, 1), limit=hours,
                            needs=need.chips)
    return None


def _make_room(
    winner: JobState, need: Need, wait: Wait, jobs: Mapping[str, JobState], policy: Policy,
    freeing: list[JobState], taken: set[str], busy: set[str], decision: Decision,
) -> Wait:
    """Choose victims for `winner`, the head of its family's line, blocked by the lab's chips;
    chips already being given back by earlier victims count first. Or keep waiting."""
    short = wait.held + need.chips - wait.limit
    already = sum((need_of(v) or Need("", 0)).chips for v in freeing)
    victims: list[JobState] = []
    prio = policy.priorities
    if already < short and prio.preempts:
        candidates = [
            j for j in jobs.values()
            if j.state in PREEMPTIBLE_STATES and j.tpu is not None and not j.pending_action and not j.cancel_requested
            and j.id not in taken and j.id not in busy and (n := need_of(j)) is not None and n.family == need.family
            and prio.may_preempt(winner.priority, j.priority, victim_spot=is_spot(j), winner_spot=is_spot(winner))
            and resumes(j)
        ]
        victims = choose_victims(candidates, short - already)
        for v in victims:
            decision.preempt[v.id] = winner.id
            taken.add(v.id)
    if not victims and not already:
        return wait
    names = tuple(sorted(v.id for v in [*freeing, *victims]))
    return Wait("preempting", wait.scope, need.family, held=wait.held, limit=wait.limit, needs=need.chips, victims=names)


def resumes(job: JobState) -> bool:
    """Would the job come back after a preemption (its `on_preempted` rule, its restart
    budget)? A job whose rule is `pass` would end for good: it is never chosen as a victim."""
    return decide(job.spec, "preempted", job.restarts, tpu_usable=False).rule not in ("pass", "exhausted")


def _last_save(job: JobState) -> str:
    """When the job last saved its work: its latest checkpoint, else when it started."""
    return max(job.times.get("checkpointed", ""), job.times.get("started", ""))


def choose_victims(candidates: list[JobState], short: int) -> list[JobState]:
    """The fewest chips wasted that free at least `short` chips, then the most recent
    checkpoint first; never a victim that is not needed. [] when they cannot free enough."""
    if short <= 0:
        return []

    def chips(j: JobState) -> int:
        return (need_of(j) or Need("", 0)).chips

    # Most recent save first, then the later submission (it has run the least), then the id.
    order = sorted(candidates, key=lambda j: (_last_save(j), j.submitted_seq, j.id), reverse=True)
    singles = [j for j in order if chips(j) >= short]
    if singles:
        return [min(singles, key=lambda j: (chips(j), order.index(j)))]
    picked: list[JobState] = []
    total = 0
    for j in sorted(order, key=lambda j: -chips(j)):  # the biggest first: fewest victims
        picked.append(j)
        total += chips(j)
        if total >= short:
            break
    if total < short:
        return []
    for j in sorted(picked, key=chips):  # then drop whoever is not needed, the smallest first
        if total - chips(j) >= short:
            picked.remove(j)
            total -= chips(j)
    return picked


def recorded(job: JobState, wait: Wait) -> bool:
    """Is this already the job's recorded reason? (One `queued` per change, not per pass.)"""
    return job.queued_reason == wait.recorded


def queued(wait: Wait) -> ev.Queued:
    """The `queued` event that records a wait."""
    return wait.event()


def preemption(victim: JobState, winner: str) -> ev.Preempted:
    return ev.Preempted(reason=f"preempted for {winner}, a job of a higher priority class", tpu_state="READY",
                        attempt=victim.attempt, cause="priority", winner=winner)


def explain(jobs: Mapping[str, JobState], policy: Policy | None, usage: Usage = NO_USAGE,
            asks: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
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
            (j for j in jobs.values() if j.tpu is None and not j.terminal and j.state in WAITING_STATES
             and not j.cancel_requested), key=lambda j: (-j.priority, j.submitted_seq, j.id))])
        decision.admitted = set(decision.order)
        prio = Policy().priorities
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
            reason = job.queued_reason or "admitted: its TPU is asked for at the next pass"
            if job.queued_reason and job.queued_reason.startswith(("over quota", "waiting for the lab", "preempting")):
                reason = "admitted: its TPU is asked for at the next pass"
            elif job.queued_reason:
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
            "fair_share_usage": round(usage.decayed.get(job.owner, 0.0), 3),
            "wait": cause, "reason": reason, "ahead": ahead,
            "admitted_by": job.admitted_by or None,
            "victims": list(wait.victims) if wait else [],
        })
    return rows
