"""What the host checks add to a start: every check on a 16-host pod, vs the start itself.

    python bench/doctor_bench.py [--hosts 16] [--reps 15] [--json]

A `ledger emulator` subprocess serves a v4-128 node (16 hosts; host keys pinned from guest
attributes). On warm connections, each rep times (a) the start of a trivial command on
every host (RemoteRunner.start, a fresh attempt each rep) and (b) the checks a start now
runs first (reconciler.doctor.Gate: the job's stream read from a SQLite ledger, one probe
per host in parallel, the verdicts), with a stale lock planted on one worker every other
rep so that half the reps also repair and record; and (c) one SSH round trip of `true` to
every host, the floor any remote step pays. Prints medians. Target: checks <= 300 ms.
Each clean rep also times (d) the same checks with the probe as it was before the devices
scan moved to perl and df lost its pipe (find -lname; `df | { ... }`), so the before/after
ratio comes from one run under one load.

The emulator runs all 16 hosts on this machine: each host's probe scans every process of
the machine (/proc/*/fd), 16 times over, on its cores. On a real pod each VM scans its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataclasses import replace  # noqa: E402

from bench.remote_bench import emulator_pod  # noqa: E402
from ledger import defaults  # noqa: E402
from ledger.events import NewEvent, actor  # noqa: E402
from ledger.fold import replay  # noqa: E402
from ledger.store import open_store  # noqa: E402
from reconciler.doctor import CHECKS, Doctor, Gate, Paths, devices, probe  # noqa: E402
from reconciler.remote import RemoteRunner  # noqa: E402

JOB = "bench/doctor"
# The probe before this change: find's scan of /proc/*/fd, df through a pipe (two forks).
OLD_DF = ("df -Pk -- {work} {tmp} | "
          "{{ read -r _; while read -r _ _ _ avail _ mp; do printf 'df\\t%s\\t%s\\n' \"$avail\" \"$mp\"; done; }}")
BEFORE = tuple(
    replace(c, probe=lambda paths, ctx: devices.scan(paths, perl=False)) if c.name == "devices"
    else replace(c, probe=lambda paths, ctx: OLD_DF.format(work=probe.word(paths.workdir), tmp=probe.rooted(paths.tmp)))
    if c.name == "disk" else c
    for c in CHECKS
)
SPEC = {"command": {"cmd": "sleep 30", "workers": "all"}, "setup": {"modules": ["command"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="doctor-bench-") as d, emulator_pod(Path(d), a.hosts) as (hosts, key):
        tmp = Path(d)
        runner = RemoteRunner(private_key_path=key, known_hosts_path=tmp / "known_hosts", log_dir=tmp / "logs",
                              username="bench", retries=3, backoff=0.2)
        assert not any(runner.connect(hosts).values())
        store = open_store(f"sqlite:///{tmp / 'ledger.db'}")
        git = actor("git", "bench")
        tpu = {"name": "bench", "zone": "us-central2-b", "kind": "node", "shared": True}
        store.append(JOB, [NewEvent("submitted", {"spec": SPEC, "spec_hash": "ab" * 32, "commit": "c0ffee", "path": "jobs/b.yaml"}, git),
                           NewEvent("provisioning", {"attempt": 1, "tpu": tpu}, git),
                           NewEvent("provisioned", {"tpu": tpu, "hosts": [{"worker": h.worker, "address": h.address, "port": h.port} for h in hosts]}, git)])
        doctor = Doctor(runner, Paths.for_root(defaults.EMULATOR_HOST_ROOT))
        gate = Gate(doctor, "bench")
        old_doctor = Doctor(runner, Paths.for_root(defaults.EMULATOR_HOST_ROOT), checks=BEFORE)
        old_gate = Gate(old_doctor, "bench")
        checks, repairs, starts, floors, single, host_cpu = [], [], [], [], [], []
        old_checks, old_cpu = [], []
        emu_pid = json.loads((tmp / "emu" / "emulator.json").read_text())["pid"]
        try:
            for rep in range(a.reps):
                job = replay(store.read_stream(JOB)).jobs[JOB]
                dirty = rep % 2 == 1
                if dirty:  # a stale lock on one worker: the checks repair and record it
                    runner.run(hosts[rep % len(hosts)], "bash -c 'mkdir -p ~/.vm/tmp && : > ~/.vm/tmp/libtpu_lockfile'")

                def timed(g: Gate, job=job, dirty=dirty) -> tuple[float, float]:
                    """(wall s, host CPU s per host) of one gate; checks what it answered."""
                    cpu0, t0 = children_cpu(emu_pid), time.perf_counter()
                    health, problem = g(store, job, hosts, actor("reconciler", "bench"))
                    wall = time.perf_counter() - t0
                    assert problem is None and health == ("fixed" if dirty else gate_health(health)), (health, problem)
                    return wall, (children_cpu(emu_pid) - cpu0) / len(hosts)

                if dirty:
                    repairs.append(timed(gate)[0])
                else:  # the probe as it was, under the same load; which goes first alternates
                    first_old = rep // 2 % 2 == 1
                    old = timed(old_gate) if first_old else None
                    wall, cpu = timed(gate)
                    old = old or timed(old_gate)
                    checks.append(wall)
                    host_cpu.append(cpu)
                    old_checks.append(old[0])
                    old_cpu.append(old[1])
                t0 = time.perf_counter()
                runner.start(JOB, rep + 1, hosts, SPEC, extra_args=[], resume=False)
                starts.append(time.perf_counter() - t0)
                runner.stop(JOB, rep + 1, hosts, grace=1)
                t0 = time.perf_counter()
                list(doctor._pool.map(lambda h: runner.run(h, "true"), hosts))
                floors.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                gate(store, job, hosts[:1], actor("reconciler", "bench"))
                single.append(time.perf_counter() - t0)
        finally:
            doctor.close()
            old_doctor.close()
            runner.close()
            store.close()
    out = {
        "hosts": a.hosts, "reps": a.reps,
        "checks_ms_median": round(statistics.median(checks) * 1000, 1),
        "checks_with_repair_ms_median": round(statistics.median(repairs) * 1000, 1) if repairs else None,
        "start_ms_median": round(statistics.median(starts) * 1000, 1),
        "ssh_true_ms_median": round(statistics.median(floors) * 1000, 1),
        "checks_one_host_ms_median": round(statistics.median(single) * 1000, 1),
        "probe_cpu_ms_per_host_median": round(statistics.median(host_cpu) * 1000, 1),
        "before_checks_ms_median": round(statistics.median(old_checks) * 1000, 1),
        "before_probe_cpu_ms_per_host_median": round(statistics.median(old_cpu) * 1000, 1),
        "load_average": round(os.getloadavg()[0], 1),
    }
    out["after_vs_before"] = round(out["checks_ms_median"] / out["before_checks_ms_median"], 2)
    out["cpu_after_vs_before"] = round(out["probe_cpu_ms_per_host_median"] / out["before_probe_cpu_ms_per_host_median"], 2)
    out["checks_vs_start"] = round(out["checks_ms_median"] / out["start_ms_median"], 2)
    out["target_met"] = out["checks_ms_median"] <= 300
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{a.hosts} hosts, {a.reps} reps (medians), load average {out['load_average']} at the end:")
        print(f"  host checks before a start (clean hosts)   {out['checks_ms_median']:8.1f} ms   (target <= 300 ms: {'met' if out['target_met'] else 'NOT met'})")
        print(f"  host checks that repair a stale lock        {out['checks_with_repair_ms_median']:8.1f} ms   (probe, repair, intent + outcome appended)")
        print(f"  the start itself (RemoteRunner.start)       {out['start_ms_median']:8.1f} ms   (checks / start = {out['checks_vs_start']})")
        print(f"  one SSH round trip of `true` to every host  {out['ssh_true_ms_median']:8.1f} ms   (the floor of any remote step)")
        print(f"  host checks on one host                     {out['checks_one_host_ms_median']:8.1f} ms   (what each VM of a real pod pays, in parallel)")
        print(f"  CPU of the probe's processes, per host      {out['probe_cpu_ms_per_host_median']:8.1f} ms   (user + system, the load left out)")
        print(f"  before: host checks, clean hosts            {out['before_checks_ms_median']:8.1f} ms   (after / before = {out['after_vs_before']})")
        print(f"  before: CPU of the probe, per host          {out['before_probe_cpu_ms_per_host_median']:8.1f} ms   (after / before = {out['cpu_after_vs_before']})")


def children_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) of `pid`'s reaped children: the hosts' commands."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def gate_health(health: str) -> str:
    """Clean hosts read healthy, or warning when the versions differ (they do not here)."""
    return health if health in ("healthy", "warning") else "healthy"


if __name__ == "__main__":
    main()
