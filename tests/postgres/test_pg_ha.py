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
from ledger.app.commands.migrate import verify_chain
from ledger.app.wiring import build
from ledger.fold import FINISHED
from ledger.store import open_leases, open_store
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


@pytest.mark.slow
def test_jobs_spread_over_two_reconcilers_and_a_dead_ones_jobs_move_to_the_other(pg_harness: Harness):
    """Leases spread the jobs; after SIGKILL of one reconciler its running jobs are finished by
    the other once its leases lapse (ttl 2 s here), with no second TPU and no lost event."""
    h = pg_harness
    jobs = [f"team/j{i}" for i in range(6)]
    s = h.settings("gamma")
    gamma = subprocess.Popen(
        [sys.executable, "-m", "ledger", "--store", h.store_url, "reconcile", "--interval", "0.3", "--lease-ttl", "2",
         "--tpu-endpoint", s.tpu_endpoint, "--ssh-key", str(s.ssh_key), "--log-dir", str(s.log_dir), "--id", "gamma"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        delta = build(dataclasses.replace(h.settings("delta"), lease_ttl_s=2.0))
        thread = threading.Thread(target=delta.run, kwargs={"stop": h.stop}, daemon=True)
        thread.start()
        h.reconcilers.append(delta)
        h.threads.append(thread)
        # New jobs spread over the live members (running ones are not rebalanced): wait
        # until both have joined, then submit.
        leases = open_leases(h.store_url)
        deadline = time.monotonic() + 60
        while {x.holder for x in leases.all() if x.name.startswith("member:") and x.live} != {"gamma", "delta"}:
            assert time.monotonic() < deadline, "gamma never joined"
            time.sleep(0.1)
        leases.close()
        time.sleep(1.0)  # each member refreshes its view of the others every ttl/3
        for job in jobs:
            h.submit(job, job_spec("sleep 6; echo done"))
        for job in jobs:
            h.wait(job, lambda j: j.state == "running", timeout=90)
        starters = {job: next(e.actor["name"] for e in open_store(h.store_url).read_stream(job) if e.type == "started")
                    for job in jobs}
        assert set(starters.values()) == {"gamma", "delta"}, starters  # the work was spread
        gamma.kill()
        gamma.wait(30)
        # delta takes the dead member's jobs over once their leases expire (how soon is a
        # figure: bench/lease_bench.py, "holder killed -> lease taken")
        for job in jobs:
            h.wait(job, lambda j: j.state == FINISHED and j.tpu is None, timeout=90)
    finally:
        if gamma.poll() is None:
            gamma.kill()
            gamma.wait()
    for job in jobs:
        types = h.types(job)
        assert types.count("provisioning") == 1 and types.count("started") == 1, (job, types)
    store = open_store(h.store_url, create=False)
    try:
        verify_chain(store)
    finally:
        store.close()
