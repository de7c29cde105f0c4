"""Sharing, round 2 (pure): a former victim can be preempted again, waiting is quiet, figures
are exact, every reason names the job's own first blocker, the fair tree shares by team
first, teams borrow and reclaim, and a weekly quota that runs out stops a running job at its
checkpoint when the policy says so."""

from __future__ import annotations

from reconciler import admission
from reconciler.admission import Usage, admit, explain, given_back
from reconciler.model import NodeObs, Observed, PlanConfig
from reconciler.plan import plan
from tests.admission.lab import NOW, ZONE, Lab, policy

TWO_TEAMS = """\
teams:
  "@lab/nlp": [alice, dave]
  "@lab/vision": [bob, carol]
quotas:
  lab: {chips: {v4: 64}}
  default_user: {chips: {v4: 64}}
priorities:
  classes: {low: 100, normal: 500, high: 900}
  preempt: {high: [low]}
"""


def victim_runs_again(lab: Lab, job_id: str, winner: str) -> None:
    """`job_id` was preempted for `winner`, gave its TPU back and runs again as attempt 2."""
    tpu2 = {"name": "tl-again-" + job_id.replace("/", "-"), "zone": ZONE, "kind": "node", "accelerator": "v4-64"}
    lab.event(job_id, "preempted", admission.preemption(lab.jobs[job_id], winner).to_builtins())
    assert given_back(lab.jobs[job_id])
    for type_, data in [("released", {"tpu": {"name": lab.jobs[job_id].tpu["name"]}}),
                        ("resumed", {"attempt": 2, "restarts": 1, "rule": "resume", "reapply": True}),
                        ("provisioning", {"attempt": 2, "tpu": tpu2}), ("provisioned", {"tpu": tpu2, "hosts": [{"worker": 0}]}),
                        ("setup_started", {}), ("setup_done", {}), ("started", {"attempt": 2})]:
        lab.event(job_id, type_, data)


def test_a_former_victim_running_again_can_be_preempted_again():
    lab = Lab()
    lab.running("alice/a3", "v4-64", priority=100, started=NOW - 600)  # 32
    lab.running("dave/d1", "v4-64", priority=100, started=NOW - 300)  # 32: the lab's 64 are used
    lab.waiting("carol/c0", "v4-64", priority=900)
    victim_runs_again(lab, "alice/a3", "carol/c0")  # c0 has since run and ended
    lab.jobs.pop("carol/c0")
    assert not given_back(lab.jobs["alice/a3"])  # a stale cause is no chip being freed
    lab.waiting("carol/c3", "v4-64", priority=900)
    d = admit(lab.jobs, policy(TWO_TEAMS))
    assert len(d.preempt) == 1 and set(d.preempt.values()) == {"carol/c3"}
    assert d.waits["carol/c3"].cause == "preempting" and d.waits["carol/c3"].victims == tuple(d.preempt)


def test_waiting_on_a_weekly_quota_writes_one_event_however_the_figure_moves():
    text = "quotas:\n  users:\n    alice: {chip_hours_per_week: {v4: 100}}\n"
    lab = Lab()
    lab.running("alice/big", "v4-128")
    lab.waiting("alice/next", "v4-8")
    config = PlanConfig(policy=policy(text))
    obs = Observed(now=NOW, zones=frozenset({ZONE}), nodes={"tl-alice-big": NodeObs("tl-alice-big", ZONE, "READY", {})})
    written = []
    for tenth in range(1000, 1200):  # 100.0 .. 119.9 chip-hours: one figure per tenth
        usage = Usage(week={("alice", "v4"): tenth / 10})
        for action in plan(lab.jobs, obs, config=config, usage=usage):
            if action.job_id == "alice/next":
                assert action.kind == "record"
                for event in action.params["events"]:
                    written.append(event)
                    lab.event("alice/next", event.event_type, event.to_builtins())
    assert [e.event_type for e in written] == ["queued"]
    assert written[0].held == 100.0 and written[0].reason == "over quota: user alice has used its 100 v4 chip-hours of the week"


