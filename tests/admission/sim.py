"""A simulated lab for the sharing tests: jobs folded from events as the ledger would, the
planner's passes with their actions applied at once (as the executor would record them), a
cloud of READY TPUs, and the usage fold fed every event, on a clock the test moves. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ledger.events import format_time
from ledger.events.data import EventData
from ledger.fold import RUNNING, JobState, evolve, initial
from ledger.spec.policy import Policy
from ledger.usage import UsageFold, to_us
from ledger.usage.share import ShareMeter
from reconciler import admission
from reconciler.admission import WAITING_STATES, Decision, admit, usage_at
from reconciler.model import Action, NodeObs, Observed, PlanConfig
from reconciler.plan import plan

ZONE = "us-central2-b"
START = 1_800_000_000.0
Template = tuple[str, str, int, str, int]  # owner, accelerator, priority, pricing, max_restarts


@dataclass
class World:
    """The jobs as the ledger folds them, the TPUs that exist, and the usage fold."""

    policy: Policy
    templates: list[Template]
    jobs: dict[str, JobState] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)
    clock: float = START
    seq: int = 0
    meter: ShareMeter = field(init=False)
    usage: UsageFold = field(init=False)
    seen: set[str] = field(default_factory=set)  # the kinds of events written: what an example exercised

    def __post_init__(self) -> None:
        self.meter = ShareMeter(self.policy.fair_share.half_life_hours)
        self.usage = UsageFold(on_interval=self.meter.add)

    def append(self, job_id: str, type_: str, data: dict[str, Any] | EventData) -> None:
        payload = data.to_builtins() if isinstance(data, EventData) else data
        self.seen.add(f"{type_} ({payload['cause']})" if payload.get("cause") else
                      f"{type_} ({payload['wait']}: {' '.join(payload['reason'].split()[:2])})" if payload.get("wait")
                      else type_)
        self.seq += 1
        self.clock += 0.001  # every event a moment after the one before
        when = format_time(datetime.fromtimestamp(self.clock, UTC))
        job = self.jobs.get(job_id) or initial(job_id)
        self.jobs[job_id] = evolve(job, type_, payload, time=when, seq=self.seq, version=job.version + 1)
        self.usage.apply(job_id, type_, when, payload, self.seq)

    def job_id(self, i: int) -> str:
        return f"{self.templates[i][0]}/j{i}"

    def now_usage(self) -> admission.Usage:
        us = to_us(datetime.fromtimestamp(self.clock, UTC))
        return usage_at(self.meter, self.usage.open_intervals(us), us)

    def observed(self) -> Observed:
        return Observed(now=self.clock, zones=frozenset({ZONE}),
                        nodes={n: NodeObs(n, ZONE, "READY", {}, create_time=START) for n in self.nodes})

    # -- the steps -----------------------------------------------------------------------
    def step(self, kind: str, arg: Any = None) -> None:
        if kind == "tick":
            self.clock += float(arg) * 3600
            return
        if kind == "pass":
            return
        i = arg % len(self.templates)
        job_id = self.job_id(i)
        job = self.jobs.get(job_id)
        if kind == "submit" and (job is None or job.terminal):
            owner, accelerator, priority, pricing, restarts = self.templates[i]
            spec = {"job": {"name": f"j{i}"}, "tpu": {"accelerator": accelerator, "zone": ZONE, "pricing": pricing},
                    "command": {"cmd": "train"}, "priority": priority,
                    "recovery": {"on_preempted": "resume", "max_restarts": restarts}}
            self.append(job_id, "submitted", {"spec": spec, "spec_hash": "ab12cd34", "commit": f"c{self.seq}"})
        elif job is None:
            pass
        elif kind == "finish" and job.state == RUNNING:
            self.append(job_id, "finished", {})
        elif kind == "cancel" and not job.terminal and not job.cancel_requested:
            self.append(job_id, "cancel_requested", {"reason": "model"})
        elif kind == "admit" and job.state in WAITING_STATES and not job.admitted_by:
            self.append(job_id, "admitted", {"reason": "model", "by": "op"})
        elif kind == "preempt" and job.state == RUNNING and job.tpu:
            self.nodes.discard(job.tpu["name"])
            self.append(job_id, "preempted", {"reason": "spot", "tpu_state": "PREEMPTED", "attempt": job.attempt})
        elif kind == "checkpoint" and job.state == RUNNING:
            self.append(job_id, "checkpointed", {"attempt": job.attempt, "step": (job.checkpoint or {}).get("step", 0) + 1})

    def apply(self, action: Action) -> None:
        """What the executor would record for the action, at once."""
        job, p = self.jobs[action.job_id], action.params
        if action.kind == "record":
            for event in p["events"]:
                self.append(job.id, event.event_type, event)
        elif action.kind == "provision":
            tpu = {k: v for k, v in p["tpu"].items() if k in ("name", "zone", "kind", "accelerator", "shared", "attempt")}
            self.nodes.add(tpu["name"])
            for type_, data in (("provisioning", {"attempt": p["attempt"], "tpu": tpu}),
                                ("provisioned", {"tpu": tpu, "hosts": [{"worker": 0}]}),
                                ("setup_started", {}), ("setup_done", {}), ("started", {"attempt": p["attempt"]})):
                self.append(job.id, type_, data)
        elif action.kind in ("recover", "restart"):
            if p.get("reapply") and p.get("tpu"):
                self._release(job, p["tpu"])
            again = "rerun" if p["rule"] == "rerun" else "resumed"
            self.append(job.id, again, {"attempt": p["attempt"], "restarts": p.get("restarts", job.restarts),
                                        "rule": p["rule"], "reapply": bool(p.get("reapply"))})
        elif action.kind == "setup":
            self.append(job.id, "setup_started", {})
            self.append(job.id, "setup_done", {})
        elif action.kind == "start":
            self.append(job.id, "started", {"attempt": p["attempt"]})
        elif action.kind == "release" and p.get("tpu"):
            self._release(job, p["tpu"])
        elif action.kind == "cancel":
            if p.get("tpu"):
                self._release(job, p["tpu"])
            self.append(job.id, "cancelled", {"reason": "model"})
        else:
            raise AssertionError(f"the model has no executor for {action}")

    def _release(self, job: JobState, tpu: dict[str, Any]) -> None:
        self.nodes.discard(tpu["name"])
        self.append(job.id, "released", {"tpu": {"name": tpu["name"]}, "reason": "model"})

    def one_pass(self) -> tuple[dict[str, JobState], Decision, admission.Usage]:
        """The planner's pass, its actions applied: the jobs it planned over, the decision
        its admission made, and the usage it planned with."""
        usage = self.now_usage()
        before = dict(self.jobs)
        decision = admit(before, self.policy, usage)
        for action in plan(before, self.observed(), config=PlanConfig(policy=self.policy), usage=usage):
            self.apply(action)
        return before, decision, usage
