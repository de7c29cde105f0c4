"""The reconciler against the emulator: real google-cloud-tpu client, real SSH, real ledger."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import subprocess
import sys

from ledger import capacity_snapshot
from ledger.app.wiring import build
from ledger.capacity import CapacityMemory
from ledger.events import NewEvent
from ledger.fold import CANCELLED, FAILED_FINAL, FINISHED, RUNNING
from ledger.replay import SNAPSHOT_EVERY, SNAPSHOT_NAME, load_state, save_snapshot, stored_parts
from ledger.snapshots.jobs import code_version, encode_state
from ledger.snapshots.lazy import decode_state
from ledger.store import open_store
from ledger.usage import UsageFold
from ledger.usage.share import ShareMeter
from ledger.usage.snapshot import load_usage
from tests.admission.lab import policy as lab_policy
from tests.reconciler.conftest import Harness, job_spec

CORE = ["provisioning", "provisioned", "setup_started", "setup_done", "started"]


def test_single_host_job_runs_to_finished_and_its_tpu_is_deleted(harness: Harness):
    harness.submit("alice/hello", job_spec("echo hello from $LEDGER_JOB_ID attempt $LEDGER_ATTEMPT"))
    rec = harness.start()
    job = harness.wait("alice/hello", lambda j: j.state == FINISHED and j.tpu is None)
    assert harness.types("alice/hello") == ["submitted", *CORE, "finished", "released"]
    assert "hello from alice/hello attempt 1" in harness.output("alice/hello", 1)
    assert job.attempt == 1
    harness.wait("alice/hello", lambda j: not harness.nodes())
    # settled: the reconciler's passes no longer walk it, and it still knows it, from its shelf
    harness.wait("alice/hello", lambda j: "alice/hello" not in rec.live.jobs and "alice/hello" in rec.live.shelf)
    assert rec.live.find("alice/hello") == harness.job("alice/hello")


def test_a_reconciler_starting_from_a_snapshot_shelves_the_ended_jobs_as_it_reads_them(harness: Harness, monkeypatch):
    harness.submit("alice/hello", job_spec("echo hello"))
    harness.submit("bob/runs", job_spec("sleep 600"))
    harness.start()
    harness.wait("alice/hello", lambda j: j.state == FINISHED and j.tpu is None)  # settled: released
    harness.wait("bob/runs", lambda j: j.state == RUNNING)
    harness.stop.set()  # the ledger stands still from here
    for thread in harness.threads:
        thread.join(timeout=30)
    store = open_store(harness.store_url)
    try:
        save_snapshot(store, load_state(store))
        # The start reads the snapshot job by job (load_state_apart), not whole.
        monkeypatch.setattr("ledger.shelf.load_state", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read whole")))
        fresh = build(harness.settings("fresh-reconciler"))
        try:
            fresh.catch_up()
            assert "alice/hello" in fresh.live.shelf and "alice/hello" not in fresh.state.jobs
            assert "bob/runs" in fresh.live.jobs and fresh.state.jobs.keys() == fresh.live.jobs.keys()
            every = load_state(store, use_snapshot=False).jobs
            assert fresh.live.find("alice/hello") == every["alice/hello"]
            state, shelved = fresh.snapshot_source()  # what its snapshot saver writes: every job
            encoded = encode_state(state, shelved.pieces())
            assert decode_state(encoded.manifest, encoded.parts.get).jobs == every
        finally:
            fresh.close()
    finally:
        store.close()


def test_pod_preempted_midway_is_reapplied_and_resumes_with_the_next_attempt(harness: Harness):
    ckpt = harness.tmp / "bucket"
    ckpt.mkdir()
    cmd = (
        'step=$(cat "$CKPT/step" 2>/dev/null || echo 0); echo "attempt $LEDGER_ATTEMPT from step $step"; '
        'while [ "$step" -lt 12 ]; do step=$((step+1)); sleep 0.25; '
        'if [ "$TPU_WORKER_ID" = 0 ]; then echo $step > "$CKPT/step.tmp" && mv "$CKPT/step.tmp" "$CKPT/step"; fi; done; echo done'
    )
    harness.submit("bob/pod", job_spec(cmd, accelerator="v4-32", command={"env": {"CKPT": str(ckpt)}}))
    harness.start()
    job = harness.wait("bob/pod", lambda j: j.state == RUNNING)
    assert len(job.hosts) == 4
    harness.wait("bob/pod", lambda j: (ckpt / "step").exists() and int((ckpt / "step").read_text() or 0) >= 3)
    harness.emu.preempt(job.tpu["name"])
    done = harness.wait("bob/pod", lambda j: j.state == FINISHED and j.tpu is None, timeout=90)
    types = harness.types("bob/pod")
    assert types == ["submitted", *CORE, "preempted", "released", "resumed", *CORE, "finished", "released"]
    assert done.attempt == 2 and done.restarts == 1
    second = harness.output("bob/pod", 2)
    assert "attempt 2 from step" in second and "from step 0" not in second
    assert all(harness.output("bob/pod", 2, w).strip().endswith("done") for w in range(4))


def test_grpc_error_resumes_on_the_same_tpu(harness: Harness):
    cmd = 'if [ "$LEDGER_ATTEMPT" = 1 ]; then echo "jax: GRPC error: connection lost"; sleep 30; fi; echo ok'
    harness.submit("carol/grpc", job_spec(cmd))
    harness.start()
    job = harness.wait("carol/grpc", lambda j: j.state == FINISHED and j.tpu is None, timeout=60)
    types = harness.types("carol/grpc")
    assert types[:7] == ["submitted", *CORE, "failed"]
    assert types[7:] == ["resumed", "setup_started", "setup_done", "started", "finished", "released"]
    assert job.attempt == 2


def test_failure_with_pass_rule_stops_for_good_and_releases(harness: Harness):
    harness.submit("dave/bad", job_spec("echo failing; exit 3", recovery={"on_failure": "pass"}))
    harness.start()
    job = harness.wait("dave/bad", lambda j: j.state == FAILED_FINAL and j.tpu is None)
    assert job.last_error["kind"] == "exit" and job.last_error["rule"] == "pass"
    assert harness.types("dave/bad")[-3:] == ["failed", "failed", "released"]
    harness.verify()


def test_restart_budget_exhausted(harness: Harness):
    harness.submit("erin/flaky", job_spec("exit 7", recovery={"on_failure": "rerun", "max_restarts": 2}))
    harness.start()
    job = harness.wait("erin/flaky", lambda j: j.state == FAILED_FINAL and j.tpu is None, timeout=90)
    assert job.last_error["kind"] == "exit" and job.last_error["rule"] == "exhausted" and job.restarts == 2
    assert harness.types("erin/flaky").count("rerun") == 2
    harness.verify()


def test_cancel_while_running_stops_the_command_and_deletes_the_tpu(harness: Harness):
    harness.submit("fred/long", job_spec("sleep 300"))
    harness.start()
    harness.wait("fred/long", lambda j: j.state == RUNNING)
    harness.append("fred/long", "cancel_requested", {"reason": "spec deleted"})
    harness.wait("fred/long", lambda j: j.state == CANCELLED and j.tpu is None)
    harness.wait("fred/long", lambda j: not harness.nodes())
    harness.verify()


def test_cancel_while_provisioning(harness: Harness):
    harness.emu.slow_creations(3.0)
    harness.submit("gina/early", job_spec("sleep 300"))
    harness.start()
    harness.wait("gina/early", lambda j: j.state == "provisioning")
    harness.append("gina/early", "cancel_requested", {"reason": "changed my mind"})
    harness.wait("gina/early", lambda j: j.state == CANCELLED)
    harness.wait("gina/early", lambda j: not harness.nodes(), timeout=20)
    harness.verify()


def test_queued_resource_waits_for_capacity_then_runs(harness: Harness):
    harness.emu.set_capacity("us-central2-b", "v4", 0)
    harness.submit("hana/qr", job_spec("echo via queued resource", tpu={"allocation_mode": "queued-resources"}))
    harness.start()
    harness.wait("hana/qr", lambda j: j.state == "queued")
    harness.emu.set_capacity("us-central2-b", "v4", None)
    harness.wait("hana/qr", lambda j: j.state == FINISHED and j.tpu is None, timeout=60)
    assert "queued" in harness.types("hana/qr")


def test_shared_tpu_is_handed_to_the_next_job_when_the_first_is_cancelled(harness: Harness):
    from google.cloud import tpu_v2

    from reconciler.keys import ensure_key

    # The lab's TPU already lets the reconciler's key in, as an admin would have set it up.
    key = ensure_key(harness.settings().ssh_key)
    client = harness.emu.client()
    client.create_node(parent="projects/tpu-ledger-local/locations/us-central2-b", node_id="lab-v4-8-1",
                       node=tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base",
                                        metadata={"ssh-keys": f"ledger:{key}"})).result(timeout=30)
    client.transport.close()
    shared = {"shared": True, "name": "lab-v4-8-1"}
    harness.submit("ivan/first", job_spec("sleep 300", tpu=shared))
    harness.submit("jill/second", job_spec("echo second on the shared TPU", tpu=shared))
    harness.start()
    harness.wait("jill/second", lambda j: j.state == "queued" and "held by ivan/first" in j.queued_reason)
    harness.append("ivan/first", "cancel_requested", {"reason": "spec deleted"})
    harness.wait("ivan/first", lambda j: j.state == CANCELLED and j.tpu is None)
    harness.wait("jill/second", lambda j: j.state == FINISHED, timeout=60)
    assert [n.name.rsplit("/", 1)[-1] for n in harness.nodes()] == ["lab-v4-8-1"]  # a shared TPU is never deleted


def test_orphan_node_with_our_labels_is_collected_and_foreign_nodes_are_not(harness: Harness):
    from google.cloud import tpu_v2

    client = harness.emu.client()
    parent = "projects/tpu-ledger-local/locations/us-central2-b"
    client.create_node(parent=parent, node_id="tl-orphan-1", node=tpu_v2.Node(
        accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", labels={"managed-by": "tpu-ledger"})).result(timeout=30)
    client.create_node(parent=parent, node_id="not-ours", node=tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base")).result(timeout=30)
    client.transport.close()
    harness.submit("kim/any", job_spec("sleep 1"))  # puts the zone in use
    harness.start()
    harness.wait("kim/any", lambda j: j.state == FINISHED)
    names = lambda: sorted(n.name.rsplit("/", 1)[-1] for n in harness.nodes())  # noqa: E731
    harness.wait("kim/any", lambda j: names() == ["not-ours"], timeout=30)
    from ledger.store import open_store

    store = open_store(harness.store_url)
    assert any(e.type == "released" and e.data["reason"] == "orphan" for e in store.read_all())


def test_two_reconcilers_at_once_act_once(harness: Harness):
    for i in range(3):
        harness.submit(f"lee/j{i}", job_spec("echo hi"))
    harness.start("one")
    harness.start("two")
    for i in range(3):
        harness.wait(f"lee/j{i}", lambda j: j.state == FINISHED and j.tpu is None, timeout=90)
        assert harness.types(f"lee/j{i}") == ["submitted", *CORE, "finished", "released"]
    harness.wait("lee/j0", lambda j: not harness.nodes(), timeout=20)


def test_ledger_verify_passes_after_a_full_story(harness: Harness):
    harness.submit("mo/ok", job_spec("echo fine"))
    harness.start()
    harness.wait("mo/ok", lambda j: j.state == FINISHED and j.tpu is None)
    out = subprocess.run([sys.executable, "-m", "ledger", "--store", harness.store_url, "verify"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cancel_during_setup_ends_cancelled_with_the_tpu_deleted(harness: Harness):
    spec = job_spec("sleep 300", setup={"modules": ["venv", "command"]}, venv={"name": "env", "python": "python3"})
    harness.submit("omar/setup", spec)
    harness.start()
    harness.wait("omar/setup", lambda j: j.state == "setting_up")
    harness.append("omar/setup", "cancel_requested", {"reason": "wrong data set"})
    job = harness.wait("omar/setup", lambda j: j.state == CANCELLED and j.tpu is None, timeout=60)
    assert "started" not in harness.types("omar/setup") and job.restarts == 0
    assert job.anomalies == []  # an action finishing after the cancel request is legal
    harness.wait("omar/setup", lambda j: not harness.nodes(), timeout=20)
    harness.verify()


def test_the_jobs_snapshot_is_saved_off_the_pass_and_is_the_state_at_its_position(harness: Harness):
    """At 20,000 jobs a snapshot takes seconds to encode: the reconciler saves it on a thread
    of its own from a detached copy of its state, and close() waits for it."""
    harness.submit("alice/notes", job_spec("true"))
    store = open_store(harness.store_url)
    try:
        store.append("alice/notes", [NewEvent("note", {"text": str(i)}) for i in range(SNAPSHOT_EVERY)])
        head = store.head()
        rec = build(harness.settings())
        told: list[tuple[float, bool]] = []
        rec.snapshot_observers.append(lambda seconds, ok: told.append((seconds, ok)))
        rec.step()  # the first pass: a snapshot is due (none yet, and SNAPSHOT_EVERY events)
        rec.close()
        snap = store.load_snapshot(SNAPSHOT_NAME, code_version(), at_most=head)
        assert snap is not None and snap.position == head
        assert decode_state(snap.state, stored_parts(store, snap)) == load_state(store, until=head, use_snapshot=False)
        assert [ok for _, ok in told] == [True]
        # The capacity memory's beside it, the same memory as a fold of every event.
        memory = store.load_snapshot(capacity_snapshot.SNAPSHOT_NAME, capacity_snapshot.code_version(), at_most=head)
        assert memory is not None and memory.position == head
        whole = CapacityMemory().apply_rows(store.fold_rows(0, head))
        assert capacity_snapshot.difference(capacity_snapshot.decode(memory.state), whole) is None
    finally:
        store.close()


def test_with_a_sharing_policy_the_usage_snapshot_is_saved_off_the_pass_too(harness: Harness):
    """Usage's snapshot (the fair-share meter and the accounts) is copied in the pass and
    encoded and saved beside it, like the jobs'; it is the fold of every event up to it."""
    harness.submit("alice/notes", job_spec("true"))
    store = open_store(harness.store_url)
    try:
        store.append("alice/notes", [NewEvent("note", {"text": str(i)}) for i in range(SNAPSHOT_EVERY)])
        head = store.head()
        rec = build(dataclasses.replace(harness.settings(), policy=lab_policy()))
        told: list[bool] = []
        rec.snapshot_observers.append(lambda seconds, ok: told.append(ok))
        rec.step()
        rec.close()
        assert told == [True]
        snap = store.load_snapshot(SNAPSHOT_NAME, code_version(), at_most=head)
        assert snap is not None and snap.position == head
        meter, fold = load_usage(store, lab_policy().fair_share.half_life_hours)
        assert fold.position >= head  # from the usage snapshot at `head`, and the pass's own events after it
        whole = UsageFold(on_interval=ShareMeter(lab_policy().fair_share.half_life_hours).add)
        whole.apply_rows(store.fold_rows(0, fold.position))
        assert fold.accounts == whole.accounts and fold.position == whole.position
        assert usage_snapshot_at(store, head)
    finally:
        store.close()


