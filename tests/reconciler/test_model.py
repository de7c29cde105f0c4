"""Property-based model test of the reconciler: the real planner and executor against a
simulated cloud (tests/reconciler/sim.py), under sequences of faults Hypothesis draws.

Faults: preemption (API first, or probe first: the host dies before the API says so), host
loss, capacity drop, a failed or slow creation, a failing operation, GRPC errors in the output,
a failing command (budgets run out under repeated faults), a cancel or a spec change at any
point (also in the middle of an action), and a process crash between an intent and its
outcome (before or after the effect). Then the faults stop and the world settles.

Failures of the TPU API too: every status it returns (sim.API_FAULTS), in the create's call or
in its operation, and an outage of the whole API; `ledger resume` of a blocked job.

Checked: never two billed TPUs for one job, and the ledger verifies, after every pass (every
event the reconciler writes is one the transition table allows); while the API is down the
reconciler appends nothing; at the end every job is terminal, explainably waiting or blocked
with its reason, every TPU is released or held by a live job, and a `lost_host` failure only
where a host was really lost (a preemption is `preempted`).

`make model` runs many more, longer sequences (MODEL_EXAMPLES, MODEL_STEPS).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from unittest.mock import patch

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ledger.events import Event, NewEvent, actor, format_time
from ledger.events import data as ev
from ledger.failures import kind_of
from ledger.fold import BLOCKED, QUEUED, JobState, replay
from ledger.spec.model import spec_hash
from ledger.store import open_store
from ledger.store.sqlite import recorder
from ledger.verify import verify_store
from reconciler.executor import Executor
from reconciler.loop import recheck_suspects
from reconciler.model import NODE_READY, Action, HostObs, Observed, PlanConfig
from reconciler.plan import api_zone, plan, selected_workers, unseen_creates, zones_in_use
from reconciler.tpu import TpuCallError
from tests.reconciler.sim import API_FAULTS, ZONE, Crash, Hooks, SimCloud, labelled

EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "25"))
STEPS = int(os.environ.get("MODEL_STEPS", "20"))
HOLDER = "model"
START = 1_800_000_000.0

JOBS = st.lists(st.fixed_dictionaries({
    "pricing": st.sampled_from(["spot", "ondemand"]),
    "max_restarts": st.integers(0, 2),
    "on_failure": st.sampled_from(["pass", "rerun", "resume"]),
    "ticks": st.integers(1, 8),
    "exit": st.sampled_from([0, 0, 1]),
}), min_size=1, max_size=3)

JOB_INDEX = st.integers(0, 5)
FAULTS = st.one_of(
    st.tuples(st.just("none")),
    st.tuples(st.just("preempt"), JOB_INDEX, st.booleans()),  # True: the probe sees it first
    st.tuples(st.just("host_loss"), JOB_INDEX),
    st.tuples(st.just("capacity"), st.booleans()),
    st.tuples(st.just("fail_create")),
    st.tuples(st.just("slow_create")),
    st.tuples(st.just("fail_op")),
    st.tuples(st.just("grpc"), JOB_INDEX),
    st.tuples(st.just("cancel"), JOB_INDEX, st.booleans()),  # True: in the middle of the next action
    st.tuples(st.just("spec"), JOB_INDEX, st.booleans()),
    st.tuples(st.just("crash"), st.sampled_from(["before", "after"])),
    st.tuples(st.just("api"), st.integers(0, len(API_FAULTS) - 1), st.booleans()),  # True: in the operation
    st.tuples(st.just("outage"), st.booleans()),
    st.tuples(st.just("resume"), JOB_INDEX),
)


def job_spec(j: dict, *, ticks: int | None = None, accelerator: str = "v4-8") -> dict:
    return {
        "job": {"name": "m"},
        "tpu": {"allocation_mode": "tpu-vm", "accelerator": accelerator, "zone": ZONE, "pricing": j["pricing"]},
        "command": {"cmd": "train", "workers": "all",
                    "env": {"SIM_TICKS": str(ticks or j["ticks"]), "SIM_EXIT": str(j["exit"])}},
        "recovery": {"max_restarts": j["max_restarts"], "on_failure": j["on_failure"]},
    }


@dataclass
class World:
    cloud: SimCloud
    store: object
    config: PlanConfig = field(default_factory=lambda: PlanConfig(
        holder=HOLDER, orphan_grace_s=30.0, queued_retry_s=10.0, queued_retry_max_s=40.0))
    suspect_since: dict[str, float] = field(default_factory=dict)
    crashes: int = 0
    executor: Executor | None = None
    final: dict[str, JobState] = field(default_factory=dict)  # the jobs once settled
    store_events: list = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # node faults that hit a live node

    def __post_init__(self) -> None:
        self.new_process()

    def new_process(self) -> None:
        """A fresh reconciler under the same id: its memory (suspects) is gone."""
        self.suspect_since = {}
        self.executor = Executor(
            lambda: self.store, self.cloud, self.cloud, holder=HOLDER, ssh_user="ledger",
            ssh_public_key="ecdsa-sha2-nistp256 AAAA", hosts_of=lambda job: list(job.hosts),
            extra_args_of=lambda spec: [],
        )

    def jobs(self) -> dict[str, JobState]:
        return replay(self.store.read_all()).jobs

    def append(self, job_id: str, data: ev.EventData) -> None:
        self.store.append(job_id, [NewEvent(data.event_type, data, actor("git", "model"))])

    def observe(self, jobs: dict[str, JobState]) -> Observed:
        """As the loop observes: list the zone, probe running jobs, re-read suspects."""
        zones = zones_in_use(jobs)
        obs = Observed(now=self.cloud.now)
        if ZONE in zones:
            try:
                obs.nodes = {n.name: n for n in self.cloud.list_nodes(ZONE)}
                obs.zones = frozenset({ZONE})
            except TpuCallError as exc:
                if kind_of(exc.failure) == "permanent":
                    obs.refused[ZONE] = exc.failure
        for name in unseen_creates(jobs, obs):
            if (op := self.cloud.operation(name)) is not None:
                obs.operations[name] = op
        for j in jobs.values():
            node = obs.nodes.get((j.tpu or {}).get("name", "")) if ZONE in obs.zones else None
            if j.state == "running" and node is not None and node.state == NODE_READY:
                status = self.cloud.probe(j.id, j.attempt, list(j.hosts), workers=selected_workers(j))
                obs.hosts[j.id] = {w: HostObs(s.state, s.exit_code, tuple(sorted(set(s.kinds))), s.error)
                                   for w, s in status.items()}
        self.suspect_since = recheck_suspects(jobs, obs, self.cloud.get_node, self.suspect_since)
        return obs

    def step(self) -> None:
        """One reconcile pass; a crash kills the process: the rest of the pass is lost. The
        ledger verifies after it; while the API is down it appends nothing."""
        jobs = self.jobs()
        head = self.store.head()
        try:
            self._pass(jobs)
        finally:
            report = verify_store(self.store)
            assert report.ok, report.problem
            if self.cloud.outage:  # only what needs no API call (a cancel of a job holding no TPU, SSH steps)
                acted = [(e.stream, e.data["action"]) for e in self.store.read_all() if e.seq > head and e.type == "action_intent"
                         and api_zone(Action(e.data["action"], e.stream, e.data.get("params") or {})) is not None]
                assert not acted, f"acted against the API while it was down: {acted}"

    def _pass(self, jobs: dict[str, JobState]) -> None:
        obs = self.observe(jobs)
        assert self.executor is not None
        for action in plan(jobs, obs, config=self.config):
            try:
                self.executor.execute(action, jobs.get(action.job_id))
            except Crash:
                self.crashes += 1
                self.new_process()
                return
            except TpuCallError:
                pass  # a resolve met the API's failure: the loop logs it and backs off

    def one_tpu_per_job(self) -> None:
        for job_id in self.jobs():
            alive = self.cloud.alive_for(job_id)
            assert len(alive) <= 1, f"{job_id} holds {alive} at once"


def apply(world: World, fault: tuple, job_ids: list[str], specs: dict[str, dict]) -> None:
    cloud, kind = world.cloud, fault[0]
    job_id = job_ids[fault[1] % len(job_ids)] if len(fault) > 1 and isinstance(fault[1], int) else ""
    # Faults on nodes and commands pick among those that exist, so few of them are no-ops.
    live = sorted(cloud.live(), key=lambda n: n.name)
    target = live[fault[1] % len(live)] if live and len(fault) > 1 and isinstance(fault[1], int) else None
    running = sorted((p for p in cloud.procs.values() if p.state == "running"), key=lambda p: p.job_id)
    if kind == "preempt" and target is not None:
        cloud.preempt(target, probe_first=fault[2])
        world.applied.append("preemption, " + ("probe first" if fault[2] else "API first"))
    elif kind == "host_loss" and target is not None:
        cloud.lose_host(target)
        world.applied.append("host loss")
    elif kind == "capacity":
        cloud.capacity = fault[1]
    elif kind == "fail_create":
        cloud.fail_create = True
    elif kind == "slow_create":
        cloud.create_ticks = 4.0
    elif kind == "fail_op":
        cloud.fail_op = True
    elif kind == "grpc" and running:
        running[fault[1] % len(running)].kinds.append("grpc")
    elif kind in ("cancel", "spec"):
        def act() -> None:
            job = world.jobs().get(job_id)
            if job is None or job.terminal:
                return  # git would not ask it of an ended job
            if kind == "cancel":
                world.append(job_id, ev.CancelRequested(reason="model: cancel"))
            else:
                spec = job_spec(specs[job_id], ticks=3, accelerator="v4-16" if job.attempt % 2 else "v4-8")
                world.append(job_id, ev.SpecUpdated(spec=spec, spec_hash=spec_hash(spec), commit=f"{job_id}-{job.version}"))
        if fault[2]:
            cloud.hooks = Hooks(during=act)
        else:
            act()
    elif kind == "crash":
        cloud.hooks = Hooks(crash=fault[1])
    elif kind == "api":
        code, reason = API_FAULTS[fault[1]]
        cloud.refuse = (code, reason, fault[2])
        world.applied.append(f"api {code}{'/' + reason if reason else ''} {'in the operation' if fault[2] else 'in the call'}")
    elif kind == "outage":
        cloud.outage = fault[1]
    elif kind == "resume":
        job = world.jobs().get(job_id)
        if job is not None and job.state == BLOCKED:  # an operator fixed the cause: `ledger resume`
            world.append(job_id, ev.Resumed(attempt=job.attempt + 1, restarts=job.restarts, rule="manual", reapply=True))
            world.applied.append("resume of a blocked job")


def settle(world: World, limit: int = 200) -> None:
    """No more faults: pass and tick until every job ended and every node is gone."""
    cloud = world.cloud
    cloud.capacity, cloud.fail_create, cloud.fail_op, cloud.hooks = True, False, False, Hooks()
    cloud.refuse, cloud.outage = None, False
    for _ in range(limit):
        cloud.tick()
        world.step()
        world.one_tpu_per_job()
        jobs = world.jobs()
        if all((j.terminal or j.state == BLOCKED) and j.tpu is None and not j.pending_action for j in jobs.values()) \
                and not cloud.nodes:
            return


def check_end(world: World) -> None:
    assert world.cloud.redeletes == 0, "a delete under way was started again"
    report = verify_store(world.store)
    assert report.ok, report.problem
    jobs = world.jobs()
    waiting = {j.id: (j.state, j.queued_reason) for j in jobs.values()
               if not j.terminal and not (j.state == QUEUED and j.queued_reason)
               and not (j.state == BLOCKED and (j.last_error or {}).get("message"))}
    assert not waiting, f"jobs neither ended nor explainably waiting: {waiting}"
    live = {j.tpu["name"] for j in jobs.values() if j.tpu and not j.terminal}
    leftover = [n.name for n in world.cloud.nodes.values() if n.state != "DELETING" and n.name not in live]
    assert not leftover, f"TPUs neither released nor held by a live job: {leftover}"
    events = list(world.store.read_all())
    for i, e in enumerate(events):
        if e.type == "failed" and e.data.get("kind") == "lost_host":
            # A start that found its host dead while the API still read READY is recorded as
            # lost_host; once the API says PREEMPTED the verdict must follow the preemption:
            # the next attempt's (resumed, rerun, failed), or the recovery the reconciler
            # decided on, when a cancel ends the job before that recovery is done.
            from_start = e.data.get("message", "").startswith("could not start")
            judged_preempted = from_start and any(later.stream == e.stream and _judged_preempted(later) for later in events[i + 1:])
            assert judged_preempted or any(labelled(n, e.stream) for n in world.cloud.host_losses), f"{e.stream}: lost_host recorded at seq {e.seq} but no host was lost"


def _judged_preempted(event: Event) -> bool:
    if event.type in ("resumed", "rerun", "failed"):
        return event.data.get("kind") == "preempted"
    return event.type == "action_intent" and event.data.get("action") in ("recover", "restart") \
        and event.data.get("params", {}).get("kind") == "preempted"


def run_story(job_params: list[dict], faults: list[tuple]) -> World:
    with tempfile.TemporaryDirectory() as tmp:
        cloud = SimCloud(START)
        stamp = lambda: format_time(datetime.fromtimestamp(cloud.now, UTC))  # noqa: E731
        with patch.object(recorder, "now", stamp):
            store = open_store(f"sqlite:///{Path(tmp) / 'ledger.db'}")
            try:
                world = World(cloud, store)
                specs = {f"u/j{i}": p for i, p in enumerate(job_params)}
                for i, (job_id, p) in enumerate(specs.items()):
                    s = job_spec(p)
                    world.append(job_id, ev.Submitted(spec=s, spec_hash=spec_hash(s), commit=f"c{i}", path=f"jobs/{job_id}.yaml"))
                for fault in faults:
                    apply(world, fault, list(specs), specs)
                    cloud.tick()
                    world.step()
                    world.one_tpu_per_job()
                settle(world)
                check_end(world)
                world.final = world.jobs()
                world.store_events = list(store.read_all())
                return world
            finally:
                store.close()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job_params=JOBS, faults=st.lists(FAULTS, min_size=1, max_size=STEPS))
def test_the_reconciler_survives_any_sequence_of_faults(job_params: list[dict], faults: list[tuple]) -> None:
    world = run_story(job_params, faults)
    event(f"crashes: {min(world.crashes, 3)}")
    for what in set(world.applied):
        event(f"applied: {what}")
    for j in world.final.values():
        event(f"ended {j.state} after {min(j.restarts, 2)} restarts")
    seen = {e.type for e in world.store_events}
    for t in ("preempted", "failed", "cancelled", "spec_updated", "queued", "action_outcome"):
        if t in seen:
            event(f"saw {t}")


def test_a_quiet_story_ends_every_job():
    """Without faults every job runs once and ends, its TPU deleted: the model itself works."""
    world = run_story([{"pricing": "spot", "max_restarts": 1, "on_failure": "pass", "ticks": 2, "exit": 0}] * 2, [("none",)])
    assert [j.state for j in world.final.values()] == ["finished", "finished"] and world.crashes == 0


def _verdicts(world: World) -> list[tuple[str, str]]:
    return [(e.type, e.data.get("kind", "")) for e in world.store_events
            if e.type in ("preempted", "failed", "resumed", "rerun")]


SPOT_PASS = {"pricing": "spot", "max_restarts": 1, "on_failure": "pass", "ticks": 4, "exit": 0}


def test_found_a_preemption_that_kills_the_host_just_before_the_start_is_judged_a_preemption():
    """What the model found: the host died with its TPU while the API still read READY, the
    start failed, and under `on_failure: pass` the job ended `failed_final` for a preemption."""
    world = run_story([SPOT_PASS], [("none",)] * 3 + [("preempt", 0, True)] + [("none",)] * 3)
    assert _verdicts(world) == [("failed", "lost_host"), ("resumed", "preempted")]
    assert [j.state for j in world.final.values()] == ["finished"]


def test_found_a_cancel_that_ends_the_job_while_its_preemption_is_being_recovered():
    """What the model found: the start met the preempted host (lost_host, the API still
    READY); the recovery the reconciler then decided on, as a preemption, failed to delete the
    TPU; a cancel ended the job before the next try. No attempt follows, so no verdict of one
    says preempted: the recovery's intent does, and the job ends cancelled with its TPU gone."""
    world = run_story(
        [{**SPOT_PASS, "max_restarts": 0, "ticks": 1}, {**SPOT_PASS, "ticks": 1}],
        [("none",), ("none",), ("fail_op",), ("preempt", 1, True), ("none",), ("outage", True), ("cancel", 3, False)])
    mine = [e for e in world.store_events if e.stream == "u/j1"]
    assert [(e.type, e.data.get("kind")) for e in mine if e.type in ("failed", "resumed", "cancelled")] == \
        [("failed", "lost_host"), ("cancelled", None)]
    assert any(_judged_preempted(e) for e in mine)
    assert world.final["u/j1"].state == "cancelled" and world.final["u/j1"].tpu is None


def test_a_preemption_the_probe_sees_first_is_recorded_as_preempted():
    world = run_story([SPOT_PASS], [("none",)] * 5 + [("preempt", 0, True)] + [("none",)] * 3)
    assert _verdicts(world) == [("preempted", ""), ("resumed", "preempted")]
