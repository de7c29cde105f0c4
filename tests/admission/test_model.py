"""Model test of sharing: the real planner (and its pure admission) over random labs,
policies and event orders, with a simulated executor and cloud. Pure: no server, no store.

Hypothesis draws a lab (the lab's chips, team and user quotas, a weekly quota, borrowing,
what a spent week does, who preempts whom, team weights, the half-life) and a sequence of
steps: a job submitted, finished, cancelled, admitted by an operator, preempted by the cloud,
a checkpoint, time passing, in any order and any number of times. After each step the
planner makes one pass (its actions applied as the executor would, in one go), and the
invariants are checked against what that pass decided:

- never over a quota (an operator's admit excepted: it passes its user and team quotas);
- no lower class admitted while a higher class waits on chips the lower one counts in;
- no starvation: every victim a job waits for is really giving its chips back; a family the
  lab holds nothing of has no job waiting for the lab's chips; and once the steps stop and
  time passes, every job that can fit under its limits runs;
- every waiting job has exactly one current reason (the one recorded), naming its own first
  blocker (checked by a separate reading of the rules, against what the pass left held).

`make model` runs many more and longer sequences (MODEL_EXAMPLES, MODEL_STEPS).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ledger.fold import RUNNING, JobState
from ledger.spec.policy import Policy, parse_policy
from reconciler import admission
from reconciler.admission import COHORT, LAB, WAITING_STATES, Decision, need_of
from reconciler.waits import KEPT, TOO_BIG, WEEK
from tests.admission.sim import World

EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "40"))
STEPS = int(os.environ.get("MODEL_STEPS", "30"))
OWNERS = ("alice", "bob", "carol", "dave")  # nlp: alice, bob; vision: carol (and alice); dave: no team
TYPES = ("v4-8", "v4-16", "v4-32", "v6e-4", "v6e-8")
CLASSES = {"low": 100, "normal": 500, "high": 900}


def maybe(values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from((None, *values))


LABS = st.fixed_dictionaries({
    "lab_v4": st.sampled_from((16, 32, 48)),
    "lab_v6e": maybe((8, 16)),
    "nlp": maybe((8, 16, 24)),
    "vision": maybe((8, 16)),
    "user": maybe((16, 32)),
    "alice_week": maybe((0.5, 2.0)),
    "borrowing": st.booleans(),
    "on_spent": st.sampled_from(("finish", "checkpoint-and-stop")),
    "preempt": st.sampled_from(({}, {"high": ["low"]}, {"high": ["low", "normal"], "normal": ["low"]})),
    "spot_for_on_demand": st.booleans(),
    "weights": st.tuples(st.integers(0, 3), st.integers(0, 3)),
    "half_life": st.sampled_from((1, 24)),
})
JOBS = st.lists(st.tuples(st.sampled_from(OWNERS), st.sampled_from(TYPES), st.sampled_from(tuple(CLASSES.values())),
                          st.sampled_from(("spot", "ondemand")), st.integers(0, 3)), min_size=3, max_size=8)
JOB = st.integers(0, 7)  # modulo the lab's jobs
STEP = st.one_of(
    st.tuples(st.just("submit"), JOB), st.tuples(st.just("submit"), JOB), st.tuples(st.just("submit"), JOB),
    st.tuples(st.just("finish"), JOB), st.tuples(st.just("cancel"), JOB), st.tuples(st.just("admit"), JOB),
    st.tuples(st.just("preempt"), JOB), st.tuples(st.just("checkpoint"), JOB),
    st.tuples(st.just("tick"), st.sampled_from((0.1, 0.5, 2.0))), st.tuples(st.just("pass")),
)


def lab_policy(d: dict[str, Any]) -> Policy:
    def chips(**by_family: int | None) -> str:
        return "{" + ", ".join(f"{k}: {v}" for k, v in by_family.items() if v is not None) + "}"

    teams = {"@lab/nlp": d["nlp"], "@lab/vision": d["vision"]}
    lines = ['teams:', '  "@lab/nlp": [alice, bob]', '  "@lab/vision": [carol, alice]', "quotas:",
             f"  lab: {{chips: {chips(v4=d['lab_v4'], v6e=d['lab_v6e'])}}}", "  teams:"]
    lines += [f'    "{t}": {{chips: {{v4: {v}}}}}' for t, v in teams.items() if v is not None] or ["    {}"]
    if lines[-1] == "    {}":
        lines[-2:] = ["  teams: {}"]
    if d["user"] is not None:
        lines.append(f"  default_user: {{chips: {{v4: {d['user']}, v6e: {d['user']}}}}}")
    if d["alice_week"] is not None:
        lines.append(f"  users:\n    alice: {{chips: {{v4: 32}}, chip_hours_per_week: {{v4: {d['alice_week']}}}}}")
    lines += [f"  borrowing: {str(d['borrowing']).lower()}", f"  on_spent: {d['on_spent']}",
              "priorities:", f"  classes: {CLASSES}".replace("'", ""), f"  preempt: {d['preempt']}".replace("'", ""),
              f"  spot_for_on_demand: {str(d['spot_for_on_demand']).lower()}",
              "fair_share:", f"  half_life_hours: {d['half_life']}",
              f'  teams: {{"@lab/nlp": {d["weights"][0]}, "@lab/vision": {d["weights"][1]}}}']
    policy, errors = parse_policy("\n".join(lines) + "\n")
    assert errors == (), ["\n".join(lines), *(m.format() for m in errors)]
    return policy


# -- the rules, read again for the checks ---------------------------------------------------
def class_of(policy: Policy, priority: int) -> int:
    return policy.priorities.class_of(priority)[1]


def own_scopes(policy: Policy, job: JobState) -> list[str]:
    """The job's scopes in the order its blockers are looked for: user, teams, lab."""
    q = policy.quotas
    return [f"user {job.owner}", *(f"team {t}" for t in q.teams if t in q.teams_of(job.owner, policy.teams)), LAB]


