"""A multislice job's hosts on a real OpenSSH pod: every host of every slice runs the command
with the placement and Megascale variables; `workers:` selects within each slice; a value the
host already has wins; each host keeps its own files even where two share a home."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from reconciler.remote import layout
from reconciler.remote.types import Placed

JOB = "alice/ms"
CMD = ('echo "s=$LEDGER_SLICE_ID w=$LEDGER_WORKER_ID n=$LEDGER_NUM_SLICES acc=$LEDGER_ACCELERATOR zone=$LEDGER_ZONE '
       'pricing=$LEDGER_PRICING chips=$LEDGER_CHIPS choice=$LEDGER_PLACEMENT '
       'coord=$MEGASCALE_COORDINATOR_ADDRESS slices=$MEGASCALE_NUM_SLICES id=$MEGASCALE_SLICE_ID port=$MEGASCALE_PORT"')


def spec(workers="all", env=None) -> dict:
    return {"command": {"cmd": CMD, "workers": workers, "env": env or {}}, "setup": {"modules": ["command"]}}


def slices_of(pod):
    """The pod's 4 hosts as 2 slices of 2 workers; slice 1's workers share slice 0's homes."""
    hosts = []
    for rank, h in enumerate(pod.hosts):
        s, w = divmod(rank, 2)
        home_of = pod.hosts[w]  # slice 1's worker w is served where slice 0's worker w is
        hosts.append(dataclasses.replace(h, worker=w, slice=s, rank=rank, port=home_of.port))
    return hosts


PLACED = Placed(accelerator="v5litepod-16", zone="us-west4-a", pricing="spot", chips=32, index=1, slices=2, coordinator="10.0.0.7")


def test_every_host_of_every_slice_runs_with_its_slice_and_the_coordinator(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    hosts = slices_of(pod)
    pids = r.start(JOB, 1, hosts, spec(), extra_args=[], resume=False, placed=PLACED)
    assert sorted(pids) == [0, 1, 2, 3] and len(set(pids.values())) == 4
    st = wait_for(lambda: (s := r.probe(JOB, 1, hosts)) and all(v.state == "exited" for v in s.values()) and s)
    assert {k: v.exit_code for k, v in st.items()} == {0: 0, 1: 0, 2: 0, 3: 0}
    for h in hosts:
        out = layout.output_log(tmp_path / "logs", JOB, 1, h.worker, h.slice).read_text()
        assert out == (f"s={h.slice} w={h.worker} n=2 acc=v5litepod-16 zone=us-west4-a pricing=spot chips=32 choice=1 "
                       f"coord=10.0.0.7:8081 slices=2 id={h.slice} port=8081\n")
    # two hosts behind one home keep apart: slice 1 lives under slice-1/
    assert (pod.home(0) / layout.attempt_rel(JOB, 0, 1, 1) / "exit_code").exists()
    assert (pod.home(0) / layout.attempt_rel(JOB, 0, 1) / "exit_code").exists()


def test_workers_select_within_each_slice_and_the_hosts_values_win(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    hosts = slices_of(pod)
    pids = r.start(JOB, 2, hosts, spec(workers=[1], env={"MEGASCALE_PORT": "9999"}), extra_args=[], resume=False, placed=PLACED)
    assert sorted(pids) == [1, 3]  # worker 1 of slice 0 and of slice 1
    chosen = [h for h in hosts if h.id in pids]
    wait_for(lambda: (s := r.probe(JOB, 2, chosen)) and all(v.state == "exited" for v in s.values()))
    out = layout.output_log(tmp_path / "logs", JOB, 2, 1, 1).read_text()
    assert "coord=10.0.0.7:9999" in out and "port=9999" in out  # command.env's port, and the address with it


def test_one_slice_jobs_get_the_placement_but_no_megascale(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    one = Placed(accelerator="v4-32", zone="us-central2-b", pricing="spot", chips=16, index=0, slices=1)
    r.start(JOB, 3, pod.hosts[:1], spec(workers=[0]), extra_args=[], resume=False, placed=one)
    wait_for(lambda: r.probe(JOB, 3, pod.hosts[:1])[0].state == "exited")
    out = layout.output_log(tmp_path / "logs", JOB, 3, 0).read_text()
    assert out.startswith("s=0 w=0 n=1 acc=v4-32 zone=us-central2-b pricing=spot chips=16 choice=0 coord= slices= id= port=")


def test_ledger_logs_reads_one_host_of_one_slice(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    hosts = slices_of(pod)
    docker = {"setup": {"modules": ["docker", "command"]}, "docker": {"image": "img"},
              "command": {"cmd": "echo hi from $LEDGER_SLICE_ID/$LEDGER_WORKER_ID", "workers": "all", "env": {}}}
    assert r.setup(JOB, 1, hosts, docker).ok
    r.start(JOB, 1, hosts, {**docker, "setup": {"modules": ["command"]}}, extra_args=[], resume=False, placed=PLACED)
    wait_for(lambda: all(s.state == "exited" for s in r.probe(JOB, 1, hosts).values()))

    def ledger(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ledger", "logs", JOB, "--log-dir", str(tmp_path / "logs"), *args],
                              cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60)

    assert ledger("--slice", "1", "-w", "1").stdout == "hi from 1/1\n"
    assert ledger().stdout == "hi from 0/0\n"
    data = json.loads(ledger("-s", "1", "--json").stdout)
    assert (data["slice"], data["output"], list(data["setup_logs"])) == (1, "hi from 1/0\n", ["docker"])
    bad = ledger("--slice", "2")
    assert bad.returncode == 1 and "slice 1 worker 0" in bad.stderr and "Traceback" not in bad.stderr
