"""The hosts, through real paramiko SSH and SFTP clients."""

from __future__ import annotations

import base64
import os
import socket

import paramiko
import pytest
from google.cloud.tpu_v2.types import cloud_tpu as T

from tests.emulator.conftest import USER, create_ready, pid_alive, pinned_ssh, run, wait_for

pytestmark = pytest.mark.tpu_emulator

S = T.Node.State


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def test_exec_exit_codes_stdin_and_sftp(client, user_key):
    node = create_ready(client, user_key, "one")
    with pinned_ssh(client, node, 0, user_key) as ssh:
        assert run(ssh, "echo hello; echo oops >&2; exit 7") == (7, "hello\n", "oops\n")
        assert run(ssh, "true")[0] == 0
        assert run(ssh, "tr a-z A-Z", stdin=b"shout")[1] == "SHOUT"
        code, out, _ = run(ssh, "pwd; echo $HOME; whoami >/dev/null; echo $USER")
        home, home_env, user = out.split()
        assert code == 0 and home == home_env and user == USER and "/hosts/" in home
        assert run(ssh, "kill -9 $$")[0] == 137  # killed by a signal: 128 + 9

        sftp = ssh.open_sftp()
        with sftp.open("in.txt", "w") as f:
            f.write("payload\n")
        sftp.mkdir("sub")
        sftp.put(__file__, "sub/copy.py")
        assert sorted(sftp.listdir(".")) == [".vm", "in.txt", "sub"]  # .vm: the VM's files (hosts.py)
        assert sftp.stat("sub/copy.py").st_size == os.path.getsize(__file__)
        assert run(ssh, "cat in.txt && wc -c < sub/copy.py")[1].split() == ["payload", str(os.path.getsize(__file__))]
        run(ssh, "echo made-remotely > out.txt")
        with sftp.open("out.txt") as f:
            assert f.read() == b"made-remotely\n"
        assert sftp.normalize(".") == home
        sftp.close()


def test_unknown_keys_and_users_are_refused(client, user_key):
    node = create_ready(client, user_key, "locked")
    port = node.network_endpoints[0].port
    stranger = paramiko.ECDSAKey.generate(bits=256)
    for user, key in (("alice", stranger), ("mallory", user_key)):
        ssh = paramiko.SSHClient()
        ssh.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        with pytest.raises(paramiko.AuthenticationException):
            ssh.connect("127.0.0.1", port=port, username=user, pkey=key, look_for_keys=False, allow_agent=False, timeout=20)
        ssh.close()


def test_pod_environment_and_pinned_host_keys(client, user_key):
    node = create_ready(client, user_key, "pod", "v4-32")
    attrs = client.get_guest_attributes(request={"name": node.name, "query_path": "hostkeys/"}).guest_attributes
    assert len(attrs) == 4
    for worker in range(4):
        published = {i.key: i.value for i in attrs[worker].query_value.items}
        ep = node.network_endpoints[worker]
        # what the server presents, read without trusting it
        t = paramiko.Transport(("127.0.0.1", ep.port))
        t.start_client(timeout=20)
        presented = t.get_remote_server_key()
        t.close()
        assert published == {presented.get_name(): presented.get_base64()}
        with pinned_ssh(client, node, worker, user_key) as ssh:
            code, out, _ = run(ssh, "env")
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        assert env["TPU_WORKER_ID"] == str(worker)
        assert env["TPU_WORKER_HOSTNAMES"].split(",") == [e.ip_address for e in node.network_endpoints]
        assert env["TPU_ACCELERATOR_TYPE"] == "v4-32" and env["TPU_NAME"] == "pod"
        assert env["HOME"].endswith(f"worker-{worker}")
    keys = {base64.b64decode(a.query_value.items[0].value) for a in attrs}
    assert len(keys) == 4  # one key per host
    with pytest.raises(paramiko.SSHException):  # a wrong pin is refused
        wrong = T.Node(node)
        wrong.network_endpoints[0].port = node.network_endpoints[1].port
        pinned_ssh(client, wrong, 0, user_key)


