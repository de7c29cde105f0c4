"""Starting and stopping: in-process (20 in a row) and as `ledger emulator` in the foreground."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.cloud import tpu_v2
from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport
from google.cloud.tpu_v2.types import cloud_tpu as T

from emulator import Emulator, Timings
from emulator.pubsub import PUBSUB_EMULATOR
from tests.emulator.conftest import PROJECT, create_ready, pid_alive, pinned_ssh, run, wait_for

pytestmark = pytest.mark.tpu_emulator

REPO = Path(__file__).resolve().parents[2]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _ours_listening(ports: list[int]) -> list[int]:
    """Which of `ports` a socket of this process listens on. Not "does anything answer there":
    other pytest-xdist workers start servers on free ports too, and may get a port this test's
    emulators gave back."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in mine:  # LISTEN, and our socket
                    found.add(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(found & set(ports))


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(") ", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_twenty_emulators_in_a_row_leak_nothing(tmp_path, user_key):
    # one warm-up cycle: gRPC's process-wide machinery starts once and stays
    with Emulator(state_dir=tmp_path / "warm") as emu:
        c = emu.client()
        create_ready(c, user_key, "w")
        c.transport.close()
    threads, fds = threading.active_count(), _fds()
    ports: list[int] = []
    for i in range(20):
        with Emulator(state_dir=tmp_path / f"e{i}", timings=Timings(create=0.05)) as emu:
            ports.extend([emu.port, emu.rest_port, int(emu.control_url.rsplit(":", 1)[1])])
            if i % 5 == 0:  # some with live hosts, a session and a client still open at stop time
                c = emu.client("rest" if i % 10 else "grpc")  # REST: a kept-alive connection
                node = create_ready(c, user_key, "n", "v4-32")
                ports.extend(ep.port for ep in node.network_endpoints)
                ssh = pinned_ssh(c, node, 0, user_key)
                ssh.exec_command("sleep 300")
        if i % 5 == 0:
            ssh.close()
            c.transport.close()
    wait_for(lambda: threading.active_count() <= threads, timeout=20, what=f"threads back to {threads} (now {threading.active_count()})")
    assert _ours_listening(ports) == []
    assert _children(os.getpid()) == []  # the hosts' sshd (and so their ports) are children
    assert _fds() <= fds + 2, "file descriptors leaked"


def _start_cli(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, dict[str, str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledger", "emulator", "--state-dir", str(tmp_path / "state"), "--create-delay", "0.1", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    env: dict[str, str] = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"emulator exited: {proc.stderr.read()}")
        if line.startswith("export "):
            k, v = line[len("export "):].strip().split("=", 1)
            env[k] = v
        if line.startswith("# Ctrl-C"):
            return proc, env
    raise AssertionError("emulator did not print its settings")


def _ledger(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ledger", "emulator", "--state-dir", str(tmp_path / "state"), *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def _rest_get(env: dict[str, str], name: str) -> dict:
    """GET a resource by name at the REST root `ledger emulator` told gcloud to use."""
    with urllib.request.urlopen(f"{env['CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU']}v2/{name}?alt=json", timeout=10) as resp:
        return json.loads(resp.read())


def test_cli_foreground_and_fault_subcommands(tmp_path, user_key):
    proc, env = _start_cli(tmp_path, "--project", PROJECT)
    try:
        assert set(env) == {"LEDGER_TPU_ENDPOINT", "LEDGER_EMULATOR_CONTROL", "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU", "CLOUDSDK_AUTH_DISABLE_CREDENTIALS", "CLOUDSDK_CORE_PROJECT"}
        assert env["CLOUDSDK_CORE_PROJECT"] == PROJECT and env["CLOUDSDK_AUTH_DISABLE_CREDENTIALS"] == "true"
        client = tpu_v2.TpuClient(transport=TpuGrpcTransport(channel=grpc.insecure_channel(env["LEDGER_TPU_ENDPOINT"])))
        node = create_ready(client, user_key, "cli-node", "v4-32")
        # one state behind both surfaces: what gRPC created, REST (gcloud's way in) reads
        got = _rest_get(env, node.name)
        assert got["state"] == "READY" and len(got["networkEndpoints"]) == 4
        ssh = pinned_ssh(client, node, 0, user_key)
        _, out, _ = run(ssh, "nohup sleep 300 >/dev/null 2>&1 & echo $!")
        bg = int(out)

        r = _ledger(tmp_path, "status", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["nodes"][0]["state"] == "READY"
        r = _ledger(tmp_path, "preempt", "nope")
        assert r.returncode == 1 and "not found" in r.stderr and "Traceback" not in r.stderr
        r = _ledger(tmp_path, "capacity", "us-central2-b", "v4", "lots")
        assert r.returncode == 2
        r = _ledger(tmp_path, "preempt", "cli-node")
        assert r.returncode == 0, r.stderr
        assert client.get_node(name=node.name).state == T.Node.State.PREEMPTED
        assert _rest_get(env, node.name)["state"] == "PREEMPTED"
        wait_for(lambda: not pid_alive(bg), what="background job killed by the preemption")
        r = _ledger(tmp_path, "faults", "--json")
        faults = json.loads(r.stdout)
        assert [f["fault"] for f in faults] == ["preempt"] and faults[0]["node"] == node.name

        # a second job survives until SIGTERM stops the emulator
        node2 = create_ready(client, user_key, "cli-2")
        with pinned_ssh(client, node2, 0, user_key) as ssh2:
            _, out, _ = run(ssh2, "nohup setsid sleep 300 >/dev/null 2>&1 & echo $!")
        bg2 = int(out)
        client.transport.close()
        ssh.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    assert rc == 0
    wait_for(lambda: not pid_alive(bg2), what="background job killed when the emulator stops")
    assert not _listening(int(env["LEDGER_TPU_ENDPOINT"].rsplit(":", 1)[1]))
    assert not _listening(int(env["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"].rstrip("/").rsplit(":", 1)[1]))
    assert not (tmp_path / "state" / "emulator.json").exists()
    r = _ledger(tmp_path, "status")
    assert r.returncode == 1 and "no running emulator" in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not PUBSUB_EMULATOR.exists(), reason="the official Pub/Sub emulator is not installed")
def test_cli_with_pubsub_leaves_no_process(tmp_path):
    proc, env = _start_cli(tmp_path, "--pubsub")
    try:
        host = env["PUBSUB_EMULATOR_HOST"]
        assert _listening(int(host.rsplit(":", 1)[1]))
        java = _children(proc.pid)  # the Pub/Sub emulator leads its own process group
        assert java, "Pub/Sub emulator not a child of the CLI"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    wait_for(lambda: not _listening(int(host.rsplit(":", 1)[1])), what="Pub/Sub port closed")
    for pid in java:
        try:
            os.killpg(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive, f"process group {pid} of the Pub/Sub emulator survived"


def test_jobs_of_a_killed_emulator_are_reaped_by_the_next(tmp_path, user_key):
    proc, env = _start_cli(tmp_path)
    try:
        client = tpu_v2.TpuClient(transport=TpuGrpcTransport(channel=grpc.insecure_channel(env["LEDGER_TPU_ENDPOINT"])))
        node = create_ready(client, user_key, "orphan")
        with pinned_ssh(client, node, 0, user_key) as ssh:
            _, out, _ = run(ssh, "nohup setsid sleep 300 >/dev/null 2>&1 & echo $!")
        job = int(out)
        client.transport.close()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no clean-up possible
        proc.wait(30)
    assert pid_alive(job)
    with Emulator(state_dir=tmp_path / "state"):
        wait_for(lambda: not pid_alive(job), what="orphaned job reaped")


def test_cli_with_gcs_serves_the_bucket_the_log_archive_names(tmp_path, monkeypatch):
    """`ledger emulator --gcs B` prints STORAGE_EMULATOR_HOST and a gs:// log archive in B,
    and the official client writes and lists objects there."""
    from reconciler.joblogs import open_archive

    proc, env = _start_cli(tmp_path, "--gcs", "lab-logs")
    try:
        assert env["LEDGER_LOG_ARCHIVE"] == "gs://lab-logs/job-logs"
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", env["STORAGE_EMULATOR_HOST"])
        archive = open_archive(env["LEDGER_LOG_ARCHIVE"])
        assert archive.append("alice/bert/1/output_worker_0.log", 0, b"step 1\n")
        assert archive.read("alice/bert/1/output_worker_0.log") == b"step 1\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert not _listening(int(env["STORAGE_EMULATOR_HOST"].rsplit(":", 1)[1]))
