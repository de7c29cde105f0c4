"""Admission is pure: quotas, order, preemption and explanations from folded job states."""

from __future__ import annotations

from reconciler import admission
from reconciler.admission import Usage, admit, choose_victims, explain
from tests.admission.lab import Lab, policy


def test_a_user_over_quota_waits_with_the_numbers_while_others_go_on():
    lab = Lab()
    lab.running("alice/a", "v4-64")  # 32 chips
    lab.running("alice/b", "v4-64")  # 32: alice holds 64 of 64
    lab.waiting("alice/c", "v4-64")
    lab.waiting("carol/d", "v4-64")
    d = admit(lab.jobs, policy())
    assert d.admitted == {"carol/d"}
    wait = d.waits["alice/c"]
    assert (wait.cause, wait.scope, wait.family, wait.held, wait.limit, wait.needs) == ("quota", "user alice", "v4", 64, 64, 32)
    assert wait.recorded == "over quota: user alice may hold 64 v4 chips, needs 32"  # no live figure
    assert wait.explain() == "over quota: user alice holds 64 of 64 v4 chips, needs 32"


def test_team_quota_counts_every_member():
    lab = Lab()
    lab.running("alice/a", "v4-128")  # 64 chips
    lab.waiting("bob/b", "v4-128")  # team nlp: 64 + 64 > 96
    d = admit(lab.jobs, policy())
    assert d.waits["bob/b"].scope == "team @lab/nlp"


def test_the_lab_quota_makes_later_jobs_of_that_family_wait_behind_the_head():
    lab = Lab()
    lab.running("carol/big", "v4-128")  # 64 of 128
    lab.waiting("dave/x", "v4-256")  # 128: does not fit now -> head of the line
    lab.waiting("erin/small", "v4-8")  # 4 chips would fit, but no backfill past the head
    d = admit(lab.jobs, policy())
    assert d.waits["dave/x"].cause == "capacity"
    assert d.waits["erin/small"].cause == "capacity" and d.waits["erin/small"].behind == "dave/x"
    assert not d.admitted


def test_a_job_bigger_than_a_quota_never_blocks_the_line():
    lab = Lab()
    lab.waiting("dave/huge", "v4-512")  # 256 chips > the lab's 128
    lab.waiting("erin/small", "v4-8")
    d = admit(lab.jobs, policy())
    assert d.waits["dave/huge"].cause == "quota"
    assert d.admitted == {"erin/small"}


def test_order_is_priority_then_fair_share_then_submission():
    lab = Lab()
    lab.waiting("carol/first", "v4-8", priority=500)
    lab.waiting("dave/second", "v4-8", priority=500)
    lab.waiting("erin/low", "v4-8", priority=100)
    lab.waiting("frank/urgent", "v4-8", priority=900)
    usage = Usage(decayed={"carol": 50.0, "dave": 10.0})
    assert admit(lab.jobs, policy(), usage).order == ["frank/urgent", "dave/second", "carol/first", "erin/low"]
    assert admit(lab.jobs, policy()).order == ["frank/urgent", "carol/first", "dave/second", "erin/low"]


def test_weekly_chip_hours_quota():
    text = "quotas:\n  users:\n    alice: {chip_hours_per_week: {v4: 100}}\n"
    lab = Lab()
    lab.waiting("alice/a", "v4-8")
    lab.waiting("bob/b", "v4-8")
    d = admit(lab.jobs, policy(text), Usage(week={("alice", "v4"): 120.0, ("bob", "v4"): 500.0}))
    assert d.admitted == {"bob/b"}
    assert d.waits["alice/a"].unit == "chip_hours_per_week"
    assert d.waits["alice/a"].recorded == "over quota: user alice has used its 100 v4 chip-hours of the week"
    assert "used 120 of 100 v4 chip-hours this week" in d.waits["alice/a"].explain()


def test_an_operator_admit_passes_the_user_quota_but_not_the_lab():
    lab = Lab()
    lab.running("alice/a", "v4-128")  # 64: alice is full
    lab.waiting("alice/b", "v4-64")
    lab.event("alice/b", "admitted", {"reason": "deadline", "by": "sam"})
    text = "quotas:\n  users:\n    alice: {chips: {v4: 64}}\n  lab: {chips: {v4: 96}}\n"
    assert admit(lab.jobs, policy(text)).admitted == {"alice/b"}
    lab.waiting("alice/c", "v4-128")
    lab.event("alice/c", "admitted", {"reason": "deadline", "by": "sam"})
    assert admit(lab.jobs, policy(text)).waits["alice/c"].scope == "lab"


