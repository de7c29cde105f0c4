"""A multislice job against the emulator: one queued resource of two slices, the command on
every host of every slice with the Megascale variables, one slice preempted recovering the
whole job, and nothing left behind."""

from __future__ import annotations

import time

import pytest

from ledger.fold import FINISHED, RUNNING
from ledger.store import open_store
from reconciler.remote import layout
from tests.reconciler.conftest import Harness, job_spec

CMD = ('echo "slice=$MEGASCALE_SLICE_ID/$MEGASCALE_NUM_SLICES coord=$MEGASCALE_COORDINATOR_ADDRESS worker=$LEDGER_WORKER_ID '
       'chips=$LEDGER_CHIPS attempt=$LEDGER_ATTEMPT"; '
       'if [ "$LEDGER_ATTEMPT" = 1 ]; then sleep 60; fi; echo done')


def test_two_slices_run_everywhere_and_a_lost_slice_recovers_the_whole_job(harness: Harness):
    spec = job_spec(CMD, accelerator="v4-16", tpu={"allocation_mode": "queued-resources", "slices": 2})
    harness.submit("maya/ms", spec)
    harness.start()
    job = harness.wait("maya/ms", lambda j: j.state == RUNNING)
    assert job.tpu["slices"] == 2 and len(job.hosts) == 4  # 2 slices x 2 hosts
    assert [(h["slice"], h["worker"]) for h in job.hosts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    coordinator = f"{job.hosts[0]['address']}:8081"

    def out(attempt: int, slice_: int, worker: int) -> str:
        path = layout.output_log(harness.tmp / "logs", "maya/ms", attempt, worker, slice_)
        return path.read_text() if path.exists() else ""

    harness.wait("maya/ms", lambda j: all(out(1, s, w) for s in range(2) for w in range(2)))
    for s in range(2):
        for w in range(2):
            assert out(1, s, w).startswith(f"slice={s}/2 coord={coordinator} worker={w} chips=16 attempt=1")
    harness.emu.preempt(f"{job.tpu['name']}-1")  # one slice alone
    done = harness.wait("maya/ms", lambda j: j.state == FINISHED and j.tpu is None, timeout=90)
    types = harness.types("maya/ms")
    assert types.count("preempted") == 1 and types.count("resumed") == 1 and done.attempt == 2
    store = open_store(harness.store_url)
    preempted = next(e for e in store.read_stream("maya/ms") if e.type == "preempted")
    store.close()
    assert preempted.data["slice"] == 1 and preempted.data["tpu_state"] == "PREEMPTED"
    assert all(out(2, s, w).rstrip().endswith("done") for s in range(2) for w in range(2))
    # attempt 1's command was stopped on the surviving slice, never left running
    assert "done" not in out(1, 0, 0) and "done" not in out(1, 0, 1)
    harness.wait("maya/ms", lambda j: not harness.nodes(), timeout=30)  # no slice left behind
    harness.verify()


PARENT = "projects/tpu-ledger-local/locations/us-central2-b"


def two_slices(client, name: str, parent: str = PARENT, metadata: dict[str, str] | None = None) -> None:  # noqa: ANN001 - the emulator's tpu_v2 client
    """A queued resource of ours of two v4-8 slices (nodes NAME-0, NAME-1), made directly
    (`metadata`: the nodes', e.g. ssh-keys)."""
    from google.cloud import tpu_v2

    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", labels={"managed-by": "tpu-ledger"},
                       metadata=metadata or {})
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node=node, multislice_params=tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
        node_count=2, node_id_prefix=name))
    client.create_queued_resource(parent=parent, queued_resource_id=name, queued_resource=tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))).result(timeout=30)


def test_an_orphaned_multislice_queued_resource_goes_whole(harness: Harness):
    """A queued resource of ours that no job holds (its job's record lost, say) is deleted
    as one: no slice and no empty queued resource is left behind."""
    client = harness.emu.client()
    two_slices(client, "tl-lost")
    queued = lambda: [q.name.rsplit("/", 1)[-1] for q in client.list_queued_resources(parent=PARENT)]  # noqa: E731
    try:
        harness.submit("kim/any", job_spec("sleep 1"))  # puts the zone in use
        harness.start()
        harness.wait("kim/any", lambda j: j.state == FINISHED)
        harness.wait("kim/any", lambda j: not harness.nodes() and not queued(), timeout=60)
    finally:
        client.transport.close()

    def orphans() -> list[dict]:
        store = open_store(harness.store_url)
        try:
            return [e.data["tpu"] for e in store.read_all() if e.type == "released" and e.data["reason"] == "orphan"]
        finally:
            store.close()

    deadline = time.monotonic() + 30  # recorded once the delete's operation is seen done, just after it is
    while not orphans() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert orphans() == [{"name": "tl-lost", "zone": "us-central2-b", "kind": "queued_resource", "shared": False}]
    harness.verify()


