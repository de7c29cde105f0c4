"""The lab at ten times the size (issue 33): 1,000 hosts, 200 running jobs (some multi-host
pods, some multislice), 10,000 waiting jobs, 50 users in 6 teams, 1M events.

    python bench/lab_scale.py                      # everything (the ledger is built once, kept)
    python bench/lab_scale.py --only pass,reads    # some parts: build, start, pass, reads, turn, day, probe
    python bench/lab_scale.py --db /tmp/lab-1m.db --events 1000000 --hours 24 --every 120 --json

What is real and what is emulator state:

- **Real**: the ledger (a SQLite file of `--events` events, built with the store's own
  `append_many`, every event a typed class verify accepts), the `Reconciler` (its
  `step()`: catch-up of jobs and usage, the planner with admission over every waiting job,
  the placement step, the dispatch of what it decides, its snapshots), the CLI commands
  (`ledger list`, `ledger tpus`, run in-process through click), the dashboard (a `ledger
  dashboard` process, this script its HTTP client), the watcher (a `ledger watch` process
  polling a real git jobs repository), and the SSH probe (`RemoteRunner.probe` over a real
  OpenSSH sshd with `--ssh-hosts` hosts running a real command).
- **Emulator state**: the Cloud TPU API's answer about the 200 TPUs (1,000 hosts) and the
  hosts' probe answer inside the pass: `LabCloud` and `LabHosts` below hold the nodes as
  the emulator would list them (READY, their hosts) and answer `running` for every worker,
  so the pass's own CPU is measured without the 1,000 SSH round trips that the probe figure
  measures apart (the `ssh` work makes those fast).

Printed (medians, CPU and wall, with the load average):

- pass: `Reconciler.step()` CPU with every waiting job planned (target <= 100 ms);
- reads: `ledger list --json`, `ledger tpus --json` and the dashboard's pages (target <= 200 ms);
- turn: the reconciler's RSS pass by pass through a snapshot turn (pass 200) with nothing due;
- day: `--hours` simulated hours of passes, one every `--every` simulated seconds (the
  reconciler's clock is injected): its RSS per hour, and the events written for waiting jobs
  (target 0 per waiting job per hour); the dashboard (pages requested through the day) and
  the watcher (polling) as processes of their own, their RSS sampled (target < 10 % growth);
- probe: one probe pass over `--ssh-hosts` real hosts, and per host.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import http.client
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from workload import job_events  # noqa: E402

from ledger.capacity_snapshot import capacity_due, load_capacity, save_capacity  # noqa: E402
from ledger.events import NewEvent, actor, format_time  # noqa: E402
from ledger.events import data as ev  # noqa: E402
from ledger.fold import evolve, initial  # noqa: E402
from ledger.replay import SNAPSHOT_EVERY, load_state, save_snapshot, usable_snapshot  # noqa: E402
from ledger.spec.model import spec_hash  # noqa: E402
from ledger.spec.policy import parse_policy  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402
from ledger.usage import to_us  # noqa: E402
from ledger.usage.snapshot import body_of, load_usage, save_body, save_usage, usable  # noqa: E402
from reconciler.model import NodeObs, PlanConfig, QueuedObs  # noqa: E402
from reconciler.plan import plan, tpu_request  # noqa: E402
from reconciler.remote.types import HostStatus  # noqa: E402

ZONE = "us-central2-b"
OWNERS = [f"user{i}" for i in range(50)]
TEAMS = {f"@lab/t{t}": [o for i, o in enumerate(OWNERS) if i % 6 == t] for t in range(6)}
# 200 running jobs, 1,000 hosts, 4,000 chips: 150 v4-32 (4 hosts), 40 v4-64 (8 hosts) and
# 10 multislice 2 x v4-32 queued resources (8 hosts).
RUNNING = [("v4-32", 1)] * 150 + [("v4-64", 1)] * 40 + [("v4-32", 2)] * 10
HELD_CHIPS = 150 * 16 + 40 * 32 + 10 * 32
WAITING_SIZES = ("v4-8", "v4-16", "v4-32", "v4-64")
# Events per finished job: whole cycles of workload.job_events (9 + 9k: no intent is left
# without its outcome). Fewer events a job is a longer history of jobs for the same events.
HISTORY_PER_JOB = 99
# Every chip of the lab is held: each waiting job waits, for the lab's chips or its quotas.
POLICY = "\n".join([
    "teams:", *(f'  "{t}": [{", ".join(m)}]' for t, m in TEAMS.items()),
    "quotas:",
    f"  lab: {{chips: {{v4: {HELD_CHIPS}}}}}",
    "  default_user: {chips: {v4: 256}, chip_hours_per_week: {v4: 50000}}",
    "priorities:",
    "  classes: {low: 100, normal: 500, urgent: 900}",
    "fair_share:",
    "  half_life_hours: 168",
    "  teams: {" + ", ".join(f'"{t}": {i + 1}' for i, t in enumerate(TEAMS)) + "}",
]) + "\n"
HOLDER = "lab-scale"
GIT = actor("git", "alice@example.com", approvers=["bob@example.com"])
REC = actor("reconciler", HOLDER)
TARGETS = {"pass_cpu_ms": 100.0, "read_ms": 200.0, "rss_growth_pct": 10.0, "events_per_waiting_job_hour": 0.0}
# Timed beside the reads, with no target of their own: `ledger queue` explains every
# waiting job's admission (decoding the 10,200 unsettled jobs), and the table of every job
# decodes each one's few fields, where `--json` writes the snapshot's text as it is.
UNTARGETED_READS = ("ledger queue", "ledger list (table)")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def spec_of(owner: str, name: str, accel: str, slices: int = 1, priority: int = 500) -> dict[str, Any]:
    """A job spec as the watcher records it (normalised: ledger.spec.normalize's shape)."""
    from ledger.tpu_types import lookup

    t = lookup(accel)
    assert t is not None
    tpu: dict[str, Any] = {"allocation_mode": "queued-resources" if slices > 1 else "tpu-vm", "accelerator": accel,
                           "zone": ZONE, "pricing": "spot", "version": "tpu-ubuntu2204-base",
                           "hosts": t.hosts * slices, "chips": t.chips * slices}
    if slices > 1:
        tpu["slices"] = slices
    return {"job": {"name": name, "env_type": "none", "loop": False, "owner": owner}, "tpu": tpu, "priority": priority,
            "setup": {"modules": ["command"]}, "command": {"cmd": "python train.py", "workers": "all", "env": {}},
            "recovery": {"max_restarts": 5, "on_preempted": "reapply"}}


def submitted(job_id: str, spec: dict[str, Any], when: str, i: int) -> NewEvent:
    commit = hashlib.sha1(job_id.encode()).hexdigest()
    return NewEvent("submitted", ev.Submitted(spec=spec, spec_hash=spec_hash(spec), commit=commit, path=f"jobs/{job_id}.yaml",
                                             author="alice@example.com", approvers=["bob@example.com"]),
                    GIT, key=f"lab:{job_id}:submitted", time=when)


def running_events(job_id: str, accel: str, slices: int, start: datetime, i: int) -> list[NewEvent]:
    owner, name = job_id.split("/")
    spec = spec_of(owner, name, accel, slices)
    t = [format_time(start + timedelta(seconds=s)) for s in range(0, 600, 60)]
    first = submitted(job_id, spec, t[0], i)
    state = evolve(initial(job_id), "submitted", {"spec": spec, "spec_hash": spec_hash(spec),
                                                  "commit": hashlib.sha1(job_id.encode()).hexdigest()}, seq=1)
    want = tpu_request(state)
    from ledger.tpu_types import lookup

    per_slice = lookup(accel).hosts  # type: ignore[union-attr]
    hosts = [{"worker": w % per_slice, **({"slice": w // per_slice} if slices > 1 else {}),
              "address": f"10.{i // 250}.{i % 250}.{w}", "port": 22} for w in range(per_slice * slices)]
    tpu = ev.tpu(want)
    return [first,
            NewEvent("provisioning", ev.Provisioning(attempt=1, tpu=tpu, how="created"), REC, key=f"lab:{job_id}:p", time=t[1]),
            NewEvent("provisioned", ev.Provisioned(tpu=tpu, hosts=[ev.Host(**h) for h in hosts]), REC, key=f"lab:{job_id}:pd",
                     time=t[2]),
            NewEvent("setup_started", ev.SetupStarted(attempt=1), REC, key=f"lab:{job_id}:ss", time=t[3]),
            NewEvent("setup_done", ev.SetupDone(attempt=1), REC, key=f"lab:{job_id}:sd", time=t[4]),
            NewEvent("started", ev.Started(attempt=1, workers=list(range(per_slice)), spec_hash=spec_hash(spec)), REC,
                     key=f"lab:{job_id}:st", time=t[5])]


def policy():
    found, errors = parse_policy(POLICY)
    assert not errors, errors
    return found


def build(db: Path, events: int, now: datetime, progress: Callable[[str], None], per_job: int = HISTORY_PER_JOB) -> None:
    """The ledger: the policy, finished jobs' history (bench/workload.py's lives), the 200
    running jobs, the 10,000 waiting ones with the wait each was given (as a first pass of
    the reconciler records it), and the snapshots a reconciler keeps."""
    if db.exists():
        store = SQLiteStore(db)
        try:
            if abs(store.head() - events) <= events // 100 and store.list_snapshots():  # saved last: built
                progress(f"reusing {db} ({store.head():,} events)")
                if usable_snapshot(store, store.head()) is None:  # the fold's code changed: as a reconciler would
                    progress("  its job-state snapshot is of other code: saving one of this code")
                    save_snapshot(store, load_state(store, use_snapshot=False))
                if usable(store, policy().fair_share.half_life_hours, store.head()) is None:
                    progress("  its usage snapshot is of other code: saving one of this code")
                    save_usage(store, *load_usage(store, policy().fair_share.half_life_hours), now=to_us(now))
                if capacity_due(store, store.head()):
                    progress("  no capacity snapshot of this code: saving one")
                    save_capacity(store, load_capacity(store))
                return
        finally:
            store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    started = time.perf_counter()
    store = SQLiteStore(db)
    try:
        from ledger.app.queueview import record_policy

        record_policy(store, policy(), source="lab_scale", holder=HOLDER)
        waiting, running = 10_000, len(RUNNING)
        fixed = 1 + waiting * 2 + running * 6 + 1
        history = max(0, -(-(events - fixed) // per_job))
        progress(f"building {db}: {history:,} finished jobs x {per_job} events, {running} running, {waiting:,} waiting")
        batch: list[tuple[str, list[NewEvent], int | None]] = []

        def flush(force: bool = False) -> None:
            if batch and (force or len(batch) >= 200):
                store.append_many(batch)
                batch.clear()

        for i in range(history):
            job = f"{OWNERS[i % 50]}/hist-{i:06d}"
            batch.append((job, job_events(job, per_job, i), 0))
            flush()
            if i and i % 2000 == 0:
                progress(f"  {i * per_job:,} history events ({time.perf_counter() - started:.0f} s)")
        flush(True)
        for i, (accel, slices) in enumerate(RUNNING):
            job = f"{OWNERS[i % 50]}/run-{i:03d}"
            batch.append((job, running_events(job, accel, slices, now - timedelta(hours=2), i), 0))
            flush()
        flush(True)
        for i in range(waiting):
            owner = OWNERS[i % 50]
            job = f"{owner}/wait-{i:05d}"
            spec = spec_of(owner, f"wait-{i:05d}", WAITING_SIZES[i % 4], priority=(100, 500, 500, 900)[i % 4])
            batch.append((job, [submitted(job, spec, format_time(now - timedelta(minutes=30)), i)], 0))
            flush()
        flush(True)
        # The first pass: every waiting job's wait recorded once (what the reconciler writes).
        state = load_state(store)
        meter, usage = load_usage(store, 168.0)
        from reconciler.admission import usage_at

        us = int(now.timestamp() * 1_000_000)
        figures = usage_at(meter, usage.open_intervals(us), us)
        config = PlanConfig(policy=policy(), holder=HOLDER)
        records = [a for a in plan(state.jobs, LabCloud(state.jobs).observed(now.timestamp()), config=config, usage=figures)
                   if a.kind == "record"]
        for a in records:
            batch.append((a.job_id, [NewEvent(e.event_type, e, REC, time=format_time(now - timedelta(minutes=29)))
                                     for e in a.params["events"]], None))
            flush()
        flush(True)
        state = load_state(store, use_snapshot=False)
        save_snapshot(store, state)
        save_usage(store, *load_usage(store, 168.0), now=to_us(now))  # as a reconciler saving it at `now` would
        save_capacity(store, load_capacity(store))
        progress(f"built {store.head():,} events in {time.perf_counter() - started:.0f} s ({len(records):,} waits recorded)")
    finally:
        store.close()


# -- emulator state: the TPU API's and the hosts' answers for the running jobs -------------------
class LabCloud:
    """What the emulator lists for the lab's TPUs: every running job's node (or each slice's
    node, and its queued resource, for a multislice job) READY with its hosts."""

    def __init__(self, jobs: dict[str, Any]) -> None:
        self.nodes: dict[str, NodeObs] = {}
        self.queued: dict[str, QueuedObs] = {}
        for job in jobs.values():
            tpu = job.tpu
            if not tpu or job.terminal:
                continue
            from ledger.placement import slice_nodes

            names = slice_nodes(tpu)
            for s, name in enumerate(names):
                hosts = tuple(h for h in job.hosts if int(h.get("slice", 0)) == s)
                self.nodes[name] = NodeObs(name, ZONE, "READY", {"managed-by": "tpu-ledger"}, hosts, "HEALTHY",
                                           time.time() - 7200, tpu.get("accelerator", ""),
                                           tpu["name"] if len(names) > 1 else "")
            if tpu.get("kind") == "queued_resource":
                self.queued[tpu["name"]] = QueuedObs(tpu["name"], ZONE, "ACTIVE")
        self.calls = 0

    def observed(self, now: float):
        from reconciler.model import Observed

        return Observed(now=now, zones=frozenset({ZONE}), nodes=dict(self.nodes), queued=dict(self.queued))

    # the reconciler's TpuApi, as far as a quiet pass uses it
    def list_nodes(self, zone: str) -> list[NodeObs]:
        self.calls += 1
        return [n for n in self.nodes.values() if n.zone == zone]

    def list_queued(self, zone: str) -> list[QueuedObs]:
        self.calls += 1
        return [q for q in self.queued.values() if q.zone == zone]

    def get_node(self, zone: str, name: str) -> NodeObs | None:
        return self.nodes.get(name)

    def operation(self, name: str):
        return None

    def close(self) -> None:
        pass


class LabHosts:
    """The hosts' answer to a probe: every worker runs (emulator state; `probe` measures real SSH)."""

    def __init__(self) -> None:
        self.probed = 0

    def probe(self, job_id: str, attempt: int, hosts: list[Any], *, workers: list[int] | None = None) -> dict[int, Any]:
        self.probed += len(hosts)
        return {h.get("worker", i) if isinstance(h, dict) else i: HostStatus("running") for i, h in enumerate(hosts)}

    def setup(self, *a: Any, **k: Any) -> Any:
        raise AssertionError("a quiet lab sets nothing up")

    def start(self, *a: Any, **k: Any) -> Any:
        raise AssertionError("a quiet lab starts nothing")

    def stop(self, *a: Any, **k: Any) -> None:
        raise AssertionError("a quiet lab stops nothing")


def reconciler(url: str, clock: Callable[[], float], cloud_jobs: bool = True):
    """A reconciler over the lab, against its simulated cloud (`cloud_jobs`: the running
    jobs' TPUs listed; the bench loads every job once for that, apart from the reconciler)."""
    from reconciler.loop import Reconciler

    store = SQLiteStore(url.removeprefix("sqlite:///"))
    try:
        cloud = LabCloud(load_state(store).jobs if cloud_jobs else {})
    finally:
        store.close()
    config = PlanConfig(policy=policy(), holder=HOLDER, intent_timeout_s=float("inf"))
    rec = Reconciler(url, cloud, LabHosts(), holder=HOLDER, ssh_user="bench", ssh_public_key="ecdsa-sha2-nistp256 AAAA bench",
                     hosts_of=lambda job: list(job.hosts), extra_args_of=lambda spec: [], config=config, lease_ttl=15.0,
                     clock=clock)
    return rec, cloud


def rss_kb(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_wall(fn: Callable[[], Any]) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000


# -- the parts ---------------------------------------------------------------------------------
def part_pass(url: str, now: float, runs: int) -> dict[str, Any]:
    """`Reconciler.step()` over the whole lab; the first passes load the snapshots and settle."""
    sim = {"t": now}
    rec, cloud = reconciler(url, lambda: sim["t"])
    try:
        first = cpu_wall(rec.step)
        rec.snapshot_saved()  # a first pass may start one (on its own thread): measured apart below
        for _ in range(3):
            sim["t"] += 2
            rec.step()
            rec.drain()
        walls, cpus, acted = [], [], 0
        for _ in range(runs):
            sim["t"] += 2
            got: list[Any] = []
            wall, cpu = cpu_wall(lambda got=got: got.extend(rec.step()))
            rec.drain()
            walls.append(wall)
            cpus.append(cpu)
            acted += len(got)
        jobs = rec.state.jobs
        waiting = sum(1 for j in jobs.values() if j.tpu is None and not j.terminal)
        return {"first_pass_ms": {"wall": first[0], "cpu": first[1]},
                "pass_ms": {"wall": statistics.median(walls), "cpu": statistics.median(cpus), "runs": runs},
                "snapshot": snapshot_beside_passes(url, rec, sim, runs),
                "actions": acted, "jobs": len(jobs) + len(rec.live.shelf), "walked": len(rec.live.jobs),
                "shelved": len(rec.live.shelf), "waiting": waiting, "running": sum(1 for j in jobs.values() if j.state == "running"),
                "hosts_probed_per_pass": rec.runner.probed // (runs + 4), "events": rec.state.position,
                "rss_mb": rss_kb() / 1024}
    finally:
        rec.close()


def part_turn(url: str, now: float) -> dict[str, Any]:
    """This process's RSS pass by pass through the reconciler's snapshot turn (every 200
    passes) with nothing new to snapshot: what it holds there beyond its steady state."""
    sim = {"t": now}
    rec, _ = reconciler(url, lambda: sim["t"])
    rss: dict[str, float] = {}
    try:
        for n in range(1, 206):
            sim["t"] += 120
            rec.step()
            rec.drain()
            if n in (1, 20, 100, 199, 200, 201, 202, 203, 205):
                rss[str(n)] = rss_kb() / 1024
        rec.snapshot_saved()
    finally:
        rec.close()
    return {"rss_mb_after_pass": rss}


def part_start(url: str) -> dict[str, Any]:
    """The reconciler's start (its first catch-up: snapshot, tail, the live view and the
    shelf), in a process of its own so its RSS is the reconciler's alone."""
    out = subprocess.run([sys.executable, __file__, "--start-child", url], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def start_child(url: str) -> None:
    rec, _ = reconciler(url, time.time, cloud_jobs=False)
    cpu = time.process_time()
    rec.catch_up()
    cpu = time.process_time() - cpu
    gc.collect()
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    print(json.dumps({"cpu_s": cpu, "rss_mb": int(status["VmRSS"].split()[0]) / 1024, "peak_mb": int(status["VmHWM"].split()[0]) / 1024,
                      "held": len(rec.state.jobs), "shelved": len(rec.live.shelf)}))
    rec.close()


def snapshot_beside_passes(url: str, rec: Any, sim: dict[str, float], runs: int) -> dict[str, Any]:
    """Every SNAPSHOT_EVERY events the reconciler saves its snapshots (the jobs' states, and
    usage with a sharing policy): what encoding and saving them costs, which a pass waited
    for until they moved to a thread of the reconciler's own; what the pass still does (the
    usage fold's copy); and a pass's wall while that thread saves beside it."""
    store = SQLiteStore(url.removeprefix("sqlite:///"))

    def save(source: Any, usage: Any) -> None:
        state, shelved = source
        save_snapshot(store, state, shelved.pieces())
        save_body(store, usage)

    try:
        copies = [cpu_wall(lambda: body_of(rec.meter, rec.usage)) for _ in range(max(1, runs // 3))]
        saves = [cpu_wall(lambda: save(rec.snapshot_source(), body_of(rec.meter, rec.usage))) for _ in range(max(1, runs // 3))]
        beside: list[float] = []
        with ThreadPoolExecutor(1) as saver:
            for _ in range(max(1, runs // 3)):
                saving = saver.submit(save, rec.snapshot_source(), body_of(rec.meter, rec.usage))
                sim["t"] += 2
                beside.append(cpu_wall(rec.step)[0])
                rec.drain()
                saving.result()
    finally:
        store.close()
    return {"save_ms": {"wall": statistics.median(s[0] for s in saves), "cpu": statistics.median(s[1] for s in saves)},
            "usage_copy_ms": statistics.median(c[0] for c in copies),
            "pass_wall_ms_beside_save": statistics.median(beside)}


@contextlib.contextmanager
def with_tail(db: Path, events: int, now: datetime) -> Iterator[str]:
    """The ledger's URL, or with `events` more past its snapshots, on a copy: a live lab's
    reader finds on average half of SNAPSHOT_EVERY events after the newest snapshot (a
    tenth of them the waits of waiting jobs changing, the rest new jobs' lives), and a read
    at the snapshot's own position would hide what the tail costs."""
    if not events:
        yield f"sqlite:///{db}"
        return
    with tempfile.TemporaryDirectory(dir=db.parent) as tmp:
        copy = Path(tmp) / db.name
        with contextlib.closing(sqlite3.connect(db)) as source, contextlib.closing(sqlite3.connect(copy)) as target:
            source.backup(target)
        store = SQLiteStore(copy)
        try:
            when = format_time(now - timedelta(minutes=1))
            waits = [(f"{OWNERS[i % 50]}/wait-{i:05d}", [NewEvent("queued", ev.Queued(
                reason="waiting for the lab's v4 chips", wait="capacity", scope="lab", family="v4", unit="chips",
                held=3992.0, limit=4000.0, needs=8.0), REC, time=when)], None) for i in range(0, 10_000, 10_000 // (events // 10))]
            lives = [(f"{OWNERS[i % 50]}/tail-{i:06d}", job_events(f"{OWNERS[i % 50]}/tail-{i:06d}", 9, i), 0)
                     for i in range((events - len(waits)) // 9)]
            batches = waits + lives
            for at in range(0, len(batches), 200):
                store.append_many(batches[at:at + 200])
        finally:
            store.close()
        yield f"sqlite:///{copy}"


def part_reads(url: str, runs: int) -> dict[str, Any]:
    """`ledger list --json`, `ledger tpus --json` and `ledger queue --json` in-process (and `ledger
    list`'s table, as plain columns to a file), their output written to a
    file as `ledger list --json > FILE` does (click's CliRunner would hold the 49 MB in
    memory, twice: ~130 ms that no user pays), then the dashboard's pages."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "out.json"
        for name, args in (("ledger list", ["list", "--json"]), ("ledger tpus", ["tpus", "--json"]),
                           ("ledger list --owner user7", ["list", "--owner", "user7", "--json"]),
                           ("ledger queue", ["queue", "--json"]), ("ledger list (table)", ["list"])):
            samples = [cpu_wall(lambda args=args: _into_file(["--store", url, *args], target)) for _ in range(runs)]
            out[name] = {"wall": statistics.median(s[0] for s in samples), "cpu": statistics.median(s[1] for s in samples),
                         "output_mb": target.stat().st_size / 1e6}
            if "--json" in args:
                json.loads(target.read_bytes())  # what it wrote is whole
    with dashboard(url) as (proc, address, ready):
        out["dashboard_ready_s"] = ready  # its process started to its first line "dashboard of ...": serving
        out["dashboard_start_s"] = _dashboard_started(address)
        # Past 200,000 events usage is folded behind the pages: from the process's start to
        # usage ready (the usage and queue pages wait for it; /api/health says when).
        out["dashboard_usage_s"] = ready + _usage_ready(address)
        # The first visit to the queue, whose fair-share meter comes with usage (it used to
        # load a usage fold of its own at this visit); the figures below leave first visits out.
        out["dashboard_first_queue_s"] = _get(address, "/queue")
        for path in ("/jobs", "/tpus", "/queue", "/usage", "/api/jobs", "/api/tpus", "/api/queue", "/jobs/user7/wait-00007"):
            times = [_get(address, path) for _ in range(runs + 1)][1:]
            out[f"GET {path}"] = {"wall": statistics.median(times) * 1000}
    return out


def _into_file(args: list[str], target: Path) -> None:
    """`ledger ARGS > target`, in this process (standard output is descriptor 1, redirected)."""
    from ledger.app.cli import cli

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with target.open("wb") as file:
            os.dup2(file.fileno(), 1)
            try:
                cli(args, standalone_mode=False)
            finally:
                sys.stdout.flush()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def dashboard(url: str) -> Iterator[tuple[subprocess.Popen, str, float]]:
    t0 = time.perf_counter()
    # Its address is in its log line "... dashboard of <store>: http://host:port/ ..." (stderr,
    # with the structured logs); the rest of its output goes nowhere, so no pipe fills.
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "--store", url, "dashboard", "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        seen = []
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if "dashboard of " in line:
                break
        else:
            raise SystemExit(f"the dashboard did not start: {''.join(seen[-20:])}")
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # type: ignore[union-attr]
        address = line.split("dashboard of ", 1)[1].split(": ", 1)[1].split()[0].removeprefix("http://").rstrip("/")
        yield proc, address, time.perf_counter() - t0
    finally:
        stop(proc)


def _dashboard_started(address: str) -> float:
    t0 = time.perf_counter()
    _get(address, "/api/jobs?limit=1")
    return time.perf_counter() - t0


def _usage_ready(address: str) -> float:
    t0 = time.perf_counter()
    while not json.loads(_body(address, "/api/health"))["usage_ready"]:
        time.sleep(0.05)
    return time.perf_counter() - t0


def _body(address: str, path: str) -> bytes:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def _get(address: str, path: str) -> float:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        t = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"GET {path}: {response.status}")
        return time.perf_counter() - t
    finally:
        conn.close()


def part_day(url: str, now: float, hours: float, every: float) -> dict[str, Any]:
    """`hours` simulated hours of passes, one every `every` simulated seconds (the reconciler's
    injected clock), in this process; the dashboard and the watcher beside it as processes."""
    sim = {"t": now}
    rec, _ = reconciler(url, lambda: sim["t"])
    store = SQLiteStore(url.removeprefix("sqlite:///"))
    with dashboard(url) as (dash, address, _), watcher(url) as watch:
        _usage_ready(address)  # its usage folded (behind the pages past 200,000 events): its memory's start
        try:
            rec.step()
            rec.drain()
            start = store.head()
            waiting = {j.id for j in rec.state.jobs.values() if j.tpu is None and not j.terminal}
            samples: dict[str, list[int]] = {"reconciler": [rss_kb()], "dashboard": [rss_kb(dash.pid)],
                                             "watcher": [rss_kb(watch.pid)]}
            passes = int(hours * 3600 / every)
            per_hour = max(1, int(3600 / every))
            cpu0 = time.process_time()
            for n in range(1, passes + 1):
                sim["t"] += every
                rec.step()
                rec.drain()
                if n % per_hour == 0:
                    for path in ("/jobs", "/tpus", "/queue", "/api/jobs"):
                        _get(address, path)
                    samples["reconciler"].append(rss_kb())
                    samples["dashboard"].append(rss_kb(dash.pid))
                    samples["watcher"].append(rss_kb(watch.pid))
            cpu = time.process_time() - cpu0
            written: dict[str, int] = {}
            for row in store.fold_rows(start, None):
                if row[1] in waiting:
                    written[row[3]] = written.get(row[3], 0) + 1
            maps = {name: len(getattr(rec, name)) for name in ("_suspect_since", "_in_flight")}
            maps["job_backoff"] = len(rec.job_backoff._zones)
        finally:
            rec.close()
            store.close()
    growth = {k: round(100.0 * (max(v[len(v) // 4:]) - v[len(v) // 4]) / v[len(v) // 4], 2) for k, v in samples.items()}
    return {"hours": hours, "every_s": every, "passes": passes, "pass_cpu_ms_mean": cpu / passes * 1000,
            "waiting": len(waiting), "events_for_waiting_jobs": written,
            "events_per_waiting_job_hour": sum(written.values()) / max(1, len(waiting)) / hours,
            "rss_kb": {k: [v[0], v[len(v) // 4], v[-1]] for k, v in samples.items()}, "rss_growth_pct": growth,
            "maps": maps}


@contextlib.contextmanager
def watcher(url: str) -> Iterator[subprocess.Popen]:
    """`ledger watch` polling a jobs repository every 0.2 s (a day at 5 s is 17,280 polls)."""
    with tempfile.TemporaryDirectory(prefix="lab-watch-") as d:
        repo = Path(d) / "jobs"
        env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com", "GIT_COMMITTER_NAME": "a",
               "GIT_COMMITTER_EMAIL": "a@example.com"}
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "empty"], check=True, env=env)
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "--store", url, "watch", "--repo", str(repo),
                                 "--interval", "0.2", "--no-watchdog"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=ROOT, env=env)
        try:
            time.sleep(3)
            yield proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """End a process this script started (by its own handle), killing it if it lingers."""
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def part_probe(hosts_n: int, rounds: int) -> dict[str, Any]:
    """One probe round (RemoteRunner.probe) over `hosts_n` real OpenSSH hosts running a real
    command: what today's probe costs per host (warm connections, as in a reconciler)."""
    from remote_bench import runner, sshd_pod

    with tempfile.TemporaryDirectory(prefix="lab-probe-") as d:
        tmp = Path(d)
        (tmp / "secrets" / "bench").mkdir(parents=True)
        with sshd_pod(tmp, hosts_n) as (hosts, key):
            r = runner(tmp, key, hosts)
            spec = {"setup": {"modules": []}, "command": {"cmd": "while true; do echo step; sleep 1; done", "workers": "all", "env": {}}}
            r.start("bench/probe", 1, hosts, spec, extra_args=[], resume=False)
            r.probe("bench/probe", 1, hosts)
            samples = []
            for _ in range(rounds):
                samples.append(cpu_wall(lambda: r.probe("bench/probe", 1, hosts)))
                time.sleep(0.05)
            r.stop("bench/probe", 1, hosts, grace=2)
            r.close()
    wall = statistics.median(s[0] for s in samples)
    cpu = statistics.median(s[1] for s in samples)
    return {"hosts": hosts_n, "rounds": rounds, "wall_ms": wall, "cpu_ms": cpu, "cpu_ms_per_host": cpu / hosts_n,
            "wall_ms_per_host": wall / hosts_n, "cpu_s_for_1000_hosts": cpu / hosts_n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=Path("/tmp/lab-scale-1m.db"))
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--history-events", type=int, default=HISTORY_PER_JOB,
                    help=f"events per finished job (9, 18, ... {HISTORY_PER_JOB}: default); 9 makes ~110,000 finished jobs of 1M events")
    ap.add_argument("--only", default="build,start,pass,reads,turn,day,probe")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--every", type=float, default=120.0, help="simulated seconds between passes in the day")
    ap.add_argument("--ssh-hosts", type=int, default=16)
    ap.add_argument("--tail", type=int, default=SNAPSHOT_EVERY // 2,
                    help="reads: events past the newest snapshot, on a copy of the ledger (0: read at the snapshot)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--start-child", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.start_child:
        start_child(args.start_child)
        return
    parts = set(args.only.split(","))
    # The lab's "now": a fixed moment after every event of the built ledger.
    now = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    url = f"sqlite:///{args.db}"
    result: dict[str, Any] = {"load_before": load(), "events": args.events}

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if args.history_events < 9 or args.history_events % 9:
        ap.error("--history-events must be 9, 18, 27, ...: whole cycles of a job's life")
    build(args.db, args.events, now, say, args.history_events)
    if "start" in parts:
        result["start"] = part_start(url)
        say(f"start: {json.dumps(result['start'])}")
    if "pass" in parts:
        result["pass"] = part_pass(url, now.timestamp(), args.runs)
        say(f"pass: {json.dumps(result['pass'])}")
    if "reads" in parts:
        with with_tail(args.db, args.tail, now) as tailed:
            result["reads"] = part_reads(tailed, args.runs)
        result["reads"]["tail_events"] = args.tail
        say(f"reads: {json.dumps(result['reads'])}")
    if "turn" in parts:
        result["turn"] = part_turn(url, now.timestamp() + 60)
        say(f"turn: {json.dumps(result['turn'])}")
    if "day" in parts:
        result["day"] = part_day(url, now.timestamp() + 60, args.hours, args.every)
        say(f"day: {json.dumps(result['day'])}")
    if "probe" in parts:
        result["probe"] = part_probe(args.ssh_hosts, args.runs)
        say(f"probe: {json.dumps(result['probe'])}")
    result["load_after"] = load()
    result["max_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.json:
        print(json.dumps(result, indent=2))
        return
    report(result)


def report(r: dict[str, Any]) -> None:
    print(f"lab at 10x: {r['events']:,} events, 50 users, load {r['load_before']} -> {r['load_after']}")
    if "start" in r:
        st = r["start"]
        print(f"  reconciler start (snapshot, tail, live view): {st['cpu_s']:.2f} s CPU; RSS {st['rss_mb']:.0f} MB after it "
              f"(peak {st['peak_mb']:.0f} MB), {st['held']:,} jobs held as states, {st['shelved']:,} shelved")
    if "pass" in r:
        p = r["pass"]
        print(f"  reconciler pass (step) over {p['jobs']:,} jobs, {p['walked']:,} of them unsettled ({p['waiting']:,} waiting, {p['running']} running, "
              f"{p['hosts_probed_per_pass']} hosts probed as emulator state): median {p['pass_ms']['cpu']:.1f} ms CPU, "
              f"{p['pass_ms']['wall']:.1f} ms wall (target <= {TARGETS['pass_cpu_ms']:.0f} ms CPU); first pass "
              f"{p['first_pass_ms']['cpu']:.0f} ms CPU; the reconciler process's RSS at the end (its passes and a snapshot saved) {p['rss_mb']:.0f} MB")
        snap = p["snapshot"]
        print(f"  snapshots every 10,000 events (jobs, usage): encode + save {snap['save_ms']['wall']:.0f} ms wall "
              f"({snap['save_ms']['cpu']:.0f} ms CPU; a pass used to wait for it), now on the reconciler's own thread "
              f"(the pass copies usage: {snap['usage_copy_ms']:.0f} ms): a pass beside it "
              f"{snap['pass_wall_ms_beside_save']:.0f} ms wall")
    if "reads" in r:
        print(f"  reads with {r['reads'].get('tail_events', 0):,} events past the newest snapshot:")
        for k, v in r["reads"].items():
            if k == "tail_events":
                continue
            if isinstance(v, dict):
                cpu = f", {v['cpu']:.1f} ms CPU" if "cpu" in v else ""
                target = "no target" if k in UNTARGETED_READS else f"target <= {TARGETS['read_ms']:.0f} ms"
                print(f"  {k:36s} median {v['wall']:8.1f} ms wall{cpu} ({target})")
            else:
                print(f"  {k:36s} {v:.2f} s")
    if "turn" in r:
        shown = ", ".join(f"{k}: {v:.0f}" for k, v in r["turn"]["rss_mb_after_pass"].items())
        print(f"  RSS (MB) after each pass through the snapshot turn at pass 200, nothing due: {shown}")
    if "day" in r:
        d = r["day"]
        print(f"  {d['hours']:g} simulated hours, a pass every {d['every_s']:g} s ({d['passes']} passes, "
              f"{d['pass_cpu_ms_mean']:.0f} ms CPU each on average): events for {d['waiting']:,} waiting jobs "
              f"{d['events_for_waiting_jobs'] or 'none'} = {d['events_per_waiting_job_hour']:.4f} per waiting job per hour (target 0)")
        for k, v in d["rss_kb"].items():
            print(f"    RSS {k:10s} start {v[0] / 1024:7.1f} MB, after 1/4 day {v[1] / 1024:7.1f} MB, end {v[2] / 1024:7.1f} MB: "
                  f"growth {d['rss_growth_pct'][k]:+.2f} % after the first quarter (target < {TARGETS['rss_growth_pct']:.0f} %)")
        print(f"    reconciler maps at the end: {d['maps']}")
    if "probe" in r:
        p = r["probe"]
        print(f"  probe (today's RemoteRunner, real OpenSSH): {p['hosts']} hosts in {p['wall_ms']:.0f} ms wall, "
              f"{p['cpu_ms']:.0f} ms CPU = {p['cpu_ms_per_host']:.1f} ms CPU per host, so ~{p['cpu_s_for_1000_hosts']:.1f} s CPU "
              f"per pass at 1,000 hosts (extrapolated; target <= 1 s wall; persistent connections are the ssh work)")


if __name__ == "__main__":
    main()
