"""One chaos run: the world, the services, the fault window, settling, and the report.

    1. lay a jobs hub and a ledger; start the TPU emulator (in this process);
    2. start `ledger watch` and N `ledger reconcile` as child processes;
    3. push the jobs in batches and apply the faults of the seeded schedule, on time;
    4. close the window: capacity back, no more faults; any process that exited is restarted;
    5. wait until every job is terminal with no TPU held (or the settle time runs out);
    6. watch the cloud a little longer for orphaned TPUs; stop everything; run `ledger verify`.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from emulator import Emulator
from emulator.control import ControlClient
from ledger.app.chaos import report as rp
from ledger.app.chaos.faults import Injector
from ledger.app.chaos.procs import Supervisor
from ledger.app.chaos.sampler import (
    Sampler,
    alive_after_release,
    double_provisioned,
    orphan_seconds,
)
from ledger.app.chaos.scenario import Plan, Scenario, plan
from ledger.app.chaos.world import ZONE, ZONES, World, ledger_cmd, make_world
from ledger.store import open_store


def services(s: Scenario, world: World, endpoint: str) -> Supervisor:
    sup = Supervisor(env={"COLUMNS": "160"})
    logs = world.workdir / "process-logs"
    sup.add("watcher", ledger_cmd(world.store_url, "watch", "--repo", str(world.hub), "--interval", "1"),
            logs / "watcher.log")
    for i in range(s.reconcilers):
        sup.add(f"reconciler-{i}", ledger_cmd(
            world.store_url, "reconcile", "--interval", "0.5", "--tpu-endpoint", endpoint,
            "--ssh-key", str(world.ssh_key), "--log-dir", str(world.log_dir), "--id", f"chaos-{i}",
            "--orphan-grace", str(s.orphan_grace), "--lease-ttl", str(s.lease_ttl)), logs / f"reconciler-{i}.log")
    return sup


def _window(s: Scenario, p: Plan, world: World, injector: Injector, sup: Supervisor, t0: float,
            say: Callable[[str], None]) -> None:
    """Push the batches and apply the faults at their times; revive what exited by itself."""
    timeline = [(at, "push", k) for k, at in enumerate(p.batches)] + [(f.at, "fault", f) for f in p.faults]
    timeline.sort(key=lambda item: (item[0], item[1] != "push"))
    for at, what, item in timeline:
        while time.time() < t0 + at:
            sup.revive()
            time.sleep(min(0.2, max(0.0, t0 + at - time.time())))
        if what == "push":
            jobs = [j for j in p.jobs if j.batch == item]
            world.push_jobs(jobs, s.max_restarts, branch=f"batch-{item}")
            say(f"{time.time() - t0:6.1f}s pushed {len(jobs)} job(s): {', '.join(j.name for j in jobs)}")
        else:
            done = injector.apply(item)
            if item.kind not in ("kill_reconciler",) or not done.ok:
                say(f"{time.time() - t0:6.1f}s {item.kind}: {done.detail}")
    while time.time() < t0 + s.duration:
        sup.revive()
        time.sleep(0.2)


def _settle(s: Scenario, world: World, sup: Supervisor, expected: list[str],
            tend: Callable[[], None] = lambda: None, work_left: int = 0) -> float | None:
    """The time every job was terminal and released, or None if the settle time ran out
    (`work_left` seconds, what the jobs' checkpoints say they still have to run, and then
    `s.settle`). `tend`: what the operator keeps doing meanwhile (resume the jobs a refused
    create blocked: one armed in the window may be spent after it)."""
    store = open_store(world.store_url)
    try:
        deadline = time.time() + work_left + s.settle
        while time.time() < deadline:
            sup.revive()
            tend()
            if rp.settled(store.read_all(), expected):
                return time.time()
            time.sleep(1.0)
        return None
    finally:
        store.close()


def _verify(store_url: str) -> dict:
    done = subprocess.run(ledger_cmd(store_url, "verify", "--json"), capture_output=True, text=True)
    try:
        out = json.loads(done.stdout)
    except ValueError:
        return {"ok": False, "problem": (done.stderr or done.stdout).strip()[-500:]}
    problem = out.get("problem")
    return {"ok": done.returncode == 0 and bool(out.get("ok")), "events": out.get("events"), "head": out.get("head"),
            "problem": problem.get("reason") if isinstance(problem, dict) else problem}


def run_chaos(s: Scenario, workdir: Path, *, pg_url: str | None = None,
              say: Callable[[str], None] = print) -> rp.Report:
    started = time.time()
    p = plan(s)
    world = make_world(workdir, s.store, pg_url)
    expected = [world.job_id(j) for j in p.jobs]
    result = rp.Report(scenario=asdict(s), plan={"faults": len(p.faults), "batches": p.batches,
                                                 "job_seconds": {j.name: j.seconds for j in p.jobs}})
    try:
        with Emulator(state_dir=workdir / "emulator") as emu:
            sup = services(s, world, emu.endpoint)
            sampler = Sampler(emu.endpoint, ZONES).start()
            injector = Injector(ControlClient(emu.control_url), sup, sampler, ZONE, world.store_url)
            say(f"ledger {world.store_url}; emulator {emu.endpoint}; logs in {workdir}")
            sup.start_all()
            t0 = time.time()
            if p.capacity:  # capacity that comes and goes, on the emulator's own clock
                ControlClient(emu.control_url).capacity_schedule(p.capacity)
            try:
                _window(s, p, world, injector, sup, t0, say)
                injector.restore()
                window_end = time.time()
                faults = [a.t for a in injector.applied if a.ok]
                last_fault = max(faults, default=t0)
                left = world.work_left(p.jobs)  # a job still running its work is not stuck
                say(f"{window_end - t0:6.1f}s fault window closed; settling (up to {s.settle:g} s after the "
                    f"{left} s of work the jobs have left)")
                t_settled = _settle(s, world, sup, expected, tend=injector.resume_blocked, work_left=left)
                if t_settled is not None:
                    result.last_fault_to_settled_s = round(max(0.0, t_settled - last_fault), 1)
                    say(f"{time.time() - t0:6.1f}s every job settled; watching {s.observe:g} s for orphans")
                    time.sleep(s.observe)
            finally:
                sampler.stop()
                sup.stop_all()
            result.faults = injector.counts()
            result.processes = sup.counts()
            result.samples, result.sample_errors = len(sampler.samples), sampler.errors
            result.double_provisioned_samples, result.double_provisioned_examples = double_provisioned(sampler.samples)
            if t_settled is not None:
                secs, names = orphan_seconds(sampler.samples, t_settled)
                result.orphan_tpu_seconds, result.orphan_nodes = round(secs, 1), names
        store = open_store(world.store_url)
        try:
            events = list(store.read_all())
        finally:
            store.close()
        result.events = len(events)
        result.jobs = rp.job_figures(events, expected)
        result.events_by_type, result.failures_by_kind = rp.event_figures(events)
        result.release_s = rp.release_times(events, since=t0, until=window_end)
        secs, names = alive_after_release(sampler.samples, rp.released_intervals(events))
        result.alive_after_release_s, result.alive_after_release_nodes = round(secs, 1), names
        result.verify = _verify(world.store_url)
        result.seconds = {"window": round(window_end - t0, 1), "total": round(time.time() - started, 1)}
        (workdir / "report.json").write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
        (workdir / "faults.json").write_text(json.dumps([a.to_dict() for a in injector.applied], indent=1) + "\n")
        return result
    finally:
        world.close()
