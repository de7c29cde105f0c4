"""`ledger doctor` on the emulator's real SSH hosts, one fault per worker: what it says in
JSON, what --fix repairs and records, and what it never touches."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from emulator.control import ControlClient, ControlError
from ledger.app.cli import cli
from ledger.events import NewEvent, actor
from ledger.fold import replay
from ledger.store import open_store
from reconciler.doctor import CHECKS, Context, Doctor, Gate, devices
from tests.doctor.conftest import Pod, make_pod
from tests.emulator.conftest import pid_alive

ZONE = "us-central2-b"
GIT = {"spec_hash": "ab" * 32, "commit": "c0ffee", "path": "jobs/a/b.yaml"}
SPEC = {"tpu": {"accelerator": "v4-32", "zone": ZONE, "pricing": "spot"}, "command": {"cmd": "true"},
        "setup": {"modules": ["gcsfuse", "command"]}, "gcsfuse": {"bucket_name": "data", "mount_path": "~/gcs"}}


def ledger_for(pod: Pod) -> str:
    """alice/train holds the pod; bob/old has ended; carol/live is live (pending)."""
    url = f"sqlite:///{pod.tmp / 'ledger.db'}"
    store = open_store(url)
    git = actor("git", "tester")
    hosts = [{"worker": h.worker, "address": h.address, "port": h.port, "host_key": h.host_key} for h in pod.hosts]
    tpu = {"name": pod.node, "zone": ZONE, "kind": "node", "shared": True, "accelerator": "v4-32"}
    store.append("alice/train", [NewEvent("submitted", {**GIT, "spec": SPEC}, git),
                                 NewEvent("provisioning", {"attempt": 1, "tpu": tpu}, git),
                                 NewEvent("provisioned", {"tpu": tpu, "hosts": hosts}, git)])
    store.append("bob/old", [NewEvent("submitted", {**GIT, "spec": SPEC}, git), NewEvent("cancelled", {"reason": "done"}, git)])
    store.append("carol/live", [NewEvent("submitted", {**GIT, "spec": SPEC}, git)])
    store.close()
    return url


def doctor(pod: Pod, url: str, *args: str):
    res = CliRunner().invoke(cli, ["--store", url, "doctor", *args, "--json", "--project", "proj",
                                   "--tpu-endpoint", pod.emu.endpoint, "--ssh-key", str(pod.tmp / f"id_{pod.node}"),
                                   "--ssh-user", "alice"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, json.loads(res.output)


def statuses(answer: dict) -> dict[tuple[int, str], str]:
    return {(f["worker"], f["check"]): f["status"] for f in answer["findings"] if f["check"] != "versions"}


def test_doctor_json_names_each_fault_and_fix_repairs_only_what_is_safe(pod: Pod):
    url = ledger_for(pod)
    for w in range(4):
        pod.sh(w, "gcsfuse --implicit-dirs data ~/gcs")
    code, healthy = doctor(pod, url, "alice/train")
    assert code == 0 and healthy["health"] == "healthy" and healthy["tpu"] == pod.node
    assert set(statuses(healthy).values()) == {"ok"} and len(healthy["findings"]) == 4 * 6

    pod.emu.stale_lock(pod.node, 0)
    ended = pod.emu.stale_process(pod.node, 1, env={"LEDGER_JOB_ID": "bob/old", "LEDGER_ATTEMPT": "1", "LEDGER_WORKER_ID": "1"})
    pod.emu.unmount(pod.node, 2)
    pod.emu.fill_disk(pod.node, 3, 10 << 20)
    live = pod.emu.stale_process(pod.node, 3, env={"LEDGER_JOB_ID": "carol/live"}, lock=False)

    code, sick = doctor(pod, url, "alice/train")
    found = {k: v for k, v in statuses(sick).items() if v != "ok"}
    assert code == 1 and sick["health"] == "unhealthy"
    assert found == {(0, "libtpu_lock"): "fix", (1, "devices"): "fix", (1, "libtpu_lock"): "fix",
                     (2, "mounts"): "fix", (3, "devices"): "fail", (3, "disk"): "fail"}, sick
    by = {(f["worker"], f["check"]): f for f in sick["findings"]}
    assert by[(1, "devices")]["fix"].startswith(f"killed pid {ended} (bob/old, ended ") and "holding /dev/accel0" in by[(1, "devices")]["fix"]
    assert by[(3, "devices")]["message"].startswith(f"pid {live} (carol/live, pending: a live job)")
    assert by[(3, "disk")]["message"].startswith("only 10.0 MiB free on ~ (a start needs 1.0 GiB); only 10.0 MiB free on /tmp")

    table = CliRunner().invoke(cli, ["--store", url, "doctor", "alice/train", "--project", "proj", "--tpu-endpoint", pod.emu.endpoint,
                                     "--ssh-key", str(pod.tmp / f"id_{pod.node}"), "--ssh-user", "alice"], terminal_width=250)
    assert table.exit_code == 1 and "pod (alice/train, attempt 1): unhealthy" in table.output
    assert "fixable" in table.output and "kill it" in table.output and "run again with --fix" in table.output

    code, fixed = doctor(pod, url, "alice/train", "--fix")
    assert sorted((r["worker"], r["check"]) for r in fixed["repaired"]) == [(0, "libtpu_lock"), (1, "devices"), (1, "libtpu_lock"), (2, "mounts")]
    assert {k: v for k, v in statuses(fixed).items() if v != "ok"} == {(3, "devices"): "fail", (3, "disk"): "fail"}
    assert code == 1 and not pid_alive(ended) and pid_alive(live)  # the live job's process is never touched
    assert not (Path(pod.sh(0, "echo -n $HOME")) / ".vm/tmp/libtpu_lockfile").exists()
    assert pod.sh(2, "mountpoint ~/gcs").strip().endswith("is a mountpoint")

    store = open_store(url)
    events = store.read_stream("alice/train")
    store.close()
    intent, outcome = [e for e in events if e.data.get("action") == "clean"]
    assert intent.actor["manual"] is True and intent.actor["kind"] == "cli" and intent.data["reason"] == "ledger doctor --fix"
    assert outcome.data["ok"] is True and outcome.data["result"]["tpu"] == pod.node
    assert replay(events).jobs["alice/train"].pending_action is None
    shown = CliRunner().invoke(cli, ["--store", url, "inspect", "alice/train"]).output
    assert f"killed pid {ended} (bob/old, ended" in shown and "remounted gs://data on ~/gcs" in shown

    # one worker only, and a TPU by name with no job of the ledger on it
    code, one = doctor(pod, url, "alice/train", "--worker", "3")
    assert {f["worker"] for f in one["findings"]} == {3}
    code, by_name = doctor(pod, url, pod.node, "--zone", ZONE)
    assert by_name["job"] == "alice/train"  # the job holding it


def test_the_faults_over_the_control_api_and_a_stale_process_dies_with_its_vm(pod: Pod):
    control = ControlClient(pod.emu.control_url)
    home = Path(pod.sh(1, "echo -n $HOME"))
    pid = control.stale_process(pod.node, 1, env={"LEDGER_JOB_ID": "x/y"})
    held = {str(home / ".vm/dev" / f"accel{i}") for i in range(4)} | {str(home / ".vm/tmp/libtpu_lockfile")}
    assert {str(Path(f"/proc/{pid}/fd", fd).readlink()) for fd in os.listdir(f"/proc/{pid}/fd")} >= held
    assert b"LEDGER_JOB_ID=x/y" in Path(f"/proc/{pid}/environ").read_bytes()
    assert control.stale_lock(pod.node, 0).endswith("/.vm/tmp/libtpu_lockfile")
    pod.sh(2, "gcsfuse --implicit-dirs data ~/gcs && gcsfuse other ~/more")
    home2 = pod.sh(2, "echo -n $HOME")
    assert control.unmount(pod.node, 2, "~/gcs") == [str((Path(home2) / "gcs").resolve())]
    assert pod.sh(2, "mountpoint ~/gcs; mountpoint ~/more").splitlines() == [
        f"{home2}/gcs is not a mountpoint", f"{home2}/more is a mountpoint"]
    control.fill_disk(pod.node, 3, 5 << 20)
    assert pod.sh(3, "df -Pk ~ | tail -n1").split()[3] == str(5 << 10)
    control.fill_disk(pod.node, 3, None)
    assert pod.sh(3, "df -Pk ~ | tail -n1").split()[0] != "emulated"
    assert [f["fault"] for f in control.faults()][-5:] == ["stale_process", "stale_lock", "unmount", "fill_disk", "fill_disk"]
    try:
        control.stale_lock(pod.node, 9)
        raise AssertionError("worker 9 does not exist")
    except ControlError as exc:
        assert exc.code == "INVALID_ARGUMENT"
    client = pod.emu.client()
    client.delete_node(name=f"projects/proj/locations/us-central2-b/nodes/{pod.node}").result(timeout=60)
    client.transport.close()
    assert not pid_alive(pid)  # the VM went away, and its processes with it


def test_before_a_start_a_host_the_probe_cannot_reach_is_left_to_the_start(pod: Pod):
    url = ledger_for(pod)
    for w in range(4):
        pod.sh(w, "gcsfuse --implicit-dirs data ~/gcs")
    pod.emu.kill_host(pod.node, 3)
    store = open_store(url)
    try:
        job = replay(store.read_stream("alice/train")).jobs["alice/train"]
        health, problem = Gate(pod.doctor)(store, job, pod.hosts, actor("reconciler", "test"))
        code, answer = doctor(pod, url, "alice/train")
    finally:
        store.close()
    # The gate says nothing of worker 3 (the start fails on it as a lost host); the doctor does.
    assert problem is None and health in ("healthy", "warning")
    assert code == 1 and [f["check"] for f in answer["findings"] if f["worker"] == 3] == ["ssh"]


def test_the_find_fallback_sees_the_same_holders_as_the_perl_scan(pod: Pod):
    """A host without perl scans with find: same devices, same holders, same lock."""
    held = pod.emu.stale_process(pod.node, 2, env={"LEDGER_JOB_ID": "bob/old"})
    only_find = tuple(replace(c, probe=lambda paths, ctx: devices.scan(paths, perl=False)) if c.name == "devices" else c
                      for c in CHECKS)
    with_find = Doctor(pod.runner, pod.doctor.paths, checks=only_find)
    try:
        a, b = pod.examine(), with_find.examine(pod.hosts, Context(job_id=None, attempt=0, spec={}))
    finally:
        with_find.close()
    assert a.facts[2].holders == b.facts[2].holders and set(a.facts[2].holders) == {held}
    assert len(a.facts[2].holders[held]) == len(a.facts[2].devices) + 1  # every device and the lockfile
    assert [(f.worker, f.check, f.status) for f in a.findings] == [(f.worker, f.check, f.status) for f in b.findings]


def test_doctor_of_one_slice_names_slice_and_worker(pod: Pod):
    """A multislice TPU (two v4-16 slices, as a queued resource's ms-0 and ms-1): `--slice 1`
    examines slice 1 only, and findings say which slice and which worker within it."""
    from tests.doctor.conftest import make_pod

    key = pod.tmp / f"id_{pod.node}"
    slices = [make_pod(pod.tmp, pod.emu, "v4-16", f"ms-{s}", key_path=key) for s in range(2)]
    try:
        url = f"sqlite:///{pod.tmp / 'ms.db'}"
        store = open_store(url)
        git = actor("git", "tester")
        hosts = [{"worker": h.worker, "address": h.address, "port": h.port, "host_key": h.host_key, "slice": s}
                 for s, p in enumerate(slices) for h in p.hosts]
        tpu = {"name": "ms", "zone": ZONE, "kind": "queued_resource", "shared": True, "accelerator": "v4-16", "slices": 2}
        spec = {**SPEC, "tpu": {**SPEC["tpu"], "accelerator": "v4-16", "slices": 2, "allocation_mode": "queued-resources"},
                "setup": {"modules": ["command"]}}
        store.append("maya/ms", [NewEvent("submitted", {**GIT, "spec": spec}, git),
                                 NewEvent("provisioning", {"attempt": 1, "tpu": tpu}, git),
                                 NewEvent("provisioned", {"tpu": tpu, "hosts": hosts}, git)])
        store.close()
        pod.emu.stale_lock("ms-1", 0)
        code, one = doctor(pod, url, "maya/ms", "--slice", "1")
        assert {f["slice"] for f in one["findings"]} == {1} and {f["worker"] for f in one["findings"]} == {0, 1}
        assert [(f["slice"], f["worker"]) for f in one["findings"] if f["status"] != "ok"] == [(1, 0)]
        assert code == 0 and one["health"] != "healthy"
        code, whole = doctor(pod, url, "maya/ms")
        assert {(f["slice"], f["worker"]) for f in whole["findings"]} == {(0, 0), (0, 1), (1, 0), (1, 1)}
        bad = CliRunner().invoke(cli, ["--store", url, "doctor", "maya/ms", "--slice", "2", "--project", "proj",
                                       "--tpu-endpoint", pod.emu.endpoint, "--ssh-key", str(key), "--ssh-user", "alice"])
        assert bad.exit_code != 0 and "no slice 2 on ms: it has 2" in bad.output
    finally:
        for p in slices:
            p.doctor.close()
            p.runner.close()


def test_a_multislice_tpu_no_job_holds_is_doctored_slice_by_slice(pod: Pod):
    """By name, a multislice TPU is its queued resource: no node has that name, its slices are
    NAME-0 .. NAME-(N-1). Asked for the node, doctor said there was no such TPU."""
    import paramiko

    from tests.reconciler.test_multislice_e2e import two_slices

    key = paramiko.ECDSAKey.from_private_key_file(str(pod.tmp / f"id_{pod.node}"))
    parent = f"projects/proj/locations/{ZONE}"
    client = pod.emu.client()
    try:
        two_slices(client, "tl-ms", parent, {"ssh-keys": f"alice:{key.get_name()} {key.get_base64()} alice@ledger"})
        deadline = time.monotonic() + 60
        while len([n for n in client.list_nodes(parent=parent) if n.name.endswith(("tl-ms-0", "tl-ms-1"))
                   and n.state.name == "READY"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        client.transport.close()
    url = ledger_for(pod)
    _, answer = doctor(pod, url, "tl-ms", "--zone", ZONE)
    assert answer["job"] is None and answer["tpu"] == "tl-ms"
    assert {(f["slice"], f["worker"]) for f in answer["findings"]} == {(0, 0), (1, 0)}
    _, one = doctor(pod, url, "tl-ms", "--zone", ZONE, "--slice", "1")
    assert {(f["slice"], f["worker"]) for f in one["findings"]} == {(1, 0)}


def test_an_earlier_attempts_leftover_is_this_hosts_not_another_hosts_on_the_same_machine(pod: Pod):
    """A clean-clone CI run found it: two tests ran `ledger demo` at once, and one demo's
    start of attempt 2 killed the other's attempt 1 (the same job id) on another emulated
    host: the emulator's hosts share one machine's /proc. A leftover is a process of the job
    started from this host (its LEDGER_WORKDIR under this host's home), as on a TPU VM."""
    other = make_pod(pod.tmp, pod.emu, accel="v4-8", node_id="pod2", key_path=pod.tmp / f"id_{pod.node}")
    try:
        control = ControlClient(pod.emu.control_url)

        def job_env(p: Pod) -> dict[str, str]:
            home = p.sh(0, "echo -n $HOME")
            return {"LEDGER_JOB_ID": "alice/train", "LEDGER_ATTEMPT": "1", "LEDGER_WORKER_ID": "0",
                    "LEDGER_WORKDIR": f"{home}/.tpu-ledger/jobs/alice/train/worker-0/work"}

        mine = control.stale_process(pod.node, 0, env=job_env(pod))
        theirs = control.stale_process(other.node, 0, env=job_env(other))
        report = pod.examine(Context(job_id="alice/train", attempt=2, spec={}))
        found = [f for f in report.findings if f.check == "leftovers"]
        assert [(f.worker, f.status) for f in found if f.status != "ok"] == [(0, "fix")]
        assert f"pid {mine} " in found[0].message and all(f"pid {theirs} " not in f.message for f in found)
        pod.doctor.repair(report, pod.hosts)
        assert not pid_alive(mine) and pid_alive(theirs)
    finally:
        other.doctor.close()
        other.runner.close()
