"""Properties of admission over random labs (hypothesis): deterministic, whatever the order
the jobs are listed in, and never admitting past a quota."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.admission import Usage, admit, need_of
from reconciler.model import Observed, PlanConfig
from reconciler.plan import plan
from tests.admission.lab import NOW, Lab, policy

OWNERS = ("alice", "bob", "carol")
TYPES = ("v4-8", "v4-16", "v4-32", "v4-64", "v6e-4", "v6e-8")
POLICY = """\
teams:
  "@lab/nlp": [alice, bob]
quotas:
  lab: {chips: {v4: 64, v6e: 16}}
  teams:
    "@lab/nlp": {chips: {v4: 48}}
  users:
    alice: {chips: {v4: 16}, chip_hours_per_week: {v6e: 10}}
  default_user: {chips: {v4: 32, v6e: 8}}
priorities:
  classes: {low: 100, normal: 500, urgent: 900}
  preempt: {urgent: [low], normal: [low]}
  spot_for_on_demand: true
"""

job = st.tuples(st.sampled_from(OWNERS), st.sampled_from(TYPES), st.sampled_from((100, 500, 900)),
                st.booleans(), st.sampled_from(("spot", "ondemand")))


def build(jobs: list[tuple[str, str, int, bool, str]]) -> Lab:
    """A lab whose running jobs fit the quotas (as admission would have left it)."""
    lab = Lab()
    p = policy(POLICY)
    for i, (owner, accelerator, priority, running, pricing) in enumerate(jobs):
        job_id = f"{owner}/j{i}"
        if running:
            trial = Lab()
            trial.jobs, trial.seq = dict(lab.jobs), lab.seq
            trial.waiting(job_id, accelerator, priority=priority, pricing=pricing)
            if job_id not in admit(trial.jobs, p).admitted:
                continue  # would not have been admitted: leave it out
            lab.running(job_id, accelerator, priority=priority, pricing=pricing, started=NOW - 100 + i)
        else:
            lab.waiting(job_id, accelerator, priority=priority, pricing=pricing)
    return lab


usages = st.fixed_dictionaries({o: st.floats(0, 1000) for o in OWNERS})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(job, max_size=14), usages, st.randoms(use_true_random=False))
def test_same_ledger_same_admissions_whatever_the_order(jobs, decayed, rnd: random.Random):
    lab = build(jobs)
    p = policy(POLICY)
    usage = Usage(decayed=decayed, week={("alice", "v6e"): 12.0})
    first = admit(lab.jobs, p, usage)
    items = list(lab.jobs.items())
    rnd.shuffle(items)
    again = admit(dict(items), p, usage)
    assert (first.order, first.admitted, first.waits, first.preempt) == (again.order, again.admitted, again.waits, again.preempt)
    obs = Observed(now=NOW)
    config = PlanConfig(policy=p)
    # the planner's actions are the same set (it lists them in the jobs' order)
    def by_job(actions):
        return sorted(actions, key=lambda a: a.job_id)

    assert by_job(plan(lab.jobs, obs, config=config, usage=usage)) == by_job(plan(dict(items), obs, config=config, usage=usage))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(job, max_size=14), usages)
def test_what_is_held_plus_what_is_admitted_never_goes_over_a_quota(jobs, decayed):
    lab = build(jobs)
    p = policy(POLICY)
    d = admit(lab.jobs, p, Usage(decayed=decayed))
    held = dict(d.held)
    q = p.quotas
    for job_id in d.admitted:
        j = lab.jobs[job_id]
        need = need_of(j)
        assert need is not None
        scopes = [(f"user {j.owner}", q.of_user(j.owner)), ("lab", q.lab),
                  *((f"team {t}", q.teams[t]) for t in q.teams_of(j.owner, p.teams))]
        for scope, quota in scopes:
            held[(scope, need.family)] = held.get((scope, need.family), 0) + need.chips
            limit = quota.chips.get(need.family) if quota else None
            assert limit is None or held[(scope, need.family)] <= limit, (scope, need, held)
    # a preemption only ever takes from a lower class, and only for a job that waits
    for victim, winner in d.preempt.items():
        assert lab.jobs[victim].priority < lab.jobs[winner].priority
        assert winner in d.waits and d.waits[winner].cause == "preempting"
