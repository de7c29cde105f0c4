"""`ledger reconcile --once` carries a job as far as it can go without waiting: through the
TPU's creation (an operation under way is awaited), setup and start, and exits while the
job's own command runs (that wait has no known end)."""

from __future__ import annotations

import os
import subprocess
import sys

from ledger.fold import FINISHED, RUNNING
from tests.reconciler.conftest import Harness, job_spec
from tests.reconciler.test_crash import ROOT


def reconcile_once(harness: Harness, *extra: str) -> str:
    s = harness.settings("once")
    proc = subprocess.run(
        [sys.executable, "-m", "ledger", "--store", harness.store_url, "reconcile", "--once", "--interval", "0.3",
         "--tpu-endpoint", s.tpu_endpoint, "--ssh-key", str(s.ssh_key), "--log-dir", str(s.log_dir),
         "--id", "once", "--lease-ttl", "0", *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_one_call_goes_past_provisioning_to_running(harness: Harness):
    go = harness.tmp / "go"
    harness.submit("fay/once", job_spec(f"while [ ! -e {go} ]; do sleep 0.1; done; echo done"))
    archive = harness.tmp / "job-logs"
    out = reconcile_once(harness, "--timeout", "120", "--log-archive", str(archive))
    job = harness.job("fay/once")
    assert job.state == RUNNING, (job.state, out)
    assert harness.types("fay/once") == ["submitted", "provisioning", "provisioned", "setup_started", "setup_done", "started"]
    # Later calls pick it up where it stands: finished, then the TPU released.
    go.touch()
    for _ in range(10):  # the command ends within a moment of `go`; a call sees it or not yet
        reconcile_once(harness, "--log-archive", str(archive))
        job = harness.job("fay/once")
        if job.terminal:
            break
    assert job.state == FINISHED and job.tpu is None, (job.state, harness.types("fay/once"))
    harness.verify()
    # Every call collected what its probes fetched: the output is in the archive, whole.
    assert (archive / "fay" / "once" / "1" / "output_worker_0.log").read_text() == "done\n"
    assert (archive / "fay" / "once" / "1" / "status_worker_0.json").exists()


def test_a_slow_creation_is_awaited_within_the_timeout(harness: Harness):
    harness.emu.slow_creations(2.0)
    harness.submit("fay/slow", job_spec("sleep 5"))
    reconcile_once(harness, "--timeout", "120")
    assert harness.job("fay/slow").state == RUNNING
