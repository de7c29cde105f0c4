"""SSH hosts at scale: a probe pass of N real sshd hosts, and preemption to `preempted`.

    python bench/ssh_probe_bench.py [--hosts 200] [--per-job 5] [--passes 10] [--preemptions 5] [--skip-old] [--json]

Probe: N hosts, each its own port and $HOME on real OpenSSH sshd processes (sshd listens on
at most 16 sockets each, so ceil(N/16) of them), grouped into jobs of `--per-job` hosts, each
host running a command that prints a line a second (a training log). A pass probes every job
as the reconciler does (8 jobs at a time, each job's hosts in parallel), in the same run:
- old: one exec per host per pass over its persistent connection (status + output by offset);
- new: each host's watcher channel streams its output and its end: the pass reads what
  arrived (one socket peek per host), no round trip.
Printed: medians over the passes of wall time and of this process's CPU (the reconciler's
side: paramiko's crypto and packets, the probe's parsing and log writes), and connections.
`--skip-old` leaves the old pass out (at 1,000 hosts its 1,000 execs a pass fork 1,000 shells
on the same 2 cores: a 500-host run of it pushed the load to 130-280), so only the new pass
is measured; the ratio is then not printed.

On this machine the N hosts' sshd, bash and dd run on the same 2 cores as the reconciler,
so the old pass's wall time includes every host's CPU; on TPU VMs each host has its own.
The figure that extrapolates to 1,000 hosts is the reconciler's CPU per host (x 1,000) and,
for the old pass, the wall time per host at the same concurrency; both are printed as such.

Preemption: the emulator, a SQLite ledger and a reconciler polling every 2 s (the default);
a spot v4-8 job is preempted at a random point of the cycle, `--preemptions` times, with
watchers off (old: the next poll notices) and on (new: the dropped connections wake the
loop). Printed: the median from the emulator's preempt to the `preempted` event.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.reconcile_preemption import Stack, _one_preemption, job_spec  # noqa: E402
from bench.remote_bench import free_port, wait_listening  # noqa: E402
from ledger.fold import RUNNING  # noqa: E402
from reconciler.remote import Host, RemoteRunner  # noqa: E402

PER_SSHD = 16  # OpenSSH's MAX_LISTEN_SOCKS
# A training log: a line a second. The second is waited in bash itself (a read that times out
# on a pipe it holds both ends of), not by `sleep 1`: at 1,000 hosts on this machine's 2 cores,
# 1,000 forks a second of sleep drove the load past 300 before half the hosts were started
# (on TPU VMs each host has its own cores: the hosts' CPU is not the reconciler's to measure).
CMD = "exec 3<> <(:); for i in $(seq 1 100000); do echo step $i loss 0.$RANDOM; read -t 1 -u 3; done"


@contextlib.contextmanager
def sshd_hosts(tmp: Path, n: int):
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        raise SystemExit("sshd not installed: apt-get install openssh-server")
    for name in ("id", "hostkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(tmp / name)], check=True)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    ports: list[int] = []
    while len(ports) < n:  # a port freed and handed out twice would make two hosts one
        if (p := free_port("127.0.0.2")) not in ports:
            ports.append(p)
    procs = []
    try:
        for k in range(0, n, PER_SSHD):
            group = ports[k:k + PER_SSHD]
            lines = [*(f"ListenAddress 127.0.0.2:{p}" for p in group), f"HostKey {tmp / 'hostkey'}",
                     "PasswordAuthentication no", "UsePAM no", "StrictModes no", f"AuthorizedKeysFile {tmp / 'id.pub'}",
                     "PidFile none", "MaxStartups 200", "MaxSessions 200", "LogLevel ERROR"]
            for i, p in enumerate(group, start=k):
                (tmp / f"home-{i}").mkdir()
                lines += [f"Match LocalPort {p}", f"  SetEnv HOME={tmp / f'home-{i}'}"]
            cfg = tmp / f"sshd_config_{k // PER_SSHD}"
            cfg.write_text("\n".join(lines) + "\n")
            procs.append(subprocess.Popen([sshd, "-D", "-e", "-f", str(cfg)], stderr=subprocess.DEVNULL))
        wait_listening("127.0.0.2", ports, 60)
        user = getpass.getuser()
        yield [Host(i, "127.0.0.2", p, user) for i, p in enumerate(ports)], tmp / "id"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def probe_passes(tmp: Path, hosts: list[Host], key: Path, per_job: int, passes: int, modes: tuple[str, ...] = ("old", "new")) -> dict:
    jobs = {f"bench/j{k // per_job}": [Host(i, h.address, h.port, h.username) for i, h in enumerate(hosts[k:k + per_job])]
            for k in range(0, len(hosts), per_job)}
    spec = {"setup": {"modules": []}, "command": {"cmd": CMD, "workers": "all", "env": {}}}
    starter = RemoteRunner(private_key_path=key, known_hosts_path=tmp / "known_hosts", log_dir=tmp / "logs-start",
                           username=hosts[0].username, secrets_dir=tmp / "secrets", command_timeout=300, connect_timeout=60,
                           watch=False)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda j: starter.start(j, 1, jobs[j], spec, extra_args=[], resume=False), jobs))
    starter.close()
    out: dict = {}
    # old and new alternate pass by pass, each on its own runner (own connections, own logs)
    runners = {mode: RemoteRunner(private_key_path=key, known_hosts_path=tmp / "known_hosts", log_dir=tmp / f"logs-{mode}",
                                  username=hosts[0].username, secrets_dir=tmp / "secrets", command_timeout=300,
                                  connect_timeout=60, watch=mode == "new") for mode in modes}
    samples: dict[str, dict[str, list[float]]] = {m: {"wall": [], "cpu": []} for m in runners}

    def one_pass(r: RemoteRunner) -> int:
        with ThreadPoolExecutor(8) as pool:  # the reconciler's pass: 8 jobs at a time
            results = list(pool.map(lambda j: r.probe(j, 1, jobs[j]), jobs))
        running = sum(s.state == "running" for st in results for s in st.values())
        assert running == len(hosts), f"{running} of {len(hosts)} running"
        return running

    for r in runners.values():  # connect (and, new, arm the watchers): not timed
        one_pass(r)
        one_pass(r)
    for _ in range(passes):
        for mode, r in runners.items():
            c0, t0 = time.process_time(), time.perf_counter()
            one_pass(r)
            samples[mode]["wall"].append(time.perf_counter() - t0)
            samples[mode]["cpu"].append(time.process_time() - c0)
        time.sleep(0.5)
    out["load_after_passes"] = Path("/proc/loadavg").read_text().split()[:3]
    out["open_descriptors"] = len(os.listdir("/proc/self/fd"))  # past 1,024 at 1,000 hosts (poll, not select)
    n = len(hosts)
    for mode, r in runners.items():
        wall, cpu = statistics.median(samples[mode]["wall"]), statistics.median(samples[mode]["cpu"])
        out[mode] = {"wall_ms": round(wall * 1000, 1), "cpu_ms": round(cpu * 1000, 1),
                     "cpu_per_host_ms": round(cpu / n * 1000, 3), "wall_per_host_ms": round(wall / n * 1000, 3),
                     "cpu_1000_hosts_ms": round(cpu / n * 1000 * 1000), "connections": r.pool.connects,
                     "watchers": len(r.watchers)}
        r.close()
    if "old" in out:
        old_out = list((tmp / "logs-old").rglob("output_*.log"))  # (output_<host>.log: layout.output_log)
        same = len(old_out) == len(hosts) and all((tmp / "logs-new" / p.relative_to(tmp / "logs-old")).exists() for p in old_out)
        out["new_collected_every_log"] = same
        out["speedup_wall"] = round(out["old"]["wall_ms"] / max(out["new"]["wall_ms"], 1e-3), 1)
        out["speedup_cpu"] = round(out["old"]["cpu_ms"] / max(out["new"]["cpu_ms"], 1e-3), 1)
    else:  # every host's log, collected by its watcher
        out["new_collected_every_log"] = len(list((tmp / "logs-new").rglob("output_*.log"))) == len(hosts)
    stopper = RemoteRunner(private_key_path=key, known_hosts_path=tmp / "known_hosts", log_dir=tmp / "logs-start",
                           username=hosts[0].username, secrets_dir=tmp / "secrets", command_timeout=300, watch=False)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda j: stopper.stop(j, 1, jobs[j], grace=1), jobs))
    stopper.close()
    return out


def preemption_latency(preemptions: int, interval: float) -> dict:
    out = {}
    for mode in ("old", "new"):
        stack = Stack(interval)
        stack.rec.runner.watch = mode == "new"
        job_id = f"bench/preempt-{mode}"
        stack.submit(job_id, job_spec("sleep 600", zone="us-central2-b", accelerator="v4-8", max_restarts=preemptions + 2))
        stack.start()
        detect = []
        try:
            attempt = 1
            while len(detect) < preemptions:
                stack.wait(job_id, lambda j, a=attempt: j.state == RUNNING and j.attempt == a)
                if mode == "new":
                    deadline = time.monotonic() + 30
                    while len(stack.rec.runner.watchers) < 1 and time.monotonic() < deadline:
                        time.sleep(0.02)
                marks = _one_preemption(stack, job_id, attempt, interval, 120)
                attempt += 1
                if marks is not None:
                    detect.append(marks["detect"])
        finally:
            stack.close()
        out[mode] = {"median_ms": round(statistics.median(detect) * 1000), "max_ms": round(max(detect) * 1000),
                     "samples_ms": [round(d * 1000) for d in detect]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=200)
    ap.add_argument("--per-job", type=int, default=5)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--preemptions", type=int, default=5)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--skip-old", action="store_true", help="measure the new pass only (no exec per host per pass)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    random.seed(7)
    result: dict = {"hosts": a.hosts, "per_job": a.per_job, "passes": a.passes, "cpus": os.cpu_count(),
                    "load_before": Path("/proc/loadavg").read_text().split()[:3]}
    with tempfile.TemporaryDirectory(prefix="ssh-probe-bench-") as d, sshd_hosts(Path(d), a.hosts) as (hosts, key):
        result["probe"] = probe_passes(Path(d), hosts, key, a.per_job, a.passes, ("new",) if a.skip_old else ("old", "new"))
    if a.preemptions:
        result["preemption"] = preemption_latency(a.preemptions, a.interval)
    result["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    if a.json:
        print(json.dumps(result))
        return
    p = result["probe"]
    print(f"probe pass of {a.hosts} real sshd hosts ({a.hosts // a.per_job} jobs of {a.per_job}), medians of {a.passes} passes:")
    for mode in ("old", "new"):
        if mode not in p:
            print(f"  {mode}: not measured (--skip-old)")
            continue
        m = p[mode]
        print(f"  {mode}: wall {m['wall_ms']} ms ({m['wall_per_host_ms']} ms/host), reconciler CPU {m['cpu_ms']} ms "
              f"({m['cpu_per_host_ms']} ms/host -> {m['cpu_1000_hosts_ms']} ms for 1,000 hosts), "
              f"{m['connections']} connections, {m['watchers']} watchers")
    if "speedup_wall" in p:
        print(f"  old/new: wall {p['speedup_wall']}x, CPU {p['speedup_cpu']}x; new collected every log: {p['new_collected_every_log']}")
    else:
        print(f"  new collected every host's log: {p['new_collected_every_log']}")
    if "preemption" in result:
        for mode, m in result["preemption"].items():
            print(f"preemption -> preempted, {mode} ({'watchers' if mode == 'new' else 'poll'}, interval {a.interval:g} s): "
                  f"median {m['median_ms']} ms, max {m['max_ms']} ms, samples {m['samples_ms']}")
    print(f"  {p['open_descriptors']} descriptors open; load after the passes {' '.join(p['load_after_passes'])}")
    print(f"load {' '.join(result['load_before'])} -> {' '.join(result['load_after'])}")


if __name__ == "__main__":
    main()
