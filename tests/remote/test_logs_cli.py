"""`ledger logs` over the log directory a real runner filled from a real sshd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB = "carol/logs"


def ledger(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ledger", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_logs_shows_output_setup_and_json(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    hosts = pod.hosts[:2]
    spec = {"setup": {"modules": ["docker", "command"]}, "docker": {"image": "img"},
            "command": {"cmd": "echo hello from $LEDGER_WORKER_ID", "workers": "all", "env": {}}}
    assert r.setup(JOB, 1, hosts, spec).ok
    spec["setup"]["modules"] = ["command"]
    r.start(JOB, 1, hosts, spec, extra_args=[], resume=False)
    wait_for(lambda: all(s.state == "exited" for s in r.probe(JOB, 1, hosts).values()))
    logs = str(tmp_path / "logs")

    out = ledger("logs", JOB, "--log-dir", logs, "-w", "1")
    assert out.returncode == 0 and out.stdout == "hello from 1\n"
    out = ledger("logs", JOB, "--log-dir", logs, "--setup")
    assert "==> docker_worker_0.log <==" in out.stdout and out.stdout.endswith("hello from 0\n")
    data = json.loads(ledger("logs", JOB, "--log-dir", logs, "--json").stdout)
    assert data["output"] == "hello from 0\n" and data["status"]["exit_code"] == 0 and "docker" in data["setup_logs"]

    bad = ledger("logs", "carol/nope", "--log-dir", logs)
    assert bad.returncode == 1 and bad.stderr.startswith("error: no logs for job") and "Traceback" not in bad.stderr
    bad = ledger("logs", JOB, "--log-dir", logs, "--attempt", "7")
    assert bad.returncode == 1 and "attempts with logs: 1" in bad.stderr


def test_follow_streams_until_the_command_ends(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    h = pod.hosts[:1]
    spec = {"setup": {"modules": []}, "command": {"cmd": "echo one; while [ ! -e go ]; do sleep 0.05; done; echo two", "workers": "all", "env": {}}}
    r.start(JOB, 1, h, spec, extra_args=[], resume=False)
    wait_for(lambda: r.probe(JOB, 1, h)[0].output_bytes == 4)
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "logs", JOB, "--log-dir", str(tmp_path / "logs"), "--follow", "--interval", "0.1"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "one\n"  # printed while the command still runs
        assert proc.poll() is None
        r.run(h[0], 'touch "$HOME"/.tpu-ledger/jobs/carol/logs/worker-0/work/go')
        wait_for(lambda: r.probe(JOB, 1, h)[0].state == "exited")
        assert proc.stdout.readline() == "two\n"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
