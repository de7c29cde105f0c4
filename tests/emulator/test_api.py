"""The TPU API as the real google-cloud-tpu client sees it, over gRPC and over REST."""

from __future__ import annotations

import json

import pytest
from google.api_core import exceptions
from google.cloud.tpu_v2.types import cloud_tpu as T
from google.protobuf import duration_pb2

from tests.emulator.conftest import PARENT, PROJECT, ZONE, create_ready, node_msg, wait_for

pytestmark = pytest.mark.tpu_emulator

S = T.Node.State
Q = T.QueuedResourceState.State

# Over REST a client sees only the HTTP status, which google/rpc/code.proto maps from the
# canonical code: 400 for INVALID_ARGUMENT and FAILED_PRECONDITION, 409 for ALREADY_EXISTS.
_OVER_HTTP = {
    exceptions.InvalidArgument: exceptions.BadRequest,
    exceptions.FailedPrecondition: exceptions.BadRequest,
    exceptions.AlreadyExists: exceptions.Conflict,
}


@pytest.fixture(params=["grpc", "rest"])
def client(request, emu):
    c = emu.client(request.param)
    try:
        yield c
    finally:
        c.transport.close()


def raises(client, error: type[exceptions.GoogleAPICallError], match: str | None = None):
    """pytest.raises for the class `client` raises when the API answers with `error`'s code."""
    if client.transport.kind == "rest":
        error = _OVER_HTTP.get(error, error)
    return pytest.raises(error, match=match)


def test_create_get_list_delete_node(client, user_key):
    op = client.create_node(
        parent=PARENT,
        node_id="train-1",
        node=node_msg(user_key, "v4-32", labels={"job": "j1", "team": "ml"}, scheduling_config=T.SchedulingConfig(spot=True), description="d"),
    )
    meta = T.OperationMetadata.deserialize(op.operation.metadata.value)
    assert meta.verb == "create" and meta.target == f"{PARENT}/nodes/train-1"
    node = op.result(timeout=60)
    assert node.state == S.READY and node.health == T.Node.Health.HEALTHY
    got = client.get_node(name=f"{PARENT}/nodes/train-1")
    assert got.name == f"{PARENT}/nodes/train-1"
    assert got.accelerator_type == "v4-32" and got.runtime_version == "tpu-ubuntu2204-base"
    assert dict(got.labels) == {"job": "j1", "team": "ml"}
    assert got.scheduling_config.spot is True and got.description == "d"
    assert len(got.network_endpoints) == 4  # v4-32: 4 hosts
    ports = {ep.port for ep in got.network_endpoints}
    assert len(ports) == 4 and all(ep.ip_address == "127.0.0.1" and ep.access_config.external_ip == "127.0.0.1" for ep in got.network_endpoints)
    assert got.create_time is not None and got.id > 0

    assert [n.name for n in client.list_nodes(parent=PARENT)] == [got.name]
    client.delete_node(name=got.name).result(timeout=60)
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=got.name)
    assert list(client.list_nodes(parent=PARENT)) == []


def test_list_nodes_by_zone(client, user_key):
    other = f"projects/{PROJECT}/locations/us-east1-d"
    client.create_node(parent=PARENT, node_id="a", node=node_msg(user_key, "v4-8")).result(timeout=60)
    client.create_node(parent=other, node_id="b", node=node_msg(user_key, "v6e-4")).result(timeout=60)
    assert [n.name.rsplit("/", 1)[1] for n in client.list_nodes(parent=PARENT)] == ["a"]
    assert [n.name.rsplit("/", 1)[1] for n in client.list_nodes(parent=other)] == ["b"]
    assert sorted(n.name.rsplit("/", 1)[1] for n in client.list_nodes(parent=f"projects/{PROJECT}/locations/-")) == ["a", "b"]
    assert list(client.list_nodes(parent=f"projects/other/locations/{ZONE}")) == []


def test_errors_have_the_right_classes(emu, client, user_key):
    create_ready(client, user_key, "taken")
    with raises(client, exceptions.AlreadyExists, match="already exists"):
        client.create_node(parent=PARENT, node_id="taken", node=node_msg(user_key))
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{PARENT}/nodes/missing")
    with pytest.raises(exceptions.NotFound):
        client.delete_node(name=f"{PARENT}/nodes/missing")
    with raises(client, exceptions.InvalidArgument, match="accelerator"):
        client.create_node(parent=PARENT, node_id="x", node=node_msg(user_key, "v4-33"))
    with raises(client, exceptions.InvalidArgument, match="zone"):
        client.create_node(parent=f"projects/{PROJECT}/locations/mars-1-a", node_id="x", node=node_msg(user_key, "v4-8"))
    with raises(client, exceptions.InvalidArgument, match="not available in zone"):
        client.create_node(parent=f"projects/{PROJECT}/locations/us-central1-b", node_id="x", node=node_msg(user_key, "v4-8"))

    emu.set_capacity(ZONE, "v4", 4)  # "taken" holds 4 chips already
    op = client.create_node(parent=PARENT, node_id="big", node=node_msg(user_key, "v4-8"))
    assert op.done() and isinstance(op.exception(), exceptions.ResourceExhausted)
    with pytest.raises(exceptions.ResourceExhausted, match="no more capacity"):
        op.result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{PARENT}/nodes/big")
    emu.set_capacity(ZONE, "v4", None)
    create_ready(client, user_key, "big")


