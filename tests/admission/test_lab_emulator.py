"""A lab of three users sharing TPUs on the emulator, with quotas and priorities: the real
reconciler, the real google-cloud-tpu client, real SSH hosts, a real SQLite ledger."""

from __future__ import annotations

from ledger.events.data import PolicyChanged
from ledger.fold import FINISHED, RUNNING, replay
from ledger.spec.policy import parse_policy, sharing_blocks
from ledger.store import open_store
from reconciler.admission import need_of
from tests.admission.conftest import LAB_POLICY, LabHarness
from tests.reconciler.conftest import job_spec


def spec(cmd: str, accelerator: str = "v4-8", *, priority: int = 500, pricing: str = "ondemand") -> dict:
    return {**job_spec(cmd, accelerator=accelerator, pricing=pricing), "priority": priority}


def never_over_quota(h: LabHarness) -> None:
    """After every event of the ledger (each is a sample), no user, team or the lab holds
    more chips of a family than its quota."""
    assert h.policy is not None
    q = h.policy.quotas
    store = open_store(h.store_url)
    try:
        events = list(store.read_all())
    finally:
        store.close()
    state = replay([])
    for e in events:
        state = replay([e], state)
        held: dict[tuple[str, str], int] = {}
        for job in state.jobs.values():
            need = need_of(job)
            if job.tpu is not None and need is not None:
                for scope in (f"user {job.owner}", "lab", *(f"team {t}" for t in q.teams_of(job.owner, h.policy.teams))):
                    held[(scope, need.family)] = held.get((scope, need.family), 0) + need.chips
        for (scope, family), chips in held.items():
            quota = q.lab if scope == "lab" else q.teams.get(scope[5:]) if scope.startswith("team ") else q.of_user(scope[5:])
            limit = quota.chips.get(family) if quota else None
            assert limit is None or chips <= limit, f"{scope} holds {chips} {family} chips > {limit} after seq {e.seq}"


def started_order(h: LabHarness) -> list[str]:
    store = open_store(h.store_url)
    try:
        return [e.stream for e in store.read_all() if e.type == "started"]
    finally:
        store.close()


def test_a_user_over_quota_waits_while_others_run(lab_harness: LabHarness):
    h = lab_harness
    h.submit("alice/one", spec("sleep 2; echo one"))  # 4 chips: alice's whole quota
    h.submit("alice/two", spec("echo two"))
    h.submit("bob/three", spec("sleep 1; echo three"))
    h.submit("carol/four", spec("sleep 1; echo four", "v4-16"))  # 8 chips: the lab's 16 are all taken
    h.start()
    two = h.wait("alice/two", lambda j: j.state == "queued")
    assert two.queued_reason == "over quota: user alice may hold 4 v4 chips, needs 4"
    h.wait("bob/three", lambda j: j.state in (RUNNING, FINISHED))
    h.wait("carol/four", lambda j: j.state in (RUNNING, FINISHED))
    assert h.job("alice/two").tpu is None
    for job_id in ("alice/one", "alice/two", "bob/three", "carol/four"):
        h.wait(job_id, lambda j: j.state == FINISHED and j.tpu is None, timeout=90)
    assert h.types("alice/two").count("queued") == 1  # once per change, not every pass
    never_over_quota(h)
    h.verify()


def test_an_urgent_job_preempts_a_low_priority_spot_job_which_resumes_after(lab_harness: LabHarness):
    h = lab_harness
    ckpt = h.tmp / "bucket"
    ckpt.mkdir()
    loop = ('step=$(cat "$CKPT/step" 2>/dev/null || echo 0); echo "attempt $LEDGER_ATTEMPT from step $step"; '
            'while [ "$step" -lt 16 ]; do step=$((step+1)); sleep 0.25; '
            'if [ "$TPU_WORKER_ID" = 0 ]; then echo $step > "$CKPT/step"; fi; done; echo done')
    low = {**spec(loop, "v4-32", priority=100, pricing="spot"), "command": {"cmd": loop, "workers": "all", "env": {"CKPT": str(ckpt)}}}
    h.submit("carol/low", low)  # 16 chips: the whole lab
    h.start()
    h.wait("carol/low", lambda j: j.state == RUNNING and (ckpt / "step").exists())
    h.submit("dave/urgent", spec("echo urgent", "v4-8", priority=900))
    h.wait("dave/urgent", lambda j: j.state == FINISHED, timeout=90)
    done = h.wait("carol/low", lambda j: j.state == FINISHED and j.tpu is None, timeout=120)
    store = open_store(h.store_url)
    try:
        preempted = [e for e in store.read_stream("carol/low") if e.type == "preempted"]
        waited = [e for e in store.read_stream("dave/urgent") if e.type == "queued"]
    finally:
        store.close()
    assert [(e.data["cause"], e.data["winner"]) for e in preempted] == [("priority", "dave/urgent")]
    assert waited and waited[0].data["wait"] == "preempting" and waited[0].data["victims"] == ["carol/low"]
    assert done.attempt == 2
    assert "attempt 2 from step" in h.output("carol/low", 2) and "from step 0" not in h.output("carol/low", 2)
    order = started_order(h)
    assert order.index("dave/urgent") < len(order) - 1 and order[-1] == "carol/low"
    never_over_quota(h)
    h.verify()


