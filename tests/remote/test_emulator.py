"""The runner against the TPU emulator's hosts: a v4-32 node is a 4-host pod whose host keys
are pinned from the TPU API's guest attributes, exactly as the reconciler will do it.

The emulator's hosts have no docker, gcsfuse or conda; the ssh module runs for real, and the
docker module (no engine can run here) shows a clean, per-host failure report.
"""

from __future__ import annotations

import time

import paramiko
import pytest
from google.cloud.tpu_v2.types import cloud_tpu as T

from emulator import Emulator, Timings
from reconciler.remote import Host, HostKeyMismatch, RemoteRunner, layout

PARENT = "projects/proj/locations/us-central2-b"
USER = "alice"
JOB = "alice/pod"


@pytest.fixture
def emu_pod(tmp_path):
    key = paramiko.ECDSAKey.generate(bits=256)
    key_path = tmp_path / "id_ecdsa"
    key.write_private_key_file(str(key_path))
    with Emulator(state_dir=tmp_path / "emu", timings=Timings(create=0.1)) as emu:
        client = emu.client()
        try:
            node = T.Node(accelerator_type="v4-32", runtime_version="tpu-ubuntu2204-base",
                          metadata={"ssh-keys": f"{USER}:{key.get_name()} {key.get_base64()} {USER}@ledger"})
            node = client.create_node(parent=PARENT, node_id="pod", node=node).result(timeout=60)
            attrs = client.get_guest_attributes(request={"name": node.name, "query_path": "hostkeys/"}).guest_attributes
            hosts = []
            for w, ep in enumerate(node.network_endpoints):
                item = next(i for i in attrs[w].query_value.items if i.key == "ecdsa-sha2-nistp256")
                hosts.append(Host(w, ep.ip_address, ep.port, USER, host_key=f"{item.key} {item.value}"))
            runner = RemoteRunner(private_key_path=key_path, known_hosts_path=tmp_path / "known_hosts",
                                  log_dir=tmp_path / "logs", username=USER, command_timeout=60, retries=1, backoff=0.1,
                                  secrets_dir=tmp_path / "secrets")
            try:
                yield emu, hosts, runner, tmp_path
            finally:
                runner.close()
        finally:
            client.transport.close()


def wait_for(fn, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := fn():
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s")


def exited(runner, attempt, hosts):
    st = runner.probe(JOB, attempt, hosts)
    return st if all(s.state == "exited" for s in st.values()) else None


def test_setup_in_parallel_and_clean_failure_report(emu_pod):
    emu, hosts, runner, tmp = emu_pod
    (tmp / "secrets" / "alice").mkdir(parents=True)
    (tmp / "secrets" / "alice" / "id_pod").write_text("POD KEY\n")
    (tmp / "secrets" / "alice" / "id_pod.pub").write_text("ecdsa-sha2-nistp256 AAAA pod\n")
    spec = {"setup": {"modules": ["ssh", "command"]},
            "ssh": {"identities": [{"private_key": "secret://id_pod", "public_key": "id_pod.pub", "config_entry": "Host 127.*\n  User alice\n"}]}}
    rep = runner.setup(JOB, 1, hosts, spec)
    assert rep.ok and rep.outcomes == {w: {"ssh": "done"} for w in range(4)}
    assert runner.setup(JOB, 1, hosts, spec).outcomes == {w: {"ssh": "skipped"} for w in range(4)}
    for h in hosts:
        assert runner.run(h, 'cat "$HOME/.ssh/id_pod"').stdout == b"POD KEY\n"
    spec = {"setup": {"modules": ["docker"]}, "docker": {"image": "img:1"}}
    rep = runner.setup(JOB, 1, hosts, spec, workers=[1, 3])
    assert sorted(w for w, m, _ in rep.failures) == [1, 3]
    # No Docker engine here (at most a client without a daemon): the pull fails on each host.
    assert all(m == "docker" and "pull image exited" in msg for _, m, msg in rep.failures)
    assert "FAILED: pull image" in layout.setup_log(tmp / "logs", JOB, 1, "docker", 3).read_text()


def test_command_on_all_and_on_worker_zero(emu_pod):
    emu, hosts, runner, tmp = emu_pod
    spec = {"setup": {"modules": ["command"]},
            "command": {"cmd": 'echo "w=$LEDGER_WORKER_ID tpu=$TPU_WORKER_ID"; exit $((10 + TPU_WORKER_ID))', "workers": "all", "env": {}}}
    pids = runner.start(JOB, 1, hosts, spec, extra_args=[], resume=False)
    assert sorted(pids) == [0, 1, 2, 3]
    st = wait_for(lambda: exited(runner, 1, hosts))
    assert {w: s.exit_code for w, s in st.items()} == {0: 10, 1: 11, 2: 12, 3: 13}
    for w in range(4):
        assert layout.output_log(tmp / "logs", JOB, 1, w).read_text() == f"w={w} tpu={w}\n"
    spec["command"]["workers"] = [0]
    assert list(runner.start(JOB, 2, hosts, spec, extra_args=[], resume=True)) == [0]
    st = wait_for(lambda: (s := runner.probe(JOB, 2, hosts)) and s[0].state == "exited" and s)
    assert st[0].exit_code == 10 and {st[w].state for w in (1, 2, 3)} == {"gone"}


def test_incremental_output_lost_host_and_stop(emu_pod):
    emu, hosts, runner, tmp = emu_pod
    spec = {"setup": {"modules": ["command"]},
            "command": {"cmd": "echo start; while [ ! -e go ]; do sleep 0.05; done; echo 'TPU is being preempted'; sleep 300",
                        "workers": "all", "env": {}}}
    runner.start(JOB, 1, hosts, spec, extra_args=[], resume=False)
    wait_for(lambda: all(s.output_bytes == 6 for s in runner.probe(JOB, 1, hosts).values()))
    assert layout.output_log(tmp / "logs", JOB, 1, 2).read_text() == "start\n"
    runner.run(hosts[2], f'touch "$HOME"/{layout.worker_rel(JOB, 2)}/work/go')
    st = wait_for(lambda: (s := runner.probe(JOB, 1, hosts)) and s[2].matches and s)
    assert st[2].kinds == ["preempted"] and st[2].state == "running"
    emu.kill_host("pod", 1)
    st = runner.probe(JOB, 1, hosts)
    assert st[1].state == "gone" and st[1].error
    assert {st[w].state for w in (0, 2, 3)} == {"running"}
    alive = [h for h in hosts if h.worker != 1]
    # Its TPU is deleted next (a release, a reapply): one dial a host, the lost one not retried.
    stopped = runner.stop(JOB, 1, hosts, grace=5, once=True)
    assert {w: e for w, e in stopped.items() if w != 1} == {0: None, 2: None, 3: None}
    assert "after 1 tries" in stopped[1] or "next try in" in stopped[1], stopped[1]
    st = runner.probe(JOB, 1, alive)
    assert {s.exit_code for s in st.values()} == {143}


def test_a_host_key_other_than_the_published_one_is_refused(emu_pod, tmp_path):
    emu, hosts, runner, tmp = emu_pod
    other = paramiko.ECDSAKey.generate(bits=256)
    h = hosts[0]
    wrong = Host(h.worker, h.address, h.port, h.username, host_key=f"{other.get_name()} {other.get_base64()}")
    with pytest.raises(HostKeyMismatch):
        runner.run(wrong, "true")
