"""Fixtures: an emulated TPU pod reached over the emulator's real SSH hosts, and the
reconciler harness (tests/reconciler) for whole jobs."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest
from google.cloud.tpu_v2.types import cloud_tpu as T

from emulator import Emulator, Timings
from ledger import defaults, tpu_types
from reconciler.doctor import Context, Doctor, Paths
from reconciler.remote import Host, RemoteRunner
from tests.reconciler.conftest import Harness, harness  # noqa: F401 - the reconciler's harness fixture, here too

PARENT = "projects/proj/locations/us-central2-b"
USER = "alice"


@dataclass
class Pod:
    emu: Emulator
    node: str
    hosts: list[Host]
    runner: RemoteRunner
    doctor: Doctor
    tmp: Path

    def sh(self, worker: int, command: str) -> str:
        res = self.runner.run(self.hosts[worker], "bash -c " + shlex.quote(command))
        return res.stdout.decode()

    def examine(self, ctx: Context | None = None):
        return self.doctor.examine(self.hosts, ctx or Context(job_id=None, attempt=0, spec={}))


def make_pod(tmp_path: Path, emu: Emulator, accel: str = "v4-32", node_id: str = "pod", key_path: Path | None = None) -> Pod:
    """A node reached with a key of its own, or with the one at `key_path` (shared by pods)."""
    if key_path is None:
        key = paramiko.ECDSAKey.generate(bits=256)
        key_path = tmp_path / f"id_{node_id}"
        key.write_private_key_file(str(key_path))
    else:
        key = paramiko.ECDSAKey.from_private_key_file(str(key_path))
    client = emu.client()
    try:
        msg = T.Node(accelerator_type=accel, runtime_version=tpu_types.DEFAULT_RUNTIME[tpu_types.lookup(accel).family],
                     metadata={"ssh-keys": f"{USER}:{key.get_name()} {key.get_base64()} {USER}@ledger"})
        node = client.create_node(parent=PARENT, node_id=node_id, node=msg).result(timeout=60)
        attrs = client.get_guest_attributes(request={"name": node.name, "query_path": "hostkeys/"}).guest_attributes
    finally:
        client.transport.close()
    hosts = []
    for w, ep in enumerate(node.network_endpoints):
        item = next(i for i in attrs[w].query_value.items if i.key == "ecdsa-sha2-nistp256")
        hosts.append(Host(w, ep.ip_address, ep.port, USER, host_key=f"{item.key} {item.value}"))
    runner = RemoteRunner(private_key_path=key_path, known_hosts_path=tmp_path / f"known_hosts_{node_id}",
                          log_dir=tmp_path / "logs", username=USER, command_timeout=60, retries=1, backoff=0.1)
    return Pod(emu, node_id, hosts, runner, Doctor(runner, Paths.for_root(defaults.EMULATOR_HOST_ROOT)), tmp_path)


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    with Emulator(state_dir=tmp_path / "emu", timings=Timings(create=0.1)) as emu:
        p = make_pod(tmp_path, emu)
        try:
            yield p
        finally:
            p.doctor.close()
            p.runner.close()

