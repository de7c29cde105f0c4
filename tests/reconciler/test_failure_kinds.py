"""Every way a job fails for good leaves a ledger that `ledger verify` calls sound.

The reconciler once recorded a final failure with `kind: "pass"` or `"exhausted"`, values its
own event schema refused, so a lab's ledger became unsound the first time a job failed. Here
the pure planner decides each story against a real SQLite ledger; the events the executor
would add (the outcome of a recovery, of setup, of provisioning) are written as it writes
them, typed. The final event must say what ended the job (`kind`) and why it is final (`rule`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.events import NewEvent, actor
from ledger.events import data as ev
from ledger.fold import FAILED_FINAL, JobState, replay
from ledger.spec.model import spec_hash
from ledger.store import open_store
from ledger.verify import verify_store
from reconciler.model import Action, HostObs, NodeObs, Observed
from reconciler.plan import plan, tpu_request

ZONE = "us-central2-b"
NOW = 1_800_000_000.0
JOB = "alice/bert"


def spec(recovery: dict, pricing: str = "spot") -> dict:
    return {"job": {"name": "bert"}, "tpu": {"accelerator": "v4-8", "zone": ZONE, "pricing": pricing,
                                              "allocation_mode": "tpu-vm"},
            "command": {"cmd": "python train.py", "workers": "all"}, "recovery": recovery}


class Story:
    """One job's ledger: what happened is appended, the planner decides the rest."""

    def __init__(self, path: Path, job_spec: dict) -> None:
        self.store = open_store(f"sqlite:///{path / 'ledger.db'}")
        self.record(ev.Submitted(spec=job_spec, spec_hash=spec_hash(job_spec), commit="c0ffee", path=f"jobs/{JOB}.yaml"))

    def record(self, *events: ev.EventData) -> None:
        self.store.append(JOB, [NewEvent(d.event_type, d, actor("reconciler", "test")) for d in events])

    def job(self) -> JobState:
        return replay(self.store.read_stream(JOB)).jobs[JOB]

    def decide(self, node_state: str = "READY", hosts: dict[int, HostObs] | None = None) -> Action:
        """Plan once; a `record` action is appended as the executor appends it."""
        job = self.job()
        name = (job.tpu or tpu_request(job))["name"]
        node = NodeObs(name, ZONE, node_state, {}, ({"worker": 0, "address": "127.0.0.1", "port": 22},))
        (action,) = plan({JOB: job}, Observed(NOW, frozenset({ZONE}), {name: node}, {}, {JOB: hosts or {}}))
        if action.kind == "record":
            self.record(*action.params["events"])
        return action

    def run_attempt(self, attempt: int) -> None:
        """Provisioned, set up and started, as the executor records it."""
        tpu = ev.tpu(tpu_request(self.job()))
        self.record(ev.Provisioning(attempt=attempt, tpu=tpu, how="created"),
                    ev.Provisioned(tpu=tpu, hosts=[ev.Host(worker=0, address="127.0.0.1", port=22)]),
                    ev.SetupStarted(attempt=attempt), ev.SetupDone(attempt=attempt),
                    ev.Started(attempt=attempt, workers=[0], pids={"0": 4242}, resume=attempt > 1))

    def recover(self, action: Action) -> None:
        """What the executor records for a `recover` action."""
        assert action.kind == "recover", action
        p = action.params
        if p["reapply"]:
            self.record(ev.Released(tpu=ev.tpu(p["tpu"]), reason="reapply", deleted=True))
        again = ev.Rerun if p["rule"] == "rerun" else ev.Resumed
        self.record(again(attempt=p["attempt"], restarts=p["restarts"], rule=p["rule"], reapply=p["reapply"], kind=p["kind"]))

    def final(self) -> dict:
        """The final `failed` event's data, after checking the whole ledger is sound."""
        report = verify_store(self.store)
        assert report.ok, report.problem
        job = self.job()
        assert job.state == FAILED_FINAL
        last = [e for e in self.store.read_stream(JOB) if e.type == "failed"][-1]
        assert last.data["final"] is True
        return last.data


@pytest.fixture
def story_for(tmp_path: Path):
    stories: list[Story] = []

    def make(job_spec: dict) -> Story:
        stories.append(Story(tmp_path, job_spec))
        return stories[-1]

    yield make
    for s in stories:
        s.store.close()


def test_a_failure_under_on_failure_pass(story_for):
    s = story_for(spec({"on_failure": "pass", "max_restarts": 3}))
    s.run_attempt(1)
    s.decide(hosts={0: HostObs("exited", 3)})
    assert s.decide().kind == "record"  # the verdict
    data = s.final()
    assert data["kind"] == "exit" and data["rule"] == "pass"
    assert data["history"] == [{"kind": "exit", "attempt": 1}]


def test_a_failed_setup(story_for):
    s = story_for(spec({"max_restarts": 3}))  # on_failure defaults to pass
    tpu = ev.tpu(tpu_request(s.job()))
    s.record(ev.Provisioning(attempt=1, tpu=tpu), ev.Provisioned(tpu=tpu, hosts=[ev.Host(worker=0)]),
             ev.SetupStarted(attempt=1), ev.SetupFailed(attempt=1, worker=0, module="venv", reason="pip failed", final=False))
    assert s.decide().kind == "record"
    data = s.final()
    assert data["kind"] == "setup" and data["rule"] == "pass"


def test_a_spent_budget_under_rerun(story_for):
    s = story_for(spec({"on_failure": "rerun", "max_restarts": 1}))
    s.run_attempt(1)
    s.decide(hosts={0: HostObs("exited", 3)})
    s.recover(s.decide())
    s.run_attempt(2)
    s.decide(hosts={0: HostObs("exited", 3)})
    assert s.decide().kind == "record"
    data = s.final()
    assert data["kind"] == "exit" and data["rule"] == "exhausted" and len(data["history"]) == 2


def test_a_spent_budget_under_reapply(story_for):
    s = story_for(spec({"on_preempted": "reapply", "max_restarts": 1}))
    s.run_attempt(1)
    assert s.decide("PREEMPTED").kind == "record"  # preempted
    s.recover(s.decide("PREEMPTED"))
    s.run_attempt(2)
    s.decide("PREEMPTED")
    assert s.decide("PREEMPTED").kind == "record"
    data = s.final()
    assert data["kind"] == "preempted" and data["rule"] == "exhausted"


def test_a_rejected_update_between_failure_and_verdict_does_not_become_the_kind(story_for):
    """A rejected spec update replaces `last_error` (for people to read); the verdict is
    still about the failed attempt."""
    s = story_for(spec({"on_failure": "pass", "max_restarts": 3}))
    s.run_attempt(1)
    s.decide(hosts={0: HostObs("exited", 3)})
    s.record(ev.Rejected(reason="invalid spec", path=f"jobs/{JOB}.yaml"))
    assert s.decide().kind == "record"
    assert s.final()["kind"] == "exit"