def test_a_chips_quota_wait_is_recorded_once_while_the_owner_holds_more_or_less():
    lab = Lab()
    lab.running("alice/a", "v4-64")
    lab.running("alice/b", "v4-64")  # alice holds 64 of 64
    lab.waiting("alice/c", "v4-64")
    first = admit(lab.jobs, policy()).waits["alice/c"]
    lab.event("alice/c", "queued", admission.queued(first).to_builtins())
    lab.event("alice/b", "finished", {})
    lab.event("alice/b", "released", {"tpu": {"name": "tl-alice-b"}})
    lab.running("alice/e", "v4-32")  # now 48 of 64: still over for 32 more
    again = admit(lab.jobs, policy()).waits["alice/c"]
    assert again.held == 48 and admission.recorded(lab.jobs["alice/c"], again)


def test_recorded_figures_are_exact_and_shown_to_the_quotas_precision():
    text = "quotas:\n  users:\n    alice: {chip_hours_per_week: {v4: 0.01}}\n"
    lab = Lab()
    lab.waiting("alice/a", "v4-8")
    wait = admit(lab.jobs, policy(text), Usage(week={("alice", "v4"): 0.0123456})).waits["alice/a"]
    assert admission.queued(wait).held == 0.0123456 and admission.queued(wait).limit == 0.01
    assert "used 0.0123 of 0.01 v4 chip-hours" in wait.explain()
    assert wait.recorded == "over quota: user alice has used its 0.01 v4 chip-hours of the week"


def test_a_job_behind_the_head_says_its_own_quota_when_that_stops_it():
    lab = Lab()
    lab.running("alice/a", "v4-128")  # alice holds her 64
    lab.running("carol/c", "v4-64")  # the lab: 96 of 128
    lab.waiting("dave/big", "v4-128", priority=900)  # 64 more: the head of the v4 line
    lab.waiting("alice/next", "v4-8")  # behind dave, but her own quota stops her first
    lab.waiting("erin/small", "v4-8")
    d = admit(lab.jobs, policy())
    assert d.waits["dave/big"].cause == "capacity"
    assert (d.waits["alice/next"].cause, d.waits["alice/next"].scope) == ("quota", "user alice")
    assert d.waits["erin/small"].cause == "capacity" and d.waits["erin/small"].behind == "dave/big"


def test_the_reason_is_the_first_blocker_as_things_stand_after_the_pass():
    text = ('teams:\n  "@lab/nlp": [alice, bob]\nquotas:\n  teams:\n    "@lab/nlp": {chips: {v4: 40}}\n'
            "  users:\n    alice: {chips: {v4: 36}}\n")
    lab = Lab()
    lab.running("bob/b", "v4-32")  # team: 16 of 40
    lab.waiting("alice/j", "v4-64")  # 32: the user has room, the team has not
    lab.waiting("alice/k", "v4-16")  # 8: fits both, admitted after j
    d = admit(lab.jobs, policy(text))
    assert d.admitted == {"alice/k"}
    # With k admitted, alice holds 8 of her 36: her own quota is j's first blocker now.
    assert (d.waits["alice/j"].scope, d.waits["alice/j"].held) == ("user alice", 8)


def test_a_lower_class_does_not_take_the_chips_a_higher_class_of_the_scope_waits_for():
    text = "quotas:\n  users:\n    alice: {chips: {v4: 64}}\npriorities:\n  classes: {low: 100, normal: 500, high: 900}\n"
    lab = Lab()
    lab.running("alice/a", "v4-64")  # 32 of 64
    lab.waiting("alice/high", "v4-128", priority=900)  # 64 more: waits for her quota
    lab.waiting("alice/low", "v4-8", priority=100)  # 4 would fit, but would delay the high one
    lab.waiting("alice/high2", "v4-8", priority=900)  # the same class may go on
    d = admit(lab.jobs, policy(text))
    assert d.admitted == {"alice/high2"}
    low = d.waits["alice/low"]
    assert (low.cause, low.scope, low.kept_for) == ("quota", "user alice", "alice/high")
    assert low.recorded == "held back: user alice's v4 chips are kept for a job of a higher class"


def test_a_job_bigger_than_its_quota_keeps_nothing_from_anyone():
    text = "quotas:\n  users:\n    alice: {chips: {v4: 16}}\n"
    lab = Lab()
    lab.waiting("alice/huge", "v4-64", priority=900)  # 32 > 16: never fits
    lab.waiting("alice/small", "v4-8", priority=100)
    d = admit(lab.jobs, policy(text))
    assert d.waits["alice/huge"].recorded == "too big: user alice may hold 16 v4 chips, this job needs 32"
    assert d.admitted == {"alice/small"}


