"""The reconciler killed with SIGKILL between an intent and its outcome, then restarted:
no second TPU, no lost event, the job still ends right, and the ledger verifies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger.fold import FINISHED
from tests.reconciler.conftest import Harness, job_spec

ROOT = Path(__file__).resolve().parents[2]


def run_until_killed(harness: Harness, crash_at: str) -> None:
    s = harness.settings("crashy")
    env = {**os.environ, "LEDGER_FAULT_CRASH": crash_at, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledger", "--store", harness.store_url, "reconcile", "--interval", "0.3",
         "--tpu-endpoint", s.tpu_endpoint, "--ssh-key", str(s.ssh_key), "--log-dir", str(s.log_dir), "--id", "crashy"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the reconciler never reached {crash_at}") from None
    assert proc.returncode == -9, out.decode()[-2000:]


@pytest.mark.parametrize("crash_at", [
    "provision:intent", "provision:effect", "setup:effect", "start:intent", "start:effect", "release:effect",
])
def test_killed_between_intent_and_outcome_then_restarted(harness: Harness, crash_at: str):
    harness.submit("nia/crash", job_spec("sleep 1; echo survived"))
    run_until_killed(harness, crash_at)
    job = harness.job("nia/crash")
    assert job.pending_action is not None and job.pending_action["action"] == crash_at.split(":")[0]
    harness.start("crashy")  # the same id: its own unfinished intent is resolved at once
    harness.wait("nia/crash", lambda j: j.state == FINISHED and j.tpu is None, timeout=90)
    types = harness.types("nia/crash")
    assert types.count("provisioning") == 1 and types.count("started") == 1, types
    assert types[-2:] == ["finished", "released"]
    harness.verify()
    deadline = time.monotonic() + 20
    while harness.nodes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert harness.nodes() == []
    if crash_at == "start:effect":
        assert "survived" in harness.output("nia/crash", 1)