def test_fair_share_alternates_between_two_heavy_users(lab_harness: LabHarness):
    h = lab_harness
    h.use(LAB_ONE_AT_A_TIME)
    for i in range(3):
        h.submit(f"erin/e{i}", spec("sleep 0.5; echo e"))  # erin submits all hers first
    for i in range(3):
        h.submit(f"frank/f{i}", spec("sleep 0.5; echo f"))
    h.start()
    for job_id in [*(f"erin/e{i}" for i in range(3)), *(f"frank/f{i}" for i in range(3))]:
        h.wait(job_id, lambda j: j.state == FINISHED and j.tpu is None, timeout=120)
    owners = [s.split("/")[0] for s in started_order(h)]
    # First come first served would run erin's three jobs, then frank's.
    assert owners[:2] == ["erin", "frank"], owners
    assert max(_runs(owners)) <= 2, owners
    never_over_quota(h)
    h.verify()


LAB_ONE_AT_A_TIME = """\
quotas:
  lab: {chips: {v4: 4}}
fair_share:
  half_life_hours: 1
"""


def _runs(items: list[str]) -> list[int]:
    runs, last = [], None
    for x in items:
        if x == last:
            runs[-1] += 1
        else:
            runs.append(1)
        last = x
    return runs


def test_an_admin_raising_a_quota_in_the_policy_file_lets_the_waiting_job_start(lab_harness: LabHarness):
    h = lab_harness
    path = h.tmp / "policy.yaml"
    path.write_text(LAB_POLICY)
    h.submit("alice/one", spec("sleep 30; echo one"))
    h.submit("alice/two", spec("echo two"))
    h.follow(path)
    h.wait("alice/two", lambda j: j.queued_reason.startswith("over quota: user alice"))
    path.write_text(LAB_POLICY.replace("alice: {chips: {v4: 4}}", "alice: {chips: {v4: 8}}"))
    h.wait("alice/two", lambda j: j.state == FINISHED, timeout=90)
    assert h.job("alice/one").state == RUNNING  # both at once: 8 chips, her new quota
    store = open_store(h.store_url)
    try:
        assert [e.data["source"] for e in store.read_stream("_policy")] == [str(path), str(path)]
    finally:
        store.close()
    h.verify()


def test_by_default_the_reconciler_follows_the_rules_the_watcher_recorded(lab_harness: LabHarness):
    h = lab_harness

    def merged(text: str) -> None:  # what the watcher records when the policy file changes on main
        h.append("_policy", "policy_changed", PolicyChanged(commit="c0ffee", prices=[], sharing=sharing_blocks(h_policy(text)))
                 .to_builtins())

    merged(LAB_POLICY)
    h.submit("alice/one", spec("sleep 30; echo one"))
    h.submit("alice/two", spec("echo two"))
    h.follow(None)
    h.wait("alice/two", lambda j: j.queued_reason.startswith("over quota: user alice"))
    merged(LAB_POLICY.replace("alice: {chips: {v4: 4}}", "alice: {chips: {v4: 8}}"))
    h.wait("alice/two", lambda j: j.state == FINISHED, timeout=90)
    h.verify()


def h_policy(text: str):
    parsed, errors = parse_policy(text)
    assert errors == ()
    return parsed


def test_a_running_job_whose_week_runs_out_stops_at_its_next_checkpoint_and_waits(lab_harness: LabHarness):
    h = lab_harness
    h.use("quotas:\n  users:\n    alice: {chip_hours_per_week: {v4: 0.002}}\n  on_spent: checkpoint-and-stop\n")
    loop = 'for i in $(seq 1 200); do echo "LEDGER_CHECKPOINT step=$i"; sleep 0.3; done'
    h.submit("alice/train", {**spec(loop, pricing="spot"), "job": {"name": "t", "env_type": "none", "loop": False,
                                                                    "checkpoints": {"every_s": 1}}})  # 4 chips: 1.8 s spend the week
    h.start()
    waiting = h.wait("alice/train", lambda j: j.state == "queued" and j.tpu is None, timeout=90)
    assert waiting.queued_reason == "over quota: user alice has used its 0.002 v4 chip-hours of the week"
    store = open_store(h.store_url)
    try:
        events = [e for e in store.read_stream("alice/train") if e.type not in ("action_intent", "action_outcome")]
    finally:
        store.close()
    types = [e.type for e in events]
    spent, stop = types.index("quota_spent"), types.index("preempted")
    assert types.index("started") < spent < stop and "checkpointed" in types[spent:stop]
    assert events[spent].data["then"] == "checkpoint-and-stop" and events[spent].data["used"] >= 0.002
    assert events[stop].data["cause"] == "quota"
    assert types[stop:] == ["preempted", "released", "resumed", "queued"]  # it gave its TPU back and waits
    never_over_quota(h)
    h.verify()