def test_preemption_kills_running_commands_and_listeners(emu, client, user_key):
    node = create_ready(client, user_key, "spot", "v4-32", scheduling_config=T.SchedulingConfig(spot=True))
    ssh = pinned_ssh(client, node, 1, user_key)
    _, out, _ = run(ssh, "nohup setsid sleep 300 >/dev/null 2>&1 & echo $!")
    escaped = int(out)
    stdin, stdout, _ = ssh.exec_command("echo $$; exec sleep 300")
    running = int(stdout.readline())
    assert pid_alive(running) and pid_alive(escaped)

    emu.preempt("spot")
    assert client.get_node(name=node.name).state == S.PREEMPTED
    wait_for(lambda: not pid_alive(running) and not pid_alive(escaped), what="processes killed")
    assert stdout.channel.recv_exit_status() in (-1, 137)  # the session ends with the VM
    assert not any(_port_open(ep.port) for ep in node.network_endpoints)
    assert [f["fault"] for f in emu.faults] == ["preempt"]
    ssh.close()


def test_nohup_outlives_the_session_until_delete(emu, client, user_key):
    node = create_ready(client, user_key, "bg")
    with pinned_ssh(client, node, 0, user_key) as ssh:
        _, out, _ = run(ssh, "nohup sleep 300 > job.log 2>&1 & echo $!")
    pid = int(out)
    with pinned_ssh(client, node, 0, user_key) as ssh:
        assert run(ssh, f"kill -0 {pid} && echo alive")[1] == "alive\n"
    client.delete_node(name=node.name).result(timeout=60)
    wait_for(lambda: not pid_alive(pid), what="background job killed on delete")


def test_kill_host_and_maintenance(emu, client, user_key):
    node = create_ready(client, user_key, "pod", "v4-32")
    emu.kill_host("pod", 2)
    assert not _port_open(node.network_endpoints[2].port)
    got = client.get_node(name=node.name)
    assert got.state == S.READY and got.health == T.Node.Health.TIMEOUT
    with pinned_ssh(client, node, 3, user_key) as ssh:
        assert run(ssh, "echo up")[1] == "up\n"

    with pinned_ssh(client, node, 0, user_key) as ssh:
        _, stdout, _ = ssh.exec_command("echo $$; exec sleep 300")
        pid = int(stdout.readline())
        emu.maintenance_event("pod", duration=0.5)
        got = client.get_node(name=node.name)
        assert got.health == T.Node.Health.UNHEALTHY_MAINTENANCE and "maintenance" in got.health_description
        wait_for(lambda: not pid_alive(pid), what="maintenance kills processes")
        assert stdout.channel.recv_exit_status() == 137
    wait_for(lambda: client.get_node(name=node.name).health == T.Node.Health.HEALTHY, what="HEALTHY after maintenance")
    with pinned_ssh(client, node, 0, user_key) as ssh:
        assert run(ssh, "echo back")[1] == "back\n"


def test_stop_start_keeps_host_keys(client, user_key):
    node = create_ready(client, user_key, "n")
    before = client.get_guest_attributes(request={"name": node.name, "query_path": "hostkeys/"})
    client.stop_node(request={"name": node.name}).result(timeout=60)
    assert not _port_open(node.network_endpoints[0].port)
    node = client.start_node(request={"name": node.name}).result(timeout=60)
    assert client.get_guest_attributes(request={"name": node.name, "query_path": "hostkeys/"}) == before
    with pinned_ssh(client, node, 0, user_key) as ssh:
        assert run(ssh, "echo ok")[1] == "ok\n"


@pytest.mark.slow
def test_v6e_256_all_64_hosts_reachable(client, user_key):
    # how quickly is a figure (target 10 s): bench/emulator_bench.py measures the same path
    from concurrent.futures import ThreadPoolExecutor

    node = create_ready(client, user_key, "big", "v6e-256")
    assert len(node.network_endpoints) == 64

    def worker_id(i: int) -> str:
        with pinned_ssh(client, node, i, user_key) as ssh:
            return run(ssh, "echo $TPU_WORKER_ID")[1].strip()

    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(worker_id, range(64))) == [str(i) for i in range(64)]
