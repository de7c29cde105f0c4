"""Remote runner figures: parallel setup of a 16-host pod vs one host, and a 16-host probe.

    python bench/remote_bench.py [--target emulator|sshd] [--hosts 16] [--reps 5] [--probes 20] [--json]

emulator: a `ledger emulator` subprocess serves a v4-128 node (16 hosts), host keys pinned
from guest attributes. sshd: one real OpenSSH sshd on 127.0.0.2 with one port (and $HOME)
per worker. Setup = the ssh module (7 SSH round trips incl. 3 uploads) on fresh stamps,
connections included (a fresh runner each time, as right after provisioning). Probe = one
round of status + output fetch on warm connections while the command runs on every host.
Targets: setup(16) <= 1.5 x setup(1); probe(16) <= 200 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.remote import Host, RemoteRunner  # noqa: E402

JOB = "bench/remote"
# A stand-in `docker` for the sshd target: `pull` waits, as a registry download would.
DOCKER_STANDIN = """#!/bin/sh
case "$1" in image) exit 1;; pull) sleep "${LEDGER_BENCH_PULL:-1}";; esac
"""


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def emulator_pod(tmp: Path, n: int):
    import grpc
    import paramiko
    from google.cloud.tpu_v2 import TpuClient
    from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport
    from google.cloud.tpu_v2.types import cloud_tpu as T

    from ledger.tpu_types import lookup

    accel = {1: "v4-8", 2: "v4-16", 4: "v4-32", 8: "v4-64", 16: "v4-128", 32: "v4-256"}[n]
    assert lookup(accel).hosts == n
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "emulator", "--state-dir", str(tmp / "emu"), "--create-delay", "0.1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        endpoint = None
        for line in proc.stdout:  # type: ignore[union-attr]
            if m := re.match(r"export LEDGER_TPU_ENDPOINT=(\S+)", line):
                endpoint = m.group(1)
                break
        assert endpoint, "emulator did not start"
        key = paramiko.ECDSAKey.generate(bits=256)
        key.write_private_key_file(str(tmp / "id"))
        channel = grpc.insecure_channel(endpoint)
        client = TpuClient(transport=TpuGrpcTransport(channel=channel))
        node = T.Node(accelerator_type=accel, runtime_version="tpu-ubuntu2204-base",
                      metadata={"ssh-keys": f"bench:{key.get_name()} {key.get_base64()} bench"})
        node = client.create_node(parent="projects/p/locations/us-central2-b", node_id="bench", node=node).result(timeout=120)
        attrs = client.get_guest_attributes(request={"name": node.name, "query_path": "hostkeys/"}).guest_attributes
        hosts = []
        for w, ep in enumerate(node.network_endpoints):
            item = next(i for i in attrs[w].query_value.items if i.key == "ecdsa-sha2-nistp256")
            hosts.append(Host(w, ep.ip_address, ep.port, "bench", host_key=f"{item.key} {item.value}"))
        channel.close()
        yield hosts, tmp / "id"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_listening(addr: str, ports: list[int], timeout: float) -> None:
    """Until every port accepts a connection (OSError past the timeout)."""
    deadline = time.monotonic() + timeout
    for p in ports:
        while True:
            try:
                socket.create_connection((addr, p), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@contextlib.contextmanager
def sshd_pod(tmp: Path, n: int, pull_seconds: float = 0.0):
    import getpass

    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        raise SystemExit("sshd not installed: apt-get install openssh-server")
    for name in ("id", "hostkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(tmp / name)], check=True)
    ports = [free_port("127.0.0.2") for _ in range(n)]
    lines = [*(f"ListenAddress 127.0.0.2:{p}" for p in ports), f"HostKey {tmp / 'hostkey'}", "PasswordAuthentication no",
             "UsePAM no", "StrictModes no", f"AuthorizedKeysFile {tmp / 'id.pub'}", "PidFile none",
             "MaxStartups 200", "MaxSessions 200", "LogLevel ERROR"]
    for i, p in enumerate(ports):
        (tmp / f"home-{i}").mkdir()
        lines += [f"Match LocalPort {p}", f"  SetEnv HOME={tmp / f'home-{i}'} PATH={tmp / 'bin'}:/usr/bin:/bin LEDGER_BENCH_PULL={pull_seconds}"]
    (tmp / "bin").mkdir()
    (tmp / "bin" / "docker").write_text(DOCKER_STANDIN)
    (tmp / "bin" / "docker").chmod(0o755)
    (tmp / "sshd_config").write_text("\n".join(lines) + "\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(tmp / "sshd_config")], stderr=subprocess.DEVNULL)
    try:
        wait_listening("127.0.0.2", ports, 20)
        user = getpass.getuser()
        yield [Host(i, "127.0.0.2", p, user) for i, p in enumerate(ports)], tmp / "id"
    finally:
        proc.terminate()
        proc.wait(20)


def runner(tmp: Path, key: Path, hosts: list[Host]) -> RemoteRunner:
    return RemoteRunner(private_key_path=key, known_hosts_path=tmp / "known_hosts", log_dir=tmp / "logs",
                        username=hosts[0].username, secrets_dir=tmp / "secrets", command_timeout=120, connect_timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=["emulator", "sshd"], default="emulator")
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--warm", action="store_true", help="open the SSH connections before timing setup")
    ap.add_argument("--pull-seconds", type=float, default=0.0,
                    help="sshd target: add a docker module whose (stand-in) pull waits this long on each host")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="remote-bench-") as d:
        tmp = Path(d)
        owner = tmp / "secrets" / JOB.split("/")[0]  # spec files come from the owner's secrets folder
        owner.mkdir(parents=True)
        (owner / "k").write_text("KEY\n")
        (owner / "k.pub").write_text("ecdsa-sha2-nistp256 AAAA bench\n")
        if a.target == "emulator":
            if a.pull_seconds:
                raise SystemExit("--pull-seconds needs --target sshd (the emulator's PATH is fixed)")
            pod = emulator_pod(tmp, a.hosts)
        else:
            pod = sshd_pod(tmp, a.hosts, a.pull_seconds)
        modules = ["ssh", "docker"] if a.pull_seconds else ["ssh"]
        with pod as (hosts, key):
            one, many = [], []
            for rep in range(a.reps):
                for sample, subset in ((one, hosts[:1]), (many, hosts)):
                    spec = {"setup": {"modules": modules}, "docker": {"image": "img"}, "ssh": {"identities": [
                        {"private_key": "k", "public_key": "k.pub", "config_entry": f"Host x{rep}-{len(subset)}\n"}]}}
                    r = runner(tmp, key, hosts)
                    if a.warm:
                        assert not any(r.connect(subset).values())
                    t0 = time.perf_counter()
                    rep_ = r.setup(JOB, rep, subset, spec)
                    sample.append(time.perf_counter() - t0)
                    r.close()
                    assert rep_.ok and all(o == dict.fromkeys(modules, "done") for o in rep_.outcomes.values()), rep_
            r = runner(tmp, key, hosts)
            spec = {"setup": {"modules": []}, "command": {"cmd": "for i in $(seq 1 100000); do echo step $i; sleep 0.05; done", "workers": "all", "env": {}}}
            r.start(JOB, 1, hosts, spec, extra_args=[], resume=False)
            r.probe(JOB, 1, hosts)  # warm
            probes = []
            for _ in range(a.probes):
                t0 = time.perf_counter()
                st = r.probe(JOB, 1, hosts)
                probes.append(time.perf_counter() - t0)
                assert all(s.state == "running" for s in st.values()), st
                time.sleep(0.1)
            r.stop(JOB, 1, hosts, grace=2)
            r.close()
    med1, med16, medp = statistics.median(one), statistics.median(many), statistics.median(probes)
    result = {
        "target": a.target, "hosts": a.hosts, "modules": modules, "pull_seconds": a.pull_seconds, "warm": a.warm, "reps": a.reps, "cpus": os.cpu_count(),
        "setup_one_s": round(med1, 4), "setup_pod_s": round(med16, 4), "setup_ratio": round(med16 / med1, 2),
        "setup_ratio_target": 1.5, "probe_pod_ms": round(medp * 1000, 1),
        "probe_pod_p90_ms": round(sorted(probes)[int(0.9 * (len(probes) - 1))] * 1000, 1), "probe_target_ms": 200,
    }
    if a.json:
        print(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"remote runner, {a.target}, {a.hosts} hosts, setup {'+'.join(modules)}"
                    f"{f' (pull {a.pull_seconds:g} s)' if a.pull_seconds else ''}{' on warm connections' if a.warm else ''}, medians of {a.reps} setups / {a.probes} probes")
    for c in ("figure", "measured", "target"):
        t.add_column(c)
    t.add_row("setup, 1 host", f"{med1 * 1000:.0f} ms", "")
    t.add_row(f"setup, {a.hosts} hosts in parallel", f"{med16 * 1000:.0f} ms", "")
    t.add_row("ratio", f"{med16 / med1:.2f}x", "<= 1.5x")
    t.add_row(f"probe, {a.hosts} hosts (median)", f"{medp * 1000:.0f} ms", "<= 200 ms")
    t.add_row(f"probe, {a.hosts} hosts (p90)", f"{result['probe_pod_p90_ms']:.0f} ms", "")
    Console().print(t)


if __name__ == "__main__":
    main()