def test_fair_share_goes_by_team_first():
    lab = Lab()
    lab.waiting("bob/b1", "v4-8")
    lab.waiting("dave/d1", "v4-8")
    # bob's own usage is the smaller, but his team (vision) has used far more than nlp.
    usage = Usage(decayed={"bob": 0.5, "carol": 0.51, "dave": 0.06})
    d = admit(lab.jobs, policy(TWO_TEAMS), usage)
    assert d.order == ["dave/d1", "bob/b1"]
    rows = explain(lab.jobs, policy(TWO_TEAMS), usage)
    assert [(r["job"], r["team"], r["fair_share_rank"]) for r in rows] == [("dave/d1", "@lab/nlp", 1), ("bob/b1", "@lab/vision", 2)]


def test_team_weights_share_the_lab():
    text = TWO_TEAMS + 'fair_share:\n  teams: {"@lab/nlp": 1, "@lab/vision": 3}\n  users: {carol: 2}\n'
    lab = Lab()
    for job_id in ("alice/a", "bob/b", "carol/c"):
        lab.waiting(job_id, "v4-8")
    # vision used twice what nlp did, but has three times the weight: it is owed more.
    usage = Usage(decayed={"alice": 10.0, "bob": 10.0, "carol": 10.0})
    assert admit(lab.jobs, policy(text), usage).order == ["carol/c", "bob/b", "alice/a"]
    tree = admit(lab.jobs, policy(text), usage).tree
    assert tree is not None
    teams = {lv.name: lv for lv in tree.levels if lv.level == "team"}
    assert teams["@lab/vision"].share == 0.75 and teams["@lab/vision"].usage == 20.0
    assert round(teams["@lab/vision"].usage_share, 3) == 0.667


BORROW = """\
teams:
  "@lab/nlp": [alice]
  "@lab/vision": [bob]
quotas:
  lab: {chips: {v4: 128}}
  teams:
    "@lab/nlp": {chips: {v4: 64}}
    "@lab/vision": {chips: {v4: 64}}
  borrowing: true
priorities:
  classes: {low: 100, normal: 500, high: 900}
"""


def test_a_team_borrows_what_another_leaves_idle_only_with_borrowing_on():
    lab = Lab()
    lab.running("alice/a", "v4-128")  # nlp: 64 of its 64
    lab.waiting("alice/b", "v4-64")  # 32 more: vision's are idle
    assert admit(lab.jobs, policy(BORROW)).admitted == {"alice/b"}
    off = admit(lab.jobs, policy(BORROW.replace("borrowing: true", "borrowing: false")))
    assert off.waits["alice/b"].recorded == "over quota: team @lab/nlp may hold 64 v4 chips, needs 32"
    lab.running("bob/v", "v4-64")  # vision uses 32 of its own: 32 idle, nlp needs 32
    lab.running("alice/b", "v4-64")  # nlp borrows them: the cohort's 128 are all used
    lab.waiting("alice/c", "v4-8")
    wait = admit(lab.jobs, policy(BORROW)).waits["alice/c"]
    assert wait.recorded == "over quota: team @lab/nlp may hold 64 v4 chips and no other team's are idle, needs 4"


def test_the_lender_reclaims_its_chips_from_the_borrower_whatever_the_class():
    lab = Lab()
    lab.running("alice/own", "v4-128", priority=900, started=NOW - 900)  # nlp: its 64
    lab.running("alice/borrowed", "v4-128", priority=900, started=NOW - 600)  # 64 more, vision's
    lab.waiting("bob/v", "v4-64", priority=100)  # vision wants 32 of its own, low class or not
    d = admit(lab.jobs, policy(BORROW))
    assert d.preempt == {"alice/borrowed": "bob/v"} and d.reclaim == {"alice/borrowed"}
    assert d.waits["bob/v"].recorded == "reclaiming lent v4 chips from alice/borrowed"
    event = admission.preemption(lab.jobs["alice/borrowed"], "bob/v", reclaim=True)
    assert (event.cause, event.winner) == ("reclaim", "bob/v")
    # once given back, it is counted as freeing: nothing more is taken
    lab.event("alice/borrowed", "preempted", event.to_builtins())
    again = admit(lab.jobs, policy(BORROW))
    assert again.preempt == {} and again.waits["bob/v"].victims == ("alice/borrowed",)


