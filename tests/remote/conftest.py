"""Fixtures: a real OpenSSH sshd on 127.0.0.2 serving a "pod" of hosts.

One sshd listens on one free port per worker; `Match LocalPort` + `SetEnv` gives each worker
its own $HOME (the runner keeps everything under $HOME) and a PATH whose first directory
holds stand-ins for `docker`, `gcsfuse` and `conda` (none of them can run on this machine):
they record their argv as JSON lines in $HOME/<tool>.argv and mimic just enough behaviour
(an image present after `pull`, `run` executing its `bash -c` payload).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.remote import Host, RemoteRunner

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"

STANDIN = r'''#!/usr/bin/env python3
"""Stand-in for `{tool}`: records argv in $HOME/{tool}.argv, then mimics the real tool."""
import json, os, sys
home = os.environ["HOME"]
argv = sys.argv[1:]
with open(os.path.join(home, "{tool}.argv"), "a") as f:
    f.write(json.dumps(argv) + "\n")
tool = "{tool}"
state = os.path.join(home, ".standin-" + tool)
os.makedirs(state, exist_ok=True)
def marker(name):
    import hashlib
    return os.path.join(state, hashlib.sha256(name.encode()).hexdigest())
if tool == "docker":
    if argv[:2] == ["image", "inspect"]:
        sys.exit(0 if os.path.exists(marker(argv[2])) else 1)
    if argv[:1] == ["pull"]:
        open(marker(argv[1]), "w").close(); sys.exit(0)
    if argv[:1] == ["run"]:
        i = argv.index("bash")
        os.execvp("bash", argv[i:])
    sys.exit(0)
if tool == "conda":
    if argv[:2] == ["env", "update"]:
        open(marker(argv[argv.index("--name") + 1]), "w").close(); sys.exit(0)
    if argv[:1] == ["run"]:
        name = argv[argv.index("-n") + 1]
        if not os.path.exists(marker(name)):
            sys.exit(1)
        rest = argv[argv.index("-n") + 2:]
        if rest == ["true"]:
            sys.exit(0)
        os.execvp(rest[0], rest)
    sys.exit(0)
sys.exit(0)  # gcsfuse: mounting is out of reach here; the argv is what we test
'''


def free_port(addr: str = "127.0.0.2") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def ssh_keygen(path: Path, kind: str = "ecdsa") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return path


@dataclass
class Pod:
    root: Path
    hosts: list[Host]
    homes: dict[int, Path]
    client_key: Path
    host_key_pub: str  # "<type> <base64>" of the sshd's host key
    proc: subprocess.Popen | None = None
    config: Path | None = None
    extra: list = field(default_factory=list)

    def home(self, worker: int) -> Path:
        return self.homes[worker]

    def argv(self, worker: int, tool: str) -> list[list[str]]:
        import json

        p = self.homes[worker] / f"{tool}.argv"
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []

    def kill_jobs(self) -> None:
        """Kill every process group a test started on these hosts, even if the test failed."""
        for home in self.homes.values():
            for pidfile in home.glob(".tpu-ledger/jobs/**/attempts/*/pid"):
                with contextlib.suppress(ValueError, OSError):
                    os.killpg(int(pidfile.read_text()), 9)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _start_sshd(root: Path, n: int, host_key: Path, authorized: Path, standins: Path) -> tuple[subprocess.Popen, dict[int, int], dict[int, Path]]:
    ports = {i: free_port() for i in range(n)}
    homes = {}
    lines = [
        *(f"ListenAddress 127.0.0.2:{p}" for p in ports.values()),
        f"HostKey {host_key}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        f"AuthorizedKeysFile {authorized}",
        "PidFile none",
        "MaxStartups 200",
        "MaxSessions 200",
        "LogLevel ERROR",
        "PermitRootLogin prohibit-password",
    ]
    for i, p in ports.items():
        h = root / f"home-{i}"
        h.mkdir()
        homes[i] = h
        lines += [f"Match LocalPort {p}", f"  SetEnv HOME={h} PATH={standins}:/usr/local/bin:/usr/bin:/bin"]
    cfg = root / "sshd_config"
    cfg.write_text("\n".join(lines) + "\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = open(root / "sshd.log", "ab")  # noqa: SIM115 - kept open for the process's life
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    pending = set(ports.values())
    while pending and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(root / 'sshd.log').read_text()[-2000:]}")
        for p in list(pending):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.2", p), timeout=1):
                pending.discard(p)
        time.sleep(0.05)
    if pending:
        proc.kill()
        raise RuntimeError(f"sshd did not listen on {sorted(pending)}")
    return proc, ports, homes


@pytest.fixture(scope="session")
def ssh_material(tmp_path_factory):
    if not os.path.exists(SSHD):
        pytest.skip("OpenSSH sshd is not installed (scripts/test-services.sh installs openssh-server)")
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed (package openssh-client)")
    d = tmp_path_factory.mktemp("sshkeys")
    client = ssh_keygen(d / "client")
    host = ssh_keygen(d / "hostkey")
    auth = d / "authorized_keys"
    auth.write_text((d / "client.pub").read_text())
    standins = d / "standins"
    standins.mkdir()
    for tool in ("docker", "gcsfuse", "conda"):
        p = standins / tool
        p.write_text(STANDIN.replace("{tool}", tool).replace("/usr/bin/env python3", sys.executable))
        p.chmod(0o755)
    return {"client": client, "hostkey": host, "authorized": auth, "standins": standins}


@pytest.fixture(scope="session")
def other_host_key(ssh_material) -> str:
    """A host key no server here uses, as "<type> <base64>"."""
    return " ".join(ssh_keygen(ssh_material["hostkey"].parent / "otherkey").with_suffix(".pub").read_text().split()[:2])


@pytest.fixture
def make_pod(tmp_path, ssh_material):
    pods: list[Pod] = []

    def make(n: int = 4) -> Pod:
        root = tmp_path / f"pod{len(pods)}"
        root.mkdir()
        proc, ports, homes = _start_sshd(root, n, ssh_material["hostkey"], ssh_material["authorized"], ssh_material["standins"])
        pub = " ".join((ssh_material["hostkey"].with_suffix(".pub")).read_text().split()[:2])
        user = getpass.getuser()
        hosts = [Host(i, "127.0.0.2", ports[i], user) for i in range(n)]
        pod = Pod(root, hosts, homes, ssh_material["client"], pub, proc, root / "sshd_config")
        pods.append(pod)
        return pod

    yield make
    for p in pods:
        p.stop()
        p.kill_jobs()


@pytest.fixture
def pod(make_pod) -> Pod:
    return make_pod(4)


@pytest.fixture
def runner_for(tmp_path):
    runners: list[RemoteRunner] = []

    def make(pod: Pod, **kw) -> RemoteRunner:
        kw.setdefault("connect_timeout", 10)
        kw.setdefault("command_timeout", 60)
        kw.setdefault("backoff", 0.1)
        r = RemoteRunner(
            private_key_path=pod.client_key, known_hosts_path=tmp_path / "known_hosts",
            log_dir=tmp_path / "logs", username=pod.hosts[0].username, secrets_dir=tmp_path / "secrets", **kw,
        )
        runners.append(r)
        return r

    yield make
    for r in runners:
        r.close()


@pytest.fixture
def wait_for():
    return _wait_for


def _wait_for(fn, timeout: float = 30, interval: float = 0.05):
    """Poll `fn` until it returns something truthy; fail with its last value at the deadline."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s; last value: {last!r}")
