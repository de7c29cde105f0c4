"""A small lab of jobs as folded states, for the pure admission tests (no server)."""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.events import format_time
from ledger.fold import JobState, evolve, initial
from ledger.spec.policy import Policy, parse_policy

ZONE = "us-central2-b"
NOW = 1_800_000_000.0

POLICY = """\
teams:
  "@lab/nlp": [alice, bob]
quotas:
  lab: {chips: {v4: 128}}
  teams:
    "@lab/nlp": {chips: {v4: 96}}
  users:
    alice: {chips: {v4: 64}}
  default_user: {chips: {v4: 128}}
priorities:
  classes: {low: 100, normal: 500, urgent: 900}
  preempt: {urgent: [low]}
fair_share:
  half_life_hours: 24
"""


def policy(text: str = POLICY) -> Policy:
    parsed, errors = parse_policy(text)
    assert errors == (), [m.format() for m in errors]
    return parsed


def at(t: float) -> str:
    return format_time(datetime.fromtimestamp(t, UTC))


def spec(accelerator: str = "v4-64", *, priority: int = 500, pricing: str = "ondemand") -> dict:
    return {"job": {"name": "x"}, "tpu": {"accelerator": accelerator, "zone": ZONE, "pricing": pricing},
            "command": {"cmd": "train"}, "recovery": {"on_preempted": "resume", "max_restarts": 3}, "priority": priority}


class Lab:
    """Jobs folded from events; seq grows across jobs so submission order is real."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobState] = {}
        self.seq = 0

    def _fold(self, job_id: str, events: list[tuple[str, dict]], when: float = NOW - 60) -> JobState:
        j = self.jobs.get(job_id) or initial(job_id)
        for type_, data in events:
            self.seq += 1
            j = evolve(j, type_, data, time=at(when), seq=self.seq, version=j.version + 1)
        self.jobs[job_id] = j
        return j

    def waiting(self, job_id: str, accelerator: str = "v4-64", **kw) -> JobState:
        return self._fold(job_id, [("submitted", {"spec": spec(accelerator, **kw), "spec_hash": "ab12cd34", "commit": "c1"})])

    def running(self, job_id: str, accelerator: str = "v4-64", *, started: float = NOW - 60, **kw) -> JobState:
        self.waiting(job_id, accelerator, **kw)
        tpu = {"name": "tl-" + job_id.replace("/", "-"), "zone": ZONE, "kind": "node", "accelerator": accelerator}
        return self._fold(job_id, [
            ("provisioning", {"attempt": 1, "tpu": tpu}), ("provisioned", {"tpu": tpu, "hosts": [{"worker": 0}]}),
            ("setup_started", {}), ("setup_done", {}), ("started", {"attempt": 1, "spec_hash": "ab12cd34"}),
        ], when=started)

    def event(self, job_id: str, type_: str, data: dict, when: float = NOW - 30) -> JobState:
        return self._fold(job_id, [(type_, data)], when)
