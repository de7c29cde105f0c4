"""The chaos harness in CI: the real watcher and reconcilers as processes, kill -9'd, with
preemptions, host kills, capacity drops and failed operations on the TPU emulator, and the
invariants checked afterwards (never timings: those are figures in docs/reliability.md).

Two short runs (about 65 s each): one reconciler on SQLite; two on PostgreSQL sharing
the jobs through leases. `make chaos` runs the long ones.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator import Emulator
from emulator.control import ControlClient
from ledger.app.chaos.report import render
from ledger.app.chaos.run import run_chaos, services
from ledger.app.chaos.sampler import Sampler, double_provisioned
from ledger.app.chaos.scenario import KINDS, JobPlan, Scenario, plan
from ledger.app.chaos.world import ZONE, make_world, work_left
from ledger.app.cli import cli
from tests.postgres.conftest import _admin_url

# Short enough for CI (about 65 s a run), long enough for every kind of fault to land.
SHORT = {"duration": 30.0, "jobs": 3, "job_work": (0.2, 0.4), "settle": 150.0, "observe": 5.0}


@pytest.fixture
def chaos_pg() -> str:
    """The PostgreSQL server the run makes its ledger schema in (dropped afterwards)."""
    return _admin_url()


def _check(result, lines: list[str]) -> None:
    figures = render(result) + "\n" + "\n".join(lines[-30:])
    print(figures)  # `pytest -s` shows the run's figures
    # The run was not vacuous: every job arrived, and the faults really happened.
    assert result.jobs["missing"] == [], figures
    assert result.faults["kill_reconciler"]["applied"] >= 3, figures
    assert result.faults["preempt"]["applied"] + result.faults["kill_host"]["applied"] >= 1, figures
    assert result.samples > 20, figures
    assert result.jobs["attempts"].get("chaos/j02", 0) >= 1, figures  # the multislice job ran
    # The invariants.
    assert result.double_provisioned_samples == 0, figures
    assert result.orphan_tpu_seconds == 0 and result.orphan_nodes == [], figures
    assert result.verify["ok"], figures
    assert result.jobs["stuck"] == {}, figures
    assert result.last_fault_to_settled_s is not None, figures
    assert result.broken() == [], figures


def test_the_schedule_is_seeded_and_bounded_by_the_window():
    s = Scenario(duration=60.0, seed=3, jobs=5)
    a, b = plan(s), plan(s)
    assert a == b
    assert plan(Scenario(duration=60.0, seed=4, jobs=5)) != a
    assert {f.kind for f in a.faults} == set(KINDS)
    assert all(0 <= f.at < s.duration for f in a.faults)
    assert all(f.at + f.lasts <= s.duration for f in a.faults if f.kind == "capacity_drop")
    kills = sorted(f.at for f in a.faults if f.kind == "kill_reconciler")
    assert all(3.0 <= y - x <= 8.0 for x, y in zip(kills, kills[1:], strict=False))
    assert len(a.jobs) == 5 and all(j.batch < len(a.batches) for j in a.jobs)
    # spot capacity comes and goes inside the window, and is back at its end
    assert a.capacity and all(0 <= step["at"] < s.duration for step in a.capacity) and a.capacity[-1]["chips"] is None


@pytest.mark.timeout(400)
def test_chaos_one_reconciler_on_sqlite(tmp_path: Path):
    lines: list[str] = []
    result = run_chaos(Scenario(store="sqlite", seed=11, kinds=KINDS, **SHORT), tmp_path / "run",
                       say=lines.append)
    _check(result, lines)


@pytest.mark.timeout(400)
def test_chaos_two_reconcilers_sharing_leases_on_postgres(tmp_path: Path, chaos_pg: str):
    lines: list[str] = []
    # Failed creations stay with the SQLite run: each costs the reconciler about 40 s to notice
    # and retry, which CI's time budget pays for once.
    kinds = tuple(k for k in KINDS if k != "fail_creation")
    result = run_chaos(Scenario(store="postgres", reconcilers=2, seed=12, kinds=kinds, **SHORT), tmp_path / "run",
                       pg_url=chaos_pg, say=lines.append)
    assert result.processes["reconciler-1"]["kills"] >= 1  # both members were killed
    _check(result, lines)
    # The schema is dropped, its events exported first: a sound ledger again once imported.
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    imported = CliRunner().invoke(cli, ["--store", copy, "import", str(tmp_path / "run" / "ledger.jsonl")])
    assert imported.exit_code == 0, imported.output
    checked = CliRunner().invoke(cli, ["--store", copy, "verify", "--json"])
    assert checked.exit_code == 0 and json.loads(checked.output)["events"] == result.verify["events"], checked.output


@pytest.mark.timeout(300)
def test_a_failed_delete_during_a_reapply_never_leaves_two_live_tpus(tmp_path: Path):
    """One running job; the next operation is armed to fail, then its host is killed: the
    reconciler's recovery deletes the TPU (that delete fails) and creates a new one."""
    s = Scenario(duration=60.0, jobs=1, kinds=())
    world = make_world(tmp_path / "run", "sqlite")
    try:
        with Emulator(state_dir=tmp_path / "run" / "emulator") as emu:
            sup = services(s, world, emu.endpoint)
            sampler = Sampler(emu.endpoint, (ZONE,)).start()
            control = ControlClient(emu.control_url)
            sup.start_all()
            try:
                world.push_jobs([JobPlan("j00", seconds=120, batch=0)], max_restarts=5, branch="one")
                deadline = time.time() + 120
                while not (ready := [n.name for n in (sampler.latest() or sampler.take()).nodes if n.state == "READY"]):
                    assert time.time() < deadline, "the job never got a READY TPU"
                    time.sleep(0.5)
                time.sleep(3.0)  # set up and started
                control.fail_next_operation("INTERNAL", "chaos: this delete fails")
                control.kill_host(ready[0], 0)
                time.sleep(25.0)  # lost host seen, recovery, orphan collection (grace 5 s)
            finally:
                sampler.stop()
                sup.stop_all()
            faults = [json.loads(line) for line in (emu.state_dir / "faults.jsonl").read_text().splitlines()]
    finally:
        world.close()
    assert any(f["fault"] == "operation_failed" and f.get("verb") == "delete" for f in faults), faults  # it landed
    doubles, examples = double_provisioned(sampler.samples)
    assert doubles == 0, examples


def test_the_settle_time_counts_the_work_a_job_has_left(tmp_path: Path):
    """A job the faults set back runs its remaining work after the window: it is stuck only
    when that work and the settle time are both spent (a run called a running job stuck)."""
    jobs = [JobPlan(name="j00", seconds=303, batch=0), JobPlan(name="j01", seconds=40, batch=0),
            JobPlan(name="j02", seconds=90, batch=0)]
    (tmp_path / "j00").mkdir()
    (tmp_path / "j00" / "step").write_text("36\n")
    (tmp_path / "j01").mkdir()
    (tmp_path / "j01" / "step").write_text("40\n")
    assert work_left(tmp_path, jobs) == 267  # j02 has no checkpoint yet: 90 left
    assert work_left(tmp_path, jobs[1:2]) == 0
    assert work_left(tmp_path, []) == 0
