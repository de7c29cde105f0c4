"""The real gcloud CLI against the emulator's REST surface: what researchers (and the scripts we
replace) run, each step checked on the emulator's own state."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable

import pytest

from emulator import Emulator
from tests.emulator.conftest import PARENT, PROJECT, ZONE, wait_for

GCLOUD = shutil.which("gcloud")

pytestmark = [
    pytest.mark.skipif(GCLOUD is None, reason="the gcloud CLI is not installed (apt-get install google-cloud-cli)"),
]

Gcloud = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def gcloud(emu: Emulator, tmp_path) -> Gcloud:
    """Runs `gcloud compute tpus ARGS --zone ZONE` with the settings `ledger emulator` prints,
    a private configuration directory and no prompts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
    env.update(emu.gcloud_env(PROJECT), CLOUDSDK_CONFIG=str(tmp_path / "gcloud-config"), CLOUDSDK_CORE_DISABLE_PROMPTS="1")

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([GCLOUD, "compute", "tpus", *args, f"--zone={ZONE}"], env=env, capture_output=True, text=True, timeout=120)
        if ok:
            assert r.returncode == 0, f"gcloud {' '.join(args)}: {r.stderr}"
        return r

    return run


def _node(emu: Emulator, node_id: str) -> dict | None:
    return next((n for n in emu.status()["nodes"] if n["name"] == f"{PARENT}/nodes/{node_id}"), None)


def test_tpu_vm_life_cycle_and_faults(emu: Emulator, gcloud: Gcloud):
    r = gcloud("tpu-vm", "create", "t1", "--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base", "--spot", "--labels=job=j1")
    assert "Created tpu [t1]" in r.stderr
    assert _node(emu, "t1")["state"] == "READY"
    pb = emu.cloud.get_node(f"{PARENT}/nodes/t1")
    assert pb.scheduling_config.spot and dict(pb.labels) == {"job": "j1"} and pb.runtime_version == "tpu-ubuntu2204-base"

    rows = gcloud("tpu-vm", "list").stdout.splitlines()
    assert rows[0].split()[:3] == ["NAME", "ZONE", "ACCELERATOR_TYPE"]
    assert rows[1].split()[:3] == ["t1", ZONE, "v4-32"] and rows[1].split()[-1] == "READY" and len(rows) == 2

    described = json.loads(gcloud("tpu-vm", "describe", "t1", "--format=json").stdout)
    assert [ep["port"] for ep in described["networkEndpoints"]] == emu.host_ports("t1")
    assert len(described["networkEndpoints"]) == 4 and described["schedulingConfig"] == {"spot": True}

    r = gcloud("tpu-vm", "stop", "t1", ok=False)  # as the API documents: stop is for single TPU nodes
    assert r.returncode == 1 and "only available for single TPU nodes" in r.stderr
    assert _node(emu, "t1")["state"] == "READY" and len(_node(emu, "t1")["ports"]) == 4

    emu.preempt("t1")
    assert gcloud("tpu-vm", "describe", "t1", "--format=value(state)").stdout.strip() == "PREEMPTED"
    r = gcloud("tpu-vm", "delete", "t1", "--quiet")
    assert "Deleted tpu [t1]" in r.stderr and _node(emu, "t1") is None

    emu.set_capacity(ZONE, "v4", 0)
    r = gcloud("tpu-vm", "create", "t2", "--accelerator-type=v4-8", "--version=tpu-ubuntu2204-base", ok=False)
    # as Google's stock-outs read: the operation's google.rpc.Status, code 8 = RESOURCE_EXHAUSTED
    assert r.returncode == 1 and '"code": 8' in r.stderr
    assert f'There is no more capacity in the zone \\"{ZONE}\\"' in r.stderr
    assert _node(emu, "t2") is None
    r = gcloud("tpu-vm", "describe", "t2", ok=False)
    assert r.returncode == 1 and "NOT_FOUND: Resource" in r.stderr


def test_queued_resource_life_cycle_and_discovery(emu: Emulator, gcloud: Gcloud):
    r = gcloud("queued-resources", "create", "q1", "--node-id=qn", "--accelerator-type=v4-8", "--runtime-version=tpu-ubuntu2204-base", "--spot")
    assert "Created queued_resource [q1]" in r.stderr
    wait_for(lambda: emu.status()["queued_resources"] == [{"name": f"{PARENT}/queuedResources/q1", "state": "ACTIVE"}], what="q1 ACTIVE")
    assert _node(emu, "qn")["queued_resource"] == f"{PARENT}/queuedResources/q1"

    listed = json.loads(gcloud("queued-resources", "list", "--format=json").stdout)
    assert [(q["name"], q["state"]["state"]) for q in listed] == [(f"{PARENT}/queuedResources/q1", "ACTIVE")]
    described = json.loads(gcloud("queued-resources", "describe", "q1", "--format=json").stdout)
    assert described["tpu"]["nodeSpec"][0]["nodeId"] == "qn" and described["spot"] == {}

    r = gcloud("queued-resources", "delete", "q1", "--quiet", ok=False)  # its node still exists
    assert r.returncode == 1 and "FAILED_PRECONDITION" in r.stderr
    r = gcloud("queued-resources", "delete", "q1", "--force", "--quiet")
    assert "Deleted queued_resource [q1]" in r.stderr
    assert emu.status()["queued_resources"] == [] and emu.status()["nodes"] == []

    types = gcloud("tpu-vm", "accelerator-types", "list", "--format=value(type)").stdout.split()
    assert "v4-32" in types and "v6e-8" in types and "v5p-8" not in types
    versions = gcloud("tpu-vm", "versions", "list", "--format=value(version)").stdout.split()
    assert "tpu-ubuntu2204-base" in versions