def test_stop_start_and_update(client, user_key):
    node = create_ready(client, user_key, "n1")
    stopped = client.stop_node(request={"name": node.name}).result(timeout=60)
    assert stopped.state == S.STOPPED
    with raises(client, exceptions.FailedPrecondition):
        client.stop_node(request={"name": node.name})
    started = client.start_node(request={"name": node.name}).result(timeout=60)
    assert started.state == S.READY and len(started.network_endpoints) == 1
    change = T.Node(name=node.name, labels={"k": "v"}, description="new", scheduling_config=T.SchedulingConfig(reserved=True))
    updated = client.update_node(request={"node": change, "update_mask": {"paths": ["labels", "description", "scheduling_config"]}}).result(timeout=60)
    assert dict(updated.labels) == {"k": "v"} and updated.description == "new" and updated.scheduling_config.reserved
    with raises(client, exceptions.InvalidArgument):
        client.update_node(request={"node": change, "update_mask": {"paths": ["accelerator_type"]}})


def test_operation_fault_and_operations_api(emu, client, user_key):
    emu.fail_next_operation("INTERNAL", "boom")
    op = client.create_node(parent=PARENT, node_id="n1", node=node_msg(user_key))
    with pytest.raises(exceptions.InternalServerError, match="boom"):
        op.result(timeout=60)
    ops = list(client.list_operations(request={"name": PARENT}).operations)
    assert [o.name for o in ops] == [op.operation.name] and ops[0].done and ops[0].error.message == "boom"
    got = client.get_operation(request={"name": op.operation.name})
    assert got.done
    client.delete_operation(request={"name": op.operation.name})
    with pytest.raises(exceptions.NotFound):
        client.get_operation(request={"name": op.operation.name})

    emu.fail_creations(1, zone=ZONE, code="UNAVAILABLE")
    with pytest.raises(exceptions.ServiceUnavailable):
        client.create_node(parent=PARENT, node_id="n2", node=node_msg(user_key)).result(timeout=60)
    create_ready(client, user_key, "n2")
    kinds = [f["fault"] for f in emu.faults]
    assert kinds == ["fail_next_operation", "operation_failed", "fail_creations", "creation_failed"]
    logged = [json.loads(line) for line in (emu.state_dir / "faults.jsonl").read_text().splitlines()]
    assert [f["fault"] for f in logged] == kinds and all(f["time"] > 0 for f in logged)


def test_slow_creations(emu, client, user_key):
    emu.slow_creations(1.5)
    op = client.create_node(parent=PARENT, node_id="slow", node=node_msg(user_key))
    wait_for(lambda: client.get_node(name=f"{PARENT}/nodes/slow").state == S.CREATING, what="CREATING")
    assert op.result(timeout=60).state == S.READY
    meta = T.OperationMetadata.deserialize(op.operation.metadata.value)
    assert (meta.end_time - meta.create_time).total_seconds() >= 1.4


def _qr(node_id: str, key, accel: str = "v4-8", **extra) -> T.QueuedResource:
    spec = T.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id=node_id, node=node_msg(key, accel))
    return T.QueuedResource(tpu=T.QueuedResource.Tpu(node_spec=[spec]), **extra)


