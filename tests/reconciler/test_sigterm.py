"""`ledger reconcile` stopped by SIGTERM (as systemd stops it) while it deletes a TPU (a
release is recorded only once the node is gone): it logs its shutdown as JSON lines,
finishes the action in flight (the outcome is recorded), exits 0, and the ledger verifies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator import Emulator
from emulator.cloud import Timings
from ledger.fold import FINISHED
from tests.processes import service, stop_with_sigterm
from tests.reconciler.conftest import Harness, job_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def slow_delete(tmp_path: Path) -> Iterator[Harness]:
    """The reconciler's harness on an emulator whose deletions take 4 s."""
    with Emulator(state_dir=tmp_path / "emulator", timings=Timings(delete=4.0)) as emu:
        h = Harness(emu, f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path)
        try:
            yield h
        finally:
            h.close()


def test_sigterm_mid_release_logs_the_shutdown_and_finishes_the_action(slow_delete: Harness):
    harness = slow_delete
    harness.submit("ivy/term", job_spec("true"))
    s = harness.settings("termy")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with service([sys.executable, "-m", "ledger", "--store", harness.store_url, "--log-format", "json", "reconcile",
                  "--interval", "0.3", "--tpu-endpoint", s.tpu_endpoint, "--ssh-key", str(s.ssh_key), "--log-dir",
                  str(s.log_dir), "--id", "termy", "--lease-ttl", "0"], cwd=ROOT, env=env) as proc:
        harness.wait("ivy/term", lambda j: (j.pending_action or {}).get("action") == "release", timeout=90)
        out, err = stop_with_sigterm(proc, timeout=90)
    assert proc.returncode == 0, err[-2000:]
    records = [json.loads(line) for line in err.splitlines() if line.strip()]  # every line is one JSON object
    assert all({"time", "level", "component", "message"} <= r.keys() and r["component"] == "reconcile" for r in records)
    messages = [r["message"] for r in records]
    stopping = next(r for r in records if r["message"].startswith("stopping on SIGTERM"))
    assert stopping["signal"] == "SIGTERM" and stopping["in_flight"] == ["ivy/term"], stopping
    assert messages[-1] == "stopped"
    # The delete in flight was finished and recorded before the process ended: no intent left open.
    release = next(r for r in records if r.get("action") == "release")
    assert release["job"] == "ivy/term" and release["attempt"] == 1, release
    assert messages.index(stopping["message"]) < messages.index(release["message"]) < messages.index("stopped")
    job = harness.job("ivy/term")
    assert job.state == FINISHED and job.pending_action is None and job.tpu is None, harness.types("ivy/term")
    assert harness.types("ivy/term")[-1] == "released"
    harness.verify()
    done = subprocess.run([sys.executable, "-m", "ledger", "--store", harness.store_url, "verify"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