def quota_of(policy: Policy, scope: str) -> Any:
    q = policy.quotas
    if scope == LAB:
        return q.lab
    if scope.startswith("team "):
        return q.teams[scope[5:]]
    return q.of_user(scope[5:])


def in_cohort(policy: Policy, job: JobState, family: str) -> bool:
    q = policy.quotas
    return q.borrowing and any(family in q.teams[t].chips for t in q.teams_of(job.owner, policy.teams))


def counts_in(policy: Policy, job: JobState, scope: str, family: str) -> bool:
    """Do the job's chips of `family` count against `scope`?"""
    need = need_of(job)
    if need is None or need.family != family:
        return False
    if scope == COHORT:
        return in_cohort(policy, job, family)
    return scope in own_scopes(policy, job)


def holding(jobs: dict[str, JobState]) -> list[JobState]:
    return [j for j in jobs.values() if j.tpu is not None and need_of(j) is not None]


def held_by(policy: Policy, jobs: list[JobState], scope: str, family: str, *, skip_admitted: bool = False) -> int:
    return sum(need_of(j).chips for j in jobs  # type: ignore[union-attr]
               if counts_in(policy, j, scope, family) and not (skip_admitted and j.admitted_by and scope != LAB))


def cohort_nominal(policy: Policy, family: str) -> int:
    return sum(q.chips.get(family, 0) for q in policy.quotas.teams.values())


def check(world: World, before: dict[str, JobState], d: Decision, usage: admission.Usage) -> None:
    policy, after = world.policy, world.jobs
    families = {"v4", "v6e"}
    # 1. never over a quota (an operator's admit excepted for user and team quotas)
    holders = holding(after)
    for family in families:
        lab = policy.quotas.lab.chips.get(family) if policy.quotas.lab else None
        assert lab is None or held_by(policy, holders, LAB, family) <= lab, f"lab over {family}"
        for owner in OWNERS:
            quota = policy.quotas.of_user(owner)
            limit = quota.chips.get(family) if quota else None
            assert limit is None or held_by(policy, holders, f"user {owner}", family, skip_admitted=True) <= limit
        for team, quota in policy.quotas.teams.items():
            limit = quota.chips.get(family)
            if limit is not None and not policy.quotas.borrowing:
                assert held_by(policy, holders, f"team {team}", family, skip_admitted=True) <= limit, f"team {team} over"
        if policy.quotas.borrowing and family in {f for q in policy.quotas.teams.values() for f in q.chips}:
            assert held_by(policy, holders, COHORT, family, skip_admitted=True) <= cohort_nominal(policy, family)
    # 2. no lower class admitted while a higher class waits on chips it counts in
    for low_id in d.admitted:
        low = before[low_id]
        if low.admitted_by:
            continue
        for high_id, wait in d.waits.items():
            high = before[high_id]
            if class_of(policy, high.priority) <= class_of(policy, low.priority):
                continue
            if wait.unit == WEEK or wait.detail == TOO_BIG:
                continue  # time, or a bigger quota, is what it waits for: no chips the low one takes
            assert not counts_in(policy, low, wait.scope, wait.family), f"{low_id} admitted past {high_id}: {wait}"
    # 3. no starvation
    for job_id, wait in d.waits.items():
        for victim in wait.victims:
            assert victim in d.preempt or giving_back(before[victim]), f"{job_id} waits for {victim}, which runs on"
    now_held = holding(before) + [before[k] for k in d.admitted if need_of(before[k])]
    for family in families:
        if held_by(policy, now_held, LAB, family) == 0:
            stuck = [k for k, w in d.waits.items() if w.family == family and w.cause in ("capacity", "preempting")
                     and w.scope == LAB]
            assert not stuck, f"the lab holds no {family} chips, yet {stuck} wait for them"
    # 4. one current reason each, naming its own first blocker
    for job_id, wait in d.waits.items():
        job = after[job_id]
        if job.state in WAITING_STATES and job.tpu is None and not job.cancel_requested:
            assert job.queued_reason == wait.recorded, (job_id, job.queued_reason, wait.recorded)
        first_blocker(world, before, before[job_id], wait, d, now_held, usage)