def test_queued_resource_through_every_state(emu, client, user_key):
    name = f"{PARENT}/queuedResources/qr1"
    emu.set_capacity(ZONE, "v4", 0)
    seen: list[int] = []

    def state() -> int:
        s = client.get_queued_resource(name=name).state.state
        if not seen or seen[-1] != s:
            seen.append(s)
        return s

    qr = client.create_queued_resource(parent=PARENT, queued_resource_id="qr1", queued_resource=_qr("worker-node", user_key, spot=T.QueuedResource.Spot())).result(timeout=60)
    assert qr.state.state in (Q.ACCEPTED, Q.WAITING_FOR_RESOURCES)
    seen.append(qr.state.state)
    wait_for(lambda: state() == Q.WAITING_FOR_RESOURCES, what="WAITING_FOR_RESOURCES")
    emu.set_capacity(ZONE, "v4", 4)
    wait_for(lambda: state() == Q.ACTIVE, what="ACTIVE")
    assert Q.PROVISIONING in seen

    node = client.get_node(name=f"{PARENT}/nodes/worker-node")
    assert node.state == S.READY and node.queued_resource == name and node.scheduling_config.spot
    assert [n.name for n in client.list_nodes(parent=PARENT)] == [node.name]

    emu.preempt("worker-node")
    assert client.get_node(name=node.name).state == S.PREEMPTED
    wait_for(lambda: state() == Q.SUSPENDED, what="SUSPENDED")
    assert Q.SUSPENDING in seen
    assert client.get_queued_resource(name=name).state.state_initiator == T.QueuedResourceState.StateInitiator.SERVICE

    with raises(client, exceptions.FailedPrecondition):
        client.delete_queued_resource(name=name)
    client.reset_queued_resource(request={"name": name}).result(timeout=60)
    wait_for(lambda: state() == Q.ACTIVE, what="ACTIVE after reset")
    op = client.delete_queued_resource(request={"name": name, "force": True})
    assert state() == Q.DELETING
    op.result(timeout=60)
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=name)
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=node.name)
    assert seen[:2] in ([Q.ACCEPTED, Q.WAITING_FOR_RESOURCES], [Q.WAITING_FOR_RESOURCES, Q.PROVISIONING])


def test_queued_resource_failed_and_expired(emu, client, user_key):
    emu.fail_creations(1, code="INTERNAL", message="no luck")
    client.create_queued_resource(parent=PARENT, queued_resource_id="qf", queued_resource=_qr("nf", user_key)).result(timeout=60)
    qr = wait_for(lambda: (q := client.get_queued_resource(name=f"{PARENT}/queuedResources/qf")).state.state == Q.FAILED and q, what="FAILED")
    assert qr.state.failed_data.error.message == "no luck"
    assert list(client.list_nodes(parent=PARENT)) == []

    emu.set_capacity(ZONE, "v4", 0)
    policy = T.QueuedResource.QueueingPolicy(valid_until_duration=duration_pb2.Duration(seconds=1))
    client.create_queued_resource(parent=PARENT, queued_resource_id="qe", queued_resource=_qr("ne", user_key, queueing_policy=policy)).result(timeout=60)
    qr = wait_for(lambda: (q := client.get_queued_resource(name=f"{PARENT}/queuedResources/qe")).state.state == Q.FAILED and q, what="expired")
    assert qr.state.failed_data.error.code == 4  # DEADLINE_EXCEEDED
    assert {q.name.rsplit("/", 1)[1] for q in client.list_queued_resources(parent=PARENT)} == {"qf", "qe"}
    with raises(client, exceptions.AlreadyExists):
        client.create_queued_resource(parent=PARENT, queued_resource_id="qe", queued_resource=_qr("other", user_key))


def test_accelerator_types_runtime_versions_locations(client):
    types = [a.type_ for a in client.list_accelerator_types(parent=PARENT)]
    assert "v4-32" in types and "v6e-256" in types and "v5p-8" not in types
    assert client.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v4-8").type_ == "v4-8"
    versions = [r.version for r in client.list_runtime_versions(parent=PARENT)]
    assert "tpu-ubuntu2204-base" in versions
    with pytest.raises(exceptions.NotFound):
        client.get_runtime_version(name=f"{PARENT}/runtimeVersions/nope")
    locs = client.list_locations(request={"name": f"projects/{PROJECT}"})
    assert ZONE in [loc.location_id for loc in locs.locations]


def test_scheduled_and_random_preemptions_are_logged(emu, client, user_key):
    create_ready(client, user_key, "a", scheduling_config=T.SchedulingConfig(preemptible=True))
    create_ready(client, user_key, "b")
    assert emu.preempt("a", at=0.3) == pytest.approx(0.3)
    delay = emu.preempt("b", rate=3600 * 20, state="TERMINATED")  # mean 0.05 s
    assert client.get_node(name=f"{PARENT}/nodes/a").state == S.READY
    wait_for(lambda: client.get_node(name=f"{PARENT}/nodes/a").state == S.PREEMPTED, what="a PREEMPTED")
    wait_for(lambda: client.get_node(name=f"{PARENT}/nodes/b").state == S.TERMINATED, what="b TERMINATED")
    faults = emu.faults
    applied = {f["node"].rsplit("/", 1)[1]: f for f in faults if f["fault"] == "preempt"}
    scheduled = {f["node"].rsplit("/", 1)[1]: f for f in faults if f["fault"] == "preempt_scheduled"}
    assert applied["a"]["time"] - scheduled["a"]["time"] >= 0.25
    assert set(applied) == {"a", "b"} and applied["b"]["state"] == "TERMINATED"
    assert ("b" in scheduled) == (delay > 0)
    with pytest.raises(Exception, match="not found"):
        emu.preempt("nope")