def usage_snapshot_at(store, position: int) -> bool:
    return any(s.name.startswith("usage/") and s.position == position for s in store.list_snapshots())


def test_a_snapshot_the_store_refuses_fails_alone_and_is_told(harness: Harness, caplog):
    """The save is off the pass, so its failure must still show: a warning and the observers
    (tpu_ledger_snapshot_save_failures_total); the pass itself goes on."""
    harness.submit("alice/notes", job_spec("true"))
    store = open_store(harness.store_url)
    try:
        store.append("alice/notes", [NewEvent("note", {"text": str(i)}) for i in range(SNAPSHOT_EVERY)])
        with sqlite3.connect(harness.store_url.removeprefix("sqlite:///")) as db:  # a store that refuses, for real
            db.execute("CREATE TRIGGER refuse BEFORE INSERT ON snapshots BEGIN SELECT RAISE(ABORT, 'disk full'); END")
        rec = build(harness.settings())
        told: list[bool] = []
        rec.snapshot_observers.append(lambda seconds, ok: told.append(ok))
        with caplog.at_level(logging.WARNING, logger="tpu_ledger.reconciler"):
            assert rec.step() is not None
            rec.close()
        assert told == [False]
        assert "could not save the jobs' snapshot" in caplog.text and "disk full" in caplog.text
        assert store.load_snapshot(SNAPSHOT_NAME, code_version()) is None
    finally:
        store.close()