def giving_back(job: JobState) -> bool:
    """Taken back by admission, and not run since: its chips are on their way back."""
    return bool((job.last_error or {}).get("cause")) and job.tpu is not None \
        and job.times.get("preempted", "") > job.times.get("started", "")


def most(policy: Policy, scope: str, family: str) -> float:
    """The most chips a scope can ever hold (a team that may borrow: the cohort's, were the others idle)."""
    quota = quota_of(policy, scope)
    limit = quota.chips.get(family) if quota is not None else None
    if limit is None:
        return float("inf")
    if scope.startswith("team ") and policy.quotas.borrowing:
        return max(limit, cohort_nominal(policy, family))
    return limit


def chips_waits(before: dict[str, JobState], d: Decision) -> list[tuple[JobState, admission.Wait]]:
    """The jobs held back by chips (not by their week, nor too big): the chips they need are
    kept from lower classes."""
    return [(before[k], w) for k, w in d.waits.items()
            if w.cause == "quota" and w.unit != WEEK and w.detail != TOO_BIG and not before[k].admitted_by]


def first_blocker(world: World, before: dict[str, JobState], job: JobState, wait: admission.Wait, d: Decision,
                  held: list[JobState], usage: admission.Usage) -> None:
    """The job's own first blocker, read again from the rules: the most lasting first (a
    limit smaller than the job, a spent week, then chips), each in the order user, teams,
    lab; then the line for the lab's (or the lent) chips."""
    policy = world.policy
    need = need_of(job)
    assert need is not None
    fam, mine = need.family, class_of(policy, job.priority)
    scopes = [s for s in own_scopes(policy, job) if quota_of(policy, s) is not None and (s == LAB or not job.admitted_by)]

    def borrow(scope: str, chips: int) -> bool:
        return (scope.startswith("team ") and in_cohort(policy, job, fam)
                and held_by(policy, held, COHORT, fam) + chips <= cohort_nominal(policy, fam))

    found: tuple[str, str] | None = None
    for s in scopes:
        if need.chips > most(policy, s, fam):
            found = found or (s, TOO_BIG)
    for s in scopes:
        hours = quota_of(policy, s).chip_hours_per_week.get(fam)
        used = sum(h for (o, f), h in usage.week.items() if f == fam and _scope_has(policy, s, o))
        if hours is not None and used >= hours:
            found = found or (s, WEEK)
    for s in scopes:
        limit = quota_of(policy, s).chips.get(fam)
        if found or s == LAB or limit is None:
            continue
        now = held_by(policy, held, s, fam)
        kept = sum(need_of(h).chips for h, _ in chips_waits(before, d)  # type: ignore[union-attr]
                   if class_of(policy, h.priority) > mine and counts_in(policy, h, s, fam))
        if now + need.chips > limit and not borrow(s, need.chips):
            found = (s, "chips")
        elif kept and now + need.chips + kept > limit and not borrow(s, need.chips + kept):
            found = (s, KEPT)
    if wait.cause == "quota":
        assert found, f"{job.id} waits for {wait.scope}, which does not stop it: {wait}"
        scope, why = found
        kind = WEEK if wait.unit == WEEK else wait.detail if wait.detail in (TOO_BIG, KEPT) else "chips"
        assert (scope, why) == (wait.scope, kind), f"{job.id}: its first blocker is {scope} ({why}), not {wait}"
        return
    assert found is None, f"{job.id} waits for the {wait.scope}'s chips, but {found} stops it first"
    assert wait.scope in (LAB, COHORT) and counts_in(policy, job, wait.scope, fam)
    lab = policy.quotas.lab.chips.get(fam) if policy.quotas.lab else None
    short = (lab is not None and held_by(policy, held, LAB, fam) + need.chips > lab
             or in_cohort(policy, job, fam) and not job.admitted_by
             and held_by(policy, held, COHORT, fam) + need.chips > cohort_nominal(policy, fam))
    ahead = d.order[:d.order.index(job.id)]
    behind = any(k in d.waits and d.waits[k].cause in ("capacity", "preempting") and d.waits[k].family == fam
                 and not d.waits[k].behind for k in ahead)
    assert short or behind, f"{job.id} waits for chips that are free, with no job ahead of it: {wait}"