def test_a_multislice_release_waits_for_its_queued_resource_and_fails_with_it(harness: Harness):
    """A multislice queued resource has no node of its own name: its delete is the queued
    resource's, and the release must wait for that operation. Before, a force delete whose
    operation failed was taken as done: `released` was recorded while both slices stayed
    READY, and the next attempt's TPU made two live TPUs for one job (chaos, SQLite, seed 7)."""
    from reconciler.tpu import DeleteFailedError, TpuApi

    client = harness.emu.client()
    two_slices(client, "tl-ms")
    api = TpuApi("tpu-ledger-local", harness.emu.endpoint)
    live = lambda: sorted(n.name.rsplit("/", 1)[-1] for n in harness.nodes() if n.state.name != "DELETING")  # noqa: E731
    try:
        deadline = time.monotonic() + 30
        while live() != ["tl-ms-0", "tl-ms-1"] and time.monotonic() < deadline:
            time.sleep(0.1)
        harness.emu.fail_next_operation("INTERNAL", "the delete fails")
        with pytest.raises(DeleteFailedError, match="queued resource tl-ms"):
            api.delete("us-central2-b", "tl-ms", queued=True)
        assert live() == ["tl-ms-0", "tl-ms-1"]  # still there: the release is tried again, not recorded
        assert api.delete("us-central2-b", "tl-ms", queued=True)
        assert harness.nodes() == []  # gone when the release returns, every slice
    finally:
        api.close()
        client.transport.close()


def test_a_release_taken_up_after_a_crash_awaits_its_queued_resource_being_deleted(harness: Harness):
    """A reconciler that dies after asking a multislice queued resource's delete leaves it
    DELETING; the next one takes the release up and must await that delete, not look for a
    node named like the queued resource (there is none), and not ask again (Google refuses a
    delete of a resource already being deleted: the release would fail)."""
    from reconciler.executor import Executor
    from reconciler.tpu import TpuApi

    client = harness.emu.client()
    two_slices(client, "tl-ms")
    api = TpuApi("tpu-ledger-local", harness.emu.endpoint)
    executor = Executor(lambda: None, api, None, holder="t", ssh_user="u", ssh_public_key="",  # type: ignore[arg-type]
                        hosts_of=lambda job: [], extra_args_of=lambda spec: [])
    try:
        deadline = time.monotonic() + 30
        while len(harness.nodes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        harness.emu.timings.delete = 1.5  # still DELETING when the next reconciler looks
        client.delete_queued_resource(request={"name": f"{PARENT}/queuedResources/tl-ms", "force": True})  # the dead one's
        assert api.state_of("us-central2-b", "tl-ms", queued=True) == "DELETING"
        harness.emu.fail_calls("DeleteQueuedResource", "FAILED_PRECONDITION", message="the queued resource is being deleted")
        tpu = {"name": "tl-ms", "zone": "us-central2-b", "kind": "queued_resource", "shared": False}
        assert executor._delete(tpu, taken_up=True)
        assert harness.nodes() == [] and api.state_of("us-central2-b", "tl-ms", queued=True) is None
    finally:
        api.close()
        client.transport.close()


def test_a_multislice_setup_that_fails_on_ready_slices_is_a_setup_failure_not_a_preemption(harness: Harness):
    """After a failed step the executor asks the API whether the TPU went away. A multislice
    TPU has no node of its own name: asked by that name, every setup failure read as the TPU
    DELETED and was recorded as a preemption (recovered over and over, never failing)."""
    from reconciler.keys import ensure_key

    key = harness.settings().ssh_key
    ensure_key(key)
    spec = job_spec("echo never", accelerator="v4-8", tpu={"allocation_mode": "queued-resources", "slices": 2},
                    setup={"modules": ["ssh", "command"]}, ssh={"identities": [{"private_key": str(key)}]},
                    recovery={"max_restarts": 0})
    harness.submit("mallory/ms", spec)
    harness.start()
    harness.wait("mallory/ms", lambda j: {"setup_failed", "preempted"} & set(harness.types(j.id)), timeout=90)
    types = harness.types("mallory/ms")
    assert "setup_failed" in types and "preempted" not in types, types
    harness.verify()