def test_an_urgent_job_preempts_the_lower_class_only_as_much_as_it_needs():
    lab = Lab()
    lab.running("carol/low-small", "v4-32", priority=100, started=100)  # 16
    lab.running("dave/low-big", "v4-128", priority=100, started=200)  # 64
    lab.running("erin/low-fit", "v4-64", priority=100, started=300)  # 32
    lab.running("frank/normal", "v4-8", priority=500)  # 4: never a victim for... normal isn't preemptible by urgent
    lab.waiting("gina/urgent", "v4-64", priority=900)  # needs 32; held 116 of 128 -> short 20
    d = admit(lab.jobs, policy())
    assert d.preempt == {"erin/low-fit": "gina/urgent"}  # the smallest that frees 20
    assert d.waits["gina/urgent"].cause == "preempting"


def test_victims_are_never_of_an_equal_or_higher_class():
    lab = Lab()
    lab.running("carol/urgent", "v4-256", priority=900)  # 128 of 128
    lab.waiting("gina/urgent", "v4-64", priority=950)
    d = admit(lab.jobs, policy())
    assert d.preempt == {} and d.waits["gina/urgent"].cause == "capacity"


def test_several_victims_when_one_is_not_enough_and_none_more():
    lab = Lab()
    for i, started in enumerate((100, 200, 300, 400)):
        lab.running(f"u{i}/low", "v4-64", priority=100, started=started)  # 4 x 32 = 128
    lab.waiting("gina/urgent", "v4-128", priority=900)  # needs 64
    d = admit(lab.jobs, policy())
    assert len(d.preempt) == 2
    # the most recent saves lose the least work: the two started last
    assert set(d.preempt) == {"u2/low", "u3/low"}


def test_choose_victims_prefers_the_most_recent_checkpoint_among_equals():
    lab = Lab()
    lab.running("a/x", "v4-64", priority=100, started=100)
    b = lab.running("b/x", "v4-64", priority=100, started=200)
    a = lab.event("a/x", "checkpointed", {"step": 10}, when=300)  # saved after b started
    assert choose_victims([a, b], 10) == [a]
    assert choose_victims([b, a], 10) == [a]
    assert {j.id for j in choose_victims([a, b], 64)} == {"a/x", "b/x"}
    assert choose_victims([a, b], 65) == []


def test_recorded_once_per_change_not_every_pass():
    lab = Lab()
    lab.running("alice/a", "v4-128")
    lab.waiting("alice/b", "v4-64")
    wait = admit(lab.jobs, policy()).waits["alice/b"]
    assert not admission.recorded(lab.jobs["alice/b"], wait)
    queued = admission.queued(wait)
    assert queued.wait == "quota" and queued.held == 64
    lab.event("alice/b", "queued", queued.to_builtins())
    assert admission.recorded(lab.jobs["alice/b"], admit(lab.jobs, policy()).waits["alice/b"])
    assert lab.jobs["alice/b"].queued_count == 0  # no retry backoff for an admission wait


def test_explain_lists_waiting_jobs_in_order_with_their_reason():
    lab = Lab()
    lab.running("alice/a", "v4-128")
    lab.waiting("alice/b", "v4-64")
    lab.waiting("carol/c", "v4-8", priority=900)
    rows = explain(lab.jobs, policy())
    assert [r["job"] for r in rows] == ["carol/c", "alice/b"]
    assert rows[0]["wait"] == "admitted" and rows[0]["class"] == "urgent"
    assert rows[1]["wait"] == "quota" and "holds 64 of 64 v4 chips, needs 32" in rows[1]["reason"]


def test_no_sharing_policy_admits_everyone():
    lab = Lab()
    lab.waiting("alice/a", "v4-4096")
    assert not admission.active(policy("teams: {}\n"))
    assert explain(lab.jobs, None)[0]["wait"] == "admitted"


def test_chips_already_being_given_back_are_counted_before_choosing_more_victims():
    lab = Lab()
    lab.running("carol/low", "v4-128", priority=100, started=100)  # 64
    lab.running("dave/low", "v4-128", priority=100, started=200)  # 64: the lab is full
    lab.waiting("gina/urgent", "v4-64", priority=900)  # needs 32
    first = admit(lab.jobs, policy())
    assert list(first.preempt) == ["dave/low"]  # the most recent save of two equals
    lab.event("dave/low", "preempted", admission.preemption(lab.jobs["dave/low"], "gina/urgent").to_builtins())
    lab.waiting("hank/urgent", "v4-32", priority=950)  # needs 16: dave's 64 being freed cover both
    again = admit(lab.jobs, policy())
    assert again.preempt == {}
    assert again.waits["hank/urgent"].cause == "preempting" and again.waits["hank/urgent"].victims == ("dave/low",)