def _scope_has(policy: Policy, scope: str, owner: str) -> bool:
    if scope == LAB:
        return True
    if scope.startswith("team "):
        return scope[5:] in policy.quotas.teams_of(owner, policy.teams)
    return scope == f"user {owner}"


BASE = {"lab_v4": 48, "lab_v6e": None, "nlp": None, "vision": None, "user": None, "alice_week": None, "borrowing": False,
        "on_spent": "finish", "preempt": {}, "spot_for_on_demand": False, "weights": (1, 1), "half_life": 24}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(LABS, JOBS, st.lists(STEP, min_size=STEPS // 2, max_size=STEPS))
@example(  # nlp borrows vision's idle chips; vision takes them back
    {**BASE, "nlp": 8, "vision": 16, "borrowing": True},
    [("bob", "v4-32", 900, "spot", 2), ("carol", "v4-32", 100, "ondemand", 2)],
    [("submit", 0), ("submit", 1), ("pass",), ("pass",), ("finish", 1), ("pass",), ("pass",)])
@example(  # a low job is held back for a high one of the same user, which preempts another low one
    {**BASE, "lab_v4": 16, "user": 16, "preempt": {"high": ["low"]}},
    [("alice", "v4-16", 100, "spot", 2), ("alice", "v4-32", 900, "ondemand", 2), ("alice", "v4-8", 100, "spot", 2),
     ("dave", "v4-16", 100, "spot", 1), ("dave", "v4-32", 900, "spot", 1)],
    [("submit", 0), ("submit", 3), ("submit", 1), ("submit", 2), ("pass",), ("finish", 0), ("pass",), ("submit", 4),
     ("pass",), ("pass",)])
@example(  # the held-out lab's case: a former victim runs again, and is preempted again for another
    {**BASE, "lab_v4": 16, "preempt": {"high": ["low"]}},
    [("alice", "v4-16", 100, "spot", 3), ("dave", "v4-16", 100, "spot", 3), ("carol", "v4-16", 900, "ondemand", 3),
     ("carol", "v4-8", 900, "ondemand", 3)],
    [("submit", 1), ("submit", 0), ("submit", 2), ("pass",), ("pass",), ("finish", 2), ("pass",), ("pass",),
     ("submit", 3), ("pass",), ("pass",)])
@example(  # a running job's week runs out: it stops at its next checkpoint, and resumes next week
    {**BASE, "alice_week": 0.5, "on_spent": "checkpoint-and-stop"},
    [("alice", "v4-32", 500, "spot", 2), ("alice", "v4-8", 500, "spot", 2)],
    [("submit", 0), ("tick", 2.0), ("pass",), ("checkpoint", 0), ("pass",), ("pass",), ("submit", 1), ("tick", 200.0),
     ("pass",)])
def test_sharing_holds_its_invariants_under_any_order_of_events(lab, templates, steps):
    world = World(lab_policy(lab), templates)
    for step in steps:
        world.step(*step)
        check(world, *world.one_pass())
    # The steps stop; every running job ends, time passes: whoever can fit runs, in the end.
    for _ in range(4 * len(templates) + 4):
        for job in list(world.jobs.values()):
            if job.state == RUNNING:
                world.append(job.id, "finished", {})
        world.clock += 8 * 24 * 3600  # past any week's quota
        check(world, *world.one_pass())
    for kind in sorted(world.seen):
        event(f"saw {kind}")
    for job in world.jobs.values():
        if job.terminal or job.cancel_requested:
            continue
        need = need_of(job)
        assert need is not None
        too_big = [s for s in own_scopes(world.policy, job)
                   if need.chips > most(world.policy, s, need.family) and not (job.admitted_by and s != LAB)]
        assert too_big, f"{job.id} starves: {job.state}, {job.queued_reason!r}"
