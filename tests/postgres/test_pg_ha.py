"""High availability on one PostgreSQL ledger: two reconcilers; the one acting on a job is
killed with SIGKILL right after it created the TPU (before recording the outcome). The
other, running all along, keeps its hands off the fresh intent, then takes it over, finds
the TPU instead of creating a second one, and finishes the job; the ledger verifies."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emulator import Emulator
from ledger.commands.migrate import verify_chain
from ledger.fold import FINISHED
from ledger.store import open_store
from reconciler.wiring import build
from tests.reconciler.conftest import Harness, job_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_harness(tmp_path: Path, pg_url: str):
    with Emulator(state_dir=tmp_path / "emulator") as emu:
        h = Harness(emu, pg_url, tmp_path)
        try:
            yield h
        finally:
            h.close()


@pytest.mark.slow
def test_a_killed_reconcilers_job_is_finished_by_the_other_without_a_second_tpu(pg_harness: Harness):
    h = pg_harness
    h.submit("nia/ha", job_spec("sleep 1; echo survived"))
    s = h.settings("alpha")
    alpha = subprocess.Popen(
        [sys.executable, "-m", "ledger", "--store", h.store_url, "reconcile", "--interval", "0.3",
         "--tpu-endpoint", s.tpu_endpoint, "--ssh-key", str(s.ssh_key), "--log-dir", str(s.log_dir), "--id", "alpha"],
        cwd=ROOT, env={**os.environ, "LEDGER_FAULT_CRASH": "provision:effect", "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        # alpha records its intent first; beta starts while alpha is mid-action.
        h.wait("nia/ha", lambda j: j.pending_action is not None, timeout=90)
        assert h.job("nia/ha").pending_action["holder"] == "alpha"
        beta = build(dataclasses.replace(h.settings("beta"), intent_timeout_s=3.0))
        thread = threading.Thread(target=beta.run, kwargs={"stop": h.stop}, daemon=True)
        thread.start()
        h.reconcilers.append(beta)
        h.threads.append(thread)
        out, _ = alpha.communicate(timeout=90)
        assert alpha.returncode == -9, out.decode()[-2000:]  # killed itself after creating the TPU
    finally:
        if alpha.poll() is None:
            alpha.kill()
            alpha.wait()
    h.wait("nia/ha", lambda j: j.state == FINISHED and j.tpu is None, timeout=120)
    types = h.types("nia/ha")
    assert types.count("provisioning") == 1 and types.count("started") == 1, types
    assert types[-2:] == ["finished", "released"]
    store = open_store(h.store_url, create=False)
    try:
        events = store.read_stream("nia/ha")
        actors = {e.actor.get("name") for e in events if e.type in ("action_intent", "action_outcome")}
        assert actors == {"alpha", "beta"}  # alpha's intent, beta's takeover
        provisions = [e.data["holder"] for e in events if e.type == "action_intent" and e.data["action"] == "provision"]
        assert provisions == ["alpha"]  # beta never asked for a TPU of its own
        verify_chain(store)  # no lost event, no hole, every hash right
    finally:
        store.close()
    deadline = time.monotonic() + 20
    while h.nodes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert h.nodes() == []  # the one TPU was released, and there never was a second
    assert "survived" in h.output("nia/ha", 1)