def test_no_victim_is_chosen_while_a_waiting_job_of_that_family_has_an_action_in_flight():
    lab = Lab()
    lab.running("carol/low", "v4-256", priority=100)  # the whole lab
    lab.waiting("dave/x", "v4-8")
    lab.waiting("gina/urgent", "v4-64", priority=900)
    assert admit(lab.jobs, policy(), busy=["dave/x"]).preempt == {}
    assert admit(lab.jobs, policy()).preempt == {"carol/low": "gina/urgent"}


def test_spot_for_on_demand_lets_an_on_demand_job_preempt_a_lower_spot_job_only():
    text = ("quotas:\n  lab: {chips: {v4: 64}}\npriorities:\n  classes: {low: 100, normal: 500}\n"
            "  spot_for_on_demand: true\n")
    lab = Lab()
    lab.running("carol/spot", "v4-64", priority=100, pricing="spot")  # 32
    lab.running("dave/ondemand", "v4-64", priority=100, pricing="ondemand")  # 32: the lab is full
    lab.waiting("erin/x", "v4-64", priority=500, pricing="ondemand")
    assert admit(lab.jobs, policy(text)).preempt == {"carol/spot": "erin/x"}
    lab.jobs.pop("erin/x")
    lab.waiting("frank/spot", "v4-64", priority=500, pricing="spot")  # a spot job gains nothing from the rule
    assert admit(lab.jobs, policy(text)).preempt == {}
    lab.jobs.pop("frank/spot")
    lab.waiting("gina/same", "v4-64", priority=100, pricing="ondemand")  # same class: never
    assert admit(lab.jobs, policy(text)).preempt == {}


def test_a_job_that_would_not_come_back_is_never_a_victim():
    lab = Lab()
    lab.running("carol/low", "v4-256", priority=100)  # the whole lab
    lab.jobs["carol/low"].spec["recovery"] = {"on_preempted": "pass", "max_restarts": 3}
    lab.waiting("gina/urgent", "v4-64", priority=900)
    assert admit(lab.jobs, policy()).preempt == {}
    lab.jobs["carol/low"].spec["recovery"] = {"on_preempted": "reapply", "max_restarts": 0}  # budget spent
    assert admit(lab.jobs, policy()).preempt == {}
    lab.jobs["carol/low"].spec["recovery"] = {"on_preempted": "reapply", "max_restarts": 1}
    assert admit(lab.jobs, policy()).preempt == {"carol/low": "gina/urgent"}


RUNS = """\
teams:
  "@lab/nlp": [alice, bob]
quotas:
  lab: {chips: {v4: 128}}
  teams:
    "@lab/nlp": {chips: {v4: 60}}
  users:
    alice: {chips: {v4: 16}}
  default_user: {chips: {v4: 128}}
priorities:
  classes: {low: 100, normal: 500, urgent: 900}
"""


def test_alike_jobs_held_back_together_each_keep_their_chips_from_a_lower_class():
    # alice's two urgent jobs are alike (one owner, class and need): admission decides them
    # as a run, and each keeps its 8 chips in the team's quota, 16 in all.
    lab = Lab()
    lab.running("alice/a", "v4-32")  # 16: alice's own quota is full
    lab.waiting("alice/u1", "v4-16", priority=900)
    lab.waiting("alice/u2", "v4-16", priority=900)
    lab.waiting("bob/low", "v4-64", priority=100)  # 32: the team holds 16; 16 + 32 + 16 kept > 60
    d = admit(lab.jobs, policy(RUNS))
    assert {j: (d.waits[j].scope, d.waits[j].detail) for j in ("alice/u1", "alice/u2")} == \
        {"alice/u1": ("user alice", ""), "alice/u2": ("user alice", "")}
    low = d.waits["bob/low"]
    assert (low.scope, low.detail, low.kept_for) == ("team @lab/nlp", admission.KEPT, "alice/u1")
    assert not d.admitted


def test_every_job_of_a_held_back_run_gets_its_blocker_as_the_pass_left_things():
    # bob fills the team; alice's two normal jobs wait on it. An operator admits a later job
    # of hers past her own quota, so after the pass each of the two is over her user quota
    # first: the reason a next pass would give both, not the team's of the moment they were looked at.
    lab = Lab()
    lab.running("bob/full", "v4-128")  # 64 of the team's 60
    lab.waiting("alice/n1", "v4-16")
    lab.waiting("alice/n2", "v4-16")
    lab.waiting("alice/late", "v4-32", priority=100)
    lab.event("alice/late", "admitted", {"reason": "deadline", "by": "sam"})
    d = admit(lab.jobs, policy(RUNS))
    assert d.admitted == {"alice/late"}
    assert [d.waits[j].scope for j in ("alice/n1", "alice/n2")] == ["user alice", "user alice"]
    assert d.order == ["alice/n1", "alice/n2", "alice/late"]
