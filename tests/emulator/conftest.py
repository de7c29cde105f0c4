from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import paramiko
import pytest
from google.cloud.tpu_v2.types import cloud_tpu as T

from emulator import Emulator, Timings
from ledger import tpu_types

PROJECT = "proj"
ZONE = "us-central2-b"  # offers v4 and v6e
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
USER = "alice"


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def user_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate(bits=256)


def ssh_keys_line(key: paramiko.PKey, user: str = USER) -> str:
    return f"{user}:{key.get_name()} {key.get_base64()} {user}@laptop"


@pytest.fixture
def emu(tmp_path) -> Iterator[Emulator]:
    with Emulator(state_dir=tmp_path / "emu", timings=Timings(create=0.2, maintenance=0.5)) as e:
        yield e


@pytest.fixture
def client(emu: Emulator):
    c = emu.client()
    try:
        yield c
    finally:
        c.transport.close()


def node_msg(key: paramiko.PKey, accel: str = "v4-8", **extra: Any) -> T.Node:
    family = tpu_types.lookup(accel).family if tpu_types.lookup(accel) else "v4"
    return T.Node(
        accelerator_type=accel,
        runtime_version=tpu_types.DEFAULT_RUNTIME[family],  # the API refuses a version of another generation
        metadata={"ssh-keys": ssh_keys_line(key)},
        **extra,
    )


def create_ready(client, key: paramiko.PKey, node_id: str, accel: str = "v4-8", **extra: Any) -> T.Node:
    return client.create_node(parent=PARENT, node_id=node_id, node=node_msg(key, accel, **extra)).result(timeout=60)


def pinned_ssh(client, node: T.Node, worker: int, key: paramiko.PKey, user: str = USER) -> paramiko.SSHClient:
    """Connect to one worker, trusting only the host key published in guest attributes."""
    attrs = client.get_guest_attributes(request={"name": node.name, "query_path": "hostkeys/", "worker_ids": [str(worker)]})
    item = next(i for i in attrs.guest_attributes[0].query_value.items if i.key == "ecdsa-sha2-nistp256")
    ep = node.network_endpoints[worker]
    ssh = paramiko.SSHClient()
    host = f"[{ep.ip_address}]:{ep.port}"
    ssh.get_host_keys().add(host, item.key, paramiko.ECDSAKey(data=__import__("base64").b64decode(item.value)))
    ssh.set_missing_host_key_policy(paramiko.RejectPolicy())
    ssh.connect(ep.ip_address, port=ep.port, username=user, pkey=key, look_for_keys=False, allow_agent=False, timeout=20, banner_timeout=20, auth_timeout=20)
    return ssh


def run(ssh: paramiko.SSHClient, command: str, stdin: bytes | None = None, timeout: float = 60) -> tuple[int, str, str]:
    i, o, e = ssh.exec_command(command, timeout=timeout)
    if stdin is not None:
        i.write(stdin)
        i.channel.shutdown_write()
    out = o.read().decode()
    err = e.read().decode()
    return o.channel.recv_exit_status(), out, err
