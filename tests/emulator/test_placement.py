"""The emulator's capacity per zone, family and pricing, a capacity schedule, and multislice
queued resources, as the real google-cloud-tpu client sees them."""

from __future__ import annotations

import pytest
from google.api_core import exceptions
from google.cloud.tpu_v2.types import cloud_tpu as T

from tests.emulator.conftest import PARENT, ZONE, create_ready, node_msg, pinned_ssh, wait_for

pytestmark = pytest.mark.tpu_emulator

S = T.Node.State
Q = T.QueuedResourceState.State


def test_spot_runs_out_apart_from_on_demand(emu, client, user_key):
    emu.set_capacity(ZONE, "v4", 0, "spot")
    with pytest.raises(exceptions.ResourceExhausted, match="no more capacity"):
        create_ready(client, user_key, "spot-node", scheduling_config=T.SchedulingConfig(spot=True))
    assert create_ready(client, user_key, "ondemand-node").state == S.READY
    assert {(c["pricing"], c["chips"]) for c in emu.cloud.status()["capacity"]} == {("spot", 0)}


def test_a_capacity_schedule_takes_chips_away_and_gives_them_back(emu, client, user_key):
    assert emu.capacity_schedule([{"at": 0, "zone": ZONE, "family": "v4", "chips": 0},
                                  {"at": 0.5, "zone": ZONE, "family": "v4", "chips": None}]) == 2
    wait_for(lambda: emu.cloud.capacity(ZONE, "v4") == 0, what="the capacity taken away")
    with pytest.raises(exceptions.ResourceExhausted):
        create_ready(client, user_key, "too-early")
    wait_for(lambda: emu.cloud.capacity(ZONE, "v4") > 0, what="the capacity back")
    assert create_ready(client, user_key, "in-time").state == S.READY
    with pytest.raises(Exception, match="needs at, zone, family"):
        emu.capacity_schedule([{"zone": ZONE}])


def test_a_multislice_queued_resource_has_every_slice_and_one_can_be_preempted_alone(emu, client, user_key):
    spec = T.QueuedResource.Tpu.NodeSpec(
        parent=PARENT, node=node_msg(user_key, "v4-16"),
        multislice_params=T.QueuedResource.Tpu.NodeSpec.MultisliceParams(node_count=2, node_id_prefix="ms"))
    qr = T.QueuedResource(tpu=T.QueuedResource.Tpu(node_spec=[spec]), spot=T.QueuedResource.Spot())
    client.create_queued_resource(parent=PARENT, queued_resource_id="ms", queued_resource=qr).result(timeout=60)
    name = f"{PARENT}/queuedResources/ms"
    wait_for(lambda: client.get_queued_resource(name=name).state.state == Q.ACTIVE, what="ACTIVE")
    nodes = [client.get_node(name=f"{PARENT}/nodes/ms-{i}") for i in range(2)]
    assert all(n.state == S.READY and n.multislice_node and n.queued_resource == name and n.scheduling_config.spot for n in nodes)
    for node in nodes:  # every host of every slice answers over SSH
        for worker in range(2):
            ssh = pinned_ssh(client, node, worker, user_key)
            _, out, _ = ssh.exec_command("echo $TPU_WORKER_ID")
            assert out.read().strip() == str(worker).encode()
            ssh.close()
    emu.preempt("ms-1")
    assert client.get_node(name=nodes[1].name).state == S.PREEMPTED
    assert client.get_node(name=nodes[0].name).state == S.READY  # the other slice lives on
    wait_for(lambda: client.get_queued_resource(name=name).state.state == Q.SUSPENDED, what="SUSPENDED")
    client.delete_queued_resource(request={"name": name, "force": True}).result(timeout=60)
    assert list(client.list_nodes(parent=PARENT)) == []
