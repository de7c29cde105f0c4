"""Host checks before every start, through the reconciler on the emulator's real SSH hosts:
a shared TPU handed from one job to the next with a leftover process, a stale lock, a live
job's process, and a TPU that said it was busy."""

from __future__ import annotations

import os

from google.cloud import tpu_v2

from ledger.app.readmodels import tpu_health
from ledger.fold import FAILED_FINAL, FINISHED, RUNNING
from ledger.store import open_store
from reconciler.keys import ensure_key
from tests.doctor.conftest import Harness
from tests.emulator.conftest import pid_alive
from tests.reconciler.conftest import job_spec

PARENT = "projects/tpu-ledger-local/locations/us-central2-b"


def shared_tpu(harness: Harness, name: str) -> dict:
    """A lab TPU that already lets the reconciler's key in, as an admin would have set it up."""
    key = ensure_key(harness.settings().ssh_key)
    client = harness.emu.client()
    client.create_node(parent=PARENT, node_id=name, node=tpu_v2.Node(
        accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", metadata={"ssh-keys": f"ledger:{key}"})).result(timeout=30)
    client.transport.close()
    return {"shared": True, "name": name}


def events(harness: Harness, job_id: str):
    store = open_store(harness.store_url)
    try:
        return store.read_stream(job_id)
    finally:
        store.close()


def cleaned(harness: Harness, job_id: str) -> list[dict]:
    """What the host checks repaired before the job's starts."""
    return [d for e in events(harness, job_id) if e.type == "action_outcome" and e.data.get("action") == "clean"
            for d in e.data["result"]["done"]]


def test_the_next_job_on_a_shared_tpu_starts_cleanly_and_the_kill_is_recorded(harness: Harness):
    shared = shared_tpu(harness, "lab-v4-8-1")
    # The first job leaves a daemon that holds the TPU and outlives it, as a crashed run does.
    leave = "setsid bash -c 'exec 3<~/.vm/dev/accel0; exec sleep 600' </dev/null >/dev/null 2>&1 & echo left one behind"
    harness.submit("ivan/first", job_spec(leave, tpu=shared))
    harness.start()
    harness.wait("ivan/first", lambda j: j.state == FINISHED and j.tpu is None)
    harness.submit("jill/second", job_spec("echo second on the shared TPU", tpu=shared))
    harness.wait("jill/second", lambda j: j.state == FINISHED, timeout=60)

    [kill] = cleaned(harness, "jill/second")
    assert kill["worker"] == 0 and kill["check"] == "devices"
    assert kill["what"].startswith("killed pid ") and "(ivan/first, ended " in kill["what"] and kill["what"].endswith("holding /dev/accel0")
    pid = int(kill["what"].split()[2])
    assert not pid_alive(pid)
    started = [e.data for e in events(harness, "jill/second") if e.type == "started"]
    assert [s.get("health") for s in started] == ["fixed"]
    store = open_store(harness.store_url)
    assert tpu_health(store.read_all())["lab-v4-8-1"]["health"] == "fixed"
    store.close()
    harness.verify()


def test_a_stale_lock_is_found_and_removed_before_the_start(harness: Harness):
    shared = shared_tpu(harness, "lab-v4-8-2")
    lock = harness.emu.stale_lock("lab-v4-8-2", 0)
    harness.submit("kim/locked", job_spec("echo fine", tpu=shared))
    harness.start()
    harness.wait("kim/locked", lambda j: j.state == FINISHED, timeout=60)
    assert [d["what"] for d in cleaned(harness, "kim/locked")] == ["removed stale lockfile /tmp/libtpu_lockfile"]
    assert not os.path.exists(lock)


def test_a_live_jobs_process_is_never_killed_and_the_start_fails_host_unhealthy(harness: Harness):
    running = shared_tpu(harness, "lab-a")
    other = shared_tpu(harness, "lab-b")
    harness.submit("ivan/live", job_spec("sleep 300", tpu=running))
    harness.start()
    harness.wait("ivan/live", lambda j: j.state == RUNNING)
    # a child of ivan/live's command, on another TPU's host: whose it is comes from its env
    pid = harness.emu.stale_process("lab-b", 0, env={"LEDGER_JOB_ID": "ivan/live", "LEDGER_ATTEMPT": "1", "LEDGER_WORKER_ID": "0"})
    harness.submit("jill/blocked", job_spec("echo never", tpu=other, recovery={"max_restarts": 3, "on_host_unhealthy": "pass"}))
    job = harness.wait("jill/blocked", lambda j: j.state == FAILED_FINAL, timeout=60)
    failed = [e.data for e in events(harness, "jill/blocked") if e.type == "failed"]
    assert failed[0]["kind"] == "host_unhealthy" and f"pid {pid} (ivan/live, running: a live job)" in failed[0]["message"]
    assert job.last_error and pid_alive(pid) and harness.job("ivan/live").state == RUNNING
    assert cleaned(harness, "jill/blocked") == []  # nothing it may repair was found


def test_a_tpu_that_said_it_was_busy_is_cleaned_then_resumed(harness: Harness):
    busy = 'if [ "$LEDGER_ATTEMPT" = 1 ]; then echo "RuntimeError: TPU is already in use by process with pid 4242"; sleep 30; fi; echo ok'
    harness.submit("lena/busy", job_spec(busy, recovery={"max_restarts": 2}))
    harness.start()
    harness.wait("lena/busy", lambda j: j.state == FINISHED, timeout=90)
    recovered = [e.data for e in events(harness, "lena/busy") if e.type in ("failed", "resumed")]
    assert [(d.get("kind"), d.get("rule")) for d in recovered] == [("tpu_busy", None), ("tpu_busy", "resume")]
