"""A preemption is recorded as `preempted` whichever side sees it first.

The TPU API and the SSH probe race: on a preempted spot TPU the host may vanish before the API
reads PREEMPTED (probe first), or the API may say so before the probe runs (API first). Both
orders must end in a `preempted` event, never `failed` with `kind: lost_host`; a worker lost on a
node the API still calls READY is a lost host only once the API had time to say otherwise.
"""

from __future__ import annotations

from emulator.control import ControlClient
from ledger.defaults import LOST_HOST_CONFIRM_S
from ledger.fold import FAILED_FINAL, RUNNING
from ledger.store import open_store
from reconciler.loop import recheck_suspects
from reconciler.model import HostObs, NodeObs, Observed
from reconciler.plan import plan
from tests.reconciler.conftest import Harness, job_spec
from tests.reconciler.test_plan import NOW, ZONE, only, ready, recorded, running_job

GONE = {0: HostObs("gone", error="ssh: connection refused"), 1: HostObs("running"), 2: HostObs("running"), 3: HostObs("running")}


def node(name: str, state: str = "READY", health: str = "HEALTHY") -> NodeObs:
    n = ready(name, state)
    return NodeObs(n.name, n.zone, n.state, n.labels, n.hosts, health)


def obs_with(*nodes: NodeObs, hosts=None, suspect_since=None) -> Observed:
    return Observed(NOW, frozenset({ZONE}), {n.name: n for n in nodes}, {}, hosts or {}, suspect_since or {})


def test_api_first_the_node_reads_preempted_and_the_probe_saw_nothing():
    j, name = running_job()
    (event_type, data), = recorded(only(plan({j.id: j}, obs_with(node(name, "PREEMPTED", "")))))
    assert event_type == "preempted" and data["tpu_state"] == "PREEMPTED"


def test_api_first_and_the_probe_also_saw_the_dead_host():
    j, name = running_job()
    o = obs_with(node(name, "PREEMPTED", ""), hosts={j.id: GONE}, suspect_since={j.id: NOW})
    (event_type, _), = recorded(only(plan({j.id: j}, o)))
    assert event_type == "preempted"


def test_probe_first_the_node_still_reads_ready_so_nothing_is_recorded_yet():
    j, name = running_job()
    o = obs_with(node(name), hosts={j.id: GONE}, suspect_since={j.id: NOW})
    assert plan({j.id: j}, o) == []


def test_probe_first_then_the_api_reads_preempted():
    """The loop re-reads the node after a probe that saw a dead worker: the planner sees the
    fresh state and records the preemption."""
    j, name = running_job()
    o = obs_with(node(name), hosts={j.id: GONE})
    since = recheck_suspects({j.id: j}, o, lambda zone, n: node(n, "PREEMPTED", ""), {})
    assert since == {j.id: NOW} and o.nodes[name].state == "PREEMPTED"
    (event_type, data), = recorded(only(plan({j.id: j}, o)))
    assert event_type == "preempted" and data["tpu_state"] == "PREEMPTED"


def test_probe_first_and_the_node_is_already_gone_from_the_api():
    j, name = running_job()
    o = obs_with(node(name), hosts={j.id: GONE})
    recheck_suspects({j.id: j}, o, lambda zone, n: None, {})
    (event_type, data), = recorded(only(plan({j.id: j}, o)))
    assert event_type == "preempted" and data["tpu_state"] == "DELETED"


def test_a_signal_exit_on_a_healthy_node_also_waits_for_the_api():
    j, name = running_job()
    killed = {0: HostObs("exited", 143), 1: HostObs("running"), 2: HostObs("running"), 3: HostObs("running")}
    assert plan({j.id: j}, obs_with(node(name), hosts={j.id: killed}, suspect_since={j.id: NOW})) == []


def test_a_host_lost_on_a_node_that_stays_ready_is_a_lost_host_after_the_confirmation_window():
    j, name = running_job()
    o = obs_with(node(name), hosts={j.id: GONE}, suspect_since={j.id: NOW - LOST_HOST_CONFIRM_S - 1})
    (event_type, data), = recorded(only(plan({j.id: j}, o)))
    assert event_type == "failed" and data["kind"] == "lost_host" and data["worker"] == 0


def test_a_host_lost_with_the_api_reporting_a_timeout_is_recorded_at_once():
    """`kill-host` on the emulator (and a dead VM on Google) leaves the node READY with
    health TIMEOUT: the API has already explained the loss."""
    j, name = running_job()
    o = obs_with(node(name, health="TIMEOUT"), hosts={j.id: GONE}, suspect_since={j.id: NOW})
    (event_type, data), = recorded(only(plan({j.id: j}, o)))
    assert event_type == "failed" and data["kind"] == "lost_host"


def test_the_api_unreachable_after_the_probe_concludes_nothing():
    j, name = running_job()
    o = obs_with(node(name), hosts={j.id: GONE})

    def refuse(zone: str, n: str) -> NodeObs | None:
        raise ConnectionError("API down")

    recheck_suspects({j.id: j}, o, refuse, {})
    assert j.id not in o.hosts and plan({j.id: j}, o) == []


def test_a_suspect_keeps_its_first_sighting_and_is_forgotten_once_healthy():
    j, name = running_job()
    o = obs_with(node(name), hosts={j.id: GONE})
    assert recheck_suspects({j.id: j}, o, lambda zone, n: node(n), {j.id: NOW - 3}) == {j.id: NOW - 3}
    o = obs_with(node(name), hosts={j.id: {0: HostObs("running")}})
    assert recheck_suspects({j.id: j}, o, lambda zone, n: node(n), {j.id: NOW - 3}) == {}


# -- against the emulator: the real probe, the real API, whichever sees it first ------------

def _events(harness: Harness, job_id: str) -> list:
    store = open_store(harness.store_url)
    try:
        return [e for e in store.read_stream(job_id) if e.type in ("preempted", "failed")]
    finally:
        store.close()


def test_a_node_preempted_through_the_fault_control_is_recorded_as_preempted(harness: Harness):
    harness.submit("erin/spot", job_spec("sleep 60", recovery={"on_preempted": "pass", "max_restarts": 0}))
    harness.start()
    job = harness.wait("erin/spot", lambda j: j.state == RUNNING)
    ControlClient(harness.emu.control_url).preempt(job.tpu["name"])
    harness.wait("erin/spot", lambda j: j.state == FAILED_FINAL and j.tpu is None, timeout=60)
    seen = [(e.type, e.data.get("kind")) for e in _events(harness, "erin/spot")]
    assert seen == [("preempted", None), ("failed", "preempted")], seen
    harness.verify()


def test_a_killed_host_on_a_node_that_stays_ready_is_a_lost_host(harness: Harness):
    harness.submit("erin/host", job_spec("sleep 60", recovery={"on_failure": "pass", "max_restarts": 0}))
    harness.start()
    job = harness.wait("erin/host", lambda j: j.state == RUNNING)
    ControlClient(harness.emu.control_url).kill_host(job.tpu["name"], 0)
    harness.wait("erin/host", lambda j: j.state == FAILED_FINAL and j.tpu is None, timeout=60)
    seen = [(e.type, e.data.get("kind")) for e in _events(harness, "erin/host")]
    assert seen[0] == ("failed", "lost_host") and ("preempted", None) not in seen, seen