def test_a_team_over_its_own_quota_reclaims_nothing():
    lab = Lab()
    lab.running("alice/a", "v4-128", priority=100)  # nlp 64 of 64
    lab.running("bob/a", "v4-128", priority=100)  # vision 64 of 64: the cohort is full
    lab.waiting("bob/b", "v4-8", priority=900)
    d = admit(lab.jobs, policy(BORROW))
    assert d.preempt == {} and d.waits["bob/b"].scope == "team @lab/vision"


SPENT = """\
quotas:
  users:
    alice: {chip_hours_per_week: {v4: 100}}
  on_spent: checkpoint-and-stop
"""


def test_a_running_job_whose_week_runs_out_stops_at_its_next_checkpoint():
    lab = Lab()
    lab.running("alice/train", "v4-64", started=NOW - 3600)
    lab.event("alice/train", "checkpointed", {"attempt": 1, "step": 10}, when=NOW - 1800)  # before: not this one
    config = PlanConfig(policy=policy(SPENT))
    obs = Observed(now=NOW, zones=frozenset({ZONE}), nodes={"tl-alice-train": NodeObs("tl-alice-train", ZONE, "READY", {})})
    under = Usage(week={("alice", "v4"): 99.0})
    assert plan(lab.jobs, obs, config=config, usage=under) == []
    spent = Usage(week={("alice", "v4"): 100.5})
    (action,) = plan(lab.jobs, obs, config=config, usage=spent)
    (event,) = action.params["events"]
    assert (event.event_type, event.scope, event.used, event.limit, event.then) == (
        "quota_spent", "user alice", 100.5, 100, "checkpoint-and-stop")
    lab.event("alice/train", "quota_spent", event.to_builtins(), when=NOW - 20)
    assert plan(lab.jobs, obs, config=config, usage=spent) == []  # once per attempt; no checkpoint since
    lab.event("alice/train", "checkpointed", {"attempt": 1, "step": 11}, when=NOW - 10)
    (stop,) = plan(lab.jobs, obs, config=config, usage=spent)
    (event,) = stop.params["events"]
    assert (event.event_type, event.cause) == ("preempted", "quota")
    lab.event("alice/train", "preempted", event.to_builtins(), when=NOW - 5)
    assert given_back(lab.jobs["alice/train"])
    (recover,) = plan(lab.jobs, obs, config=config, usage=spent)
    assert recover.kind == "recover" and recover.params["reapply"] and recover.params["stop"]


def test_a_job_that_would_not_come_back_is_never_stopped_for_its_week():
    lab = Lab()
    lab.running("alice/train", "v4-64", started=NOW - 3600)
    lab.jobs["alice/train"].spec["recovery"] = {"on_preempted": "pass", "max_restarts": 3}
    config = PlanConfig(policy=policy(SPENT))
    obs = Observed(now=NOW, zones=frozenset({ZONE}), nodes={"tl-alice-train": NodeObs("tl-alice-train", ZONE, "READY", {})})
    spent = Usage(week={("alice", "v4"): 100.5})
    (action,) = plan(lab.jobs, obs, config=config, usage=spent)
    assert action.params["events"][0].then == "finish"
    lab.event("alice/train", "quota_spent", action.params["events"][0].to_builtins(), when=NOW - 20)
    lab.event("alice/train", "checkpointed", {"attempt": 1, "step": 11}, when=NOW - 10)
    assert plan(lab.jobs, obs, config=config, usage=spent) == []


def test_under_finish_a_spent_week_is_recorded_and_the_job_runs_on():
    lab = Lab()
    lab.running("alice/train", "v4-64", started=NOW - 3600)
    config = PlanConfig(policy=policy(SPENT.replace("checkpoint-and-stop", "finish")))
    obs = Observed(now=NOW, zones=frozenset({ZONE}), nodes={"tl-alice-train": NodeObs("tl-alice-train", ZONE, "READY", {})})
    spent = Usage(week={("alice", "v4"): 100.5})
    (action,) = plan(lab.jobs, obs, config=config, usage=spent)
    lab.event("alice/train", "quota_spent", action.params["events"][0].to_builtins(), when=NOW - 20)
    lab.event("alice/train", "checkpointed", {"attempt": 1, "step": 11}, when=NOW - 10)
    assert plan(lab.jobs, obs, config=config, usage=spent) == []
