"""`ledger doctor JOB|TPU`: the host checks on every worker, and their safe repairs."""

from __future__ import annotations

import getpass
import uuid
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from ledger import defaults
from ledger.app.commands.common import (
    console,
    print_json,
    print_table,
    store_from,
    tpu_access_options,
)
from ledger.app.wiring import Settings, host_paths, hosts_of, job_keys_of
from ledger.errors import UsageError
from ledger.events import actor
from ledger.fold import JobState
from ledger.placement import slice_nodes
from ledger.replay import load_lazy
from ledger.snapshots.lazy import LazyState
from reconciler.doctor import Doctor, Report, clean, context
from reconciler.keys import ensure_key
from reconciler.model import NodeObs
from reconciler.remote import Host, RemoteRunner
from reconciler.tpu import TpuApi, project_for

REPAIRS = {"kill": "kill it", "rm_lock": "remove the lockfile", "remount": "remount"}
STYLE = {"ok": "green", "warn": "yellow", "fix": "bold yellow", "fail": "bold red"}


def _target(jobs: LazyState, name: str) -> tuple[JobState | None, dict[str, Any] | None]:
    """(the job, the TPU): JOB itself, or the job holding TPU `name`, or the last one that
    held it or asks for it. Found by the ledger's index (`load_lazy`): only the jobs it
    names are decoded, not a lab's every job."""
    if jobs.holds(name):
        job = jobs.job(name)
        if not job.tpu or not job.hosts:
            raise UsageError(f"job {name} holds no TPU now ({job.state})",
                             hint="doctor the TPU by name instead: `ledger doctor TPU --zone ZONE`")
        return job, job.tpu
    holders = sorted(jobs.holders())
    live = [j for j in jobs.jobs(x.id for x in holders if x.held == name and not x.terminal) if j.hosts]
    if live:
        return live[0], live[0].tpu
    named = jobs.jobs(sorted(jobs.releasing({name}) | {x.id for x in holders if name in (x.held, x.wants_shared)}))
    last = max(named, key=lambda j: j.position, default=None)
    return None, ({"name": name, "zone": ((last.spec.get("tpu") or {}).get("zone") if last else None),
                   "shared": bool((last.spec.get("tpu") or {}).get("shared")) if last else False,
                   "last_job": last.id if last else None})


def _hosts_of_tpu(tpu: dict[str, Any], zone: str | None, project: str, endpoint: str | None, user: str) -> list[Host]:
    zone = zone or tpu.get("zone")
    if not zone:
        raise UsageError(f"no job of this ledger names TPU {tpu['name']}'s zone", hint="pass --zone ZONE")
    name = tpu["name"]
    api = TpuApi(project_for(project, endpoint), endpoint)
    try:
        node = api.get_node(zone, name)
        # A multislice TPU is a queued resource whose slices are its nodes (slice_nodes names
        # them in order): no node has its name.
        slices = [node] if node is not None else _slices_of(name, [n for n in api.list_nodes(zone) if n.queued_resource == name])
        if not slices:
            raise UsageError(f"no TPU {name} in {zone} (project {project})", hint="see `ledger tpus`")
        hosts: list[Host] = []
        for s, found in enumerate(slices):
            keys = api.host_keys(zone, found.name)
            for i, h in enumerate(found.hosts):
                within = {"slice": s, "rank": len(hosts)} if len(slices) > 1 else {}
                hosts.append(Host(h["worker"], h["address"], h.get("port", 22), user, keys[i] if i < len(keys) else None,
                                  **within))
    finally:
        api.close()
    return hosts


def _slices_of(name: str, nodes: list[NodeObs]) -> list[NodeObs]:
    """The queued resource `name`'s nodes, slice by slice."""
    by_name = {n.name: n for n in nodes}
    return [by_name[n] for n in slice_nodes({"name": name, "slices": len(nodes)}) if n in by_name]


def _places(hosts: list[Host]) -> dict[int, dict[str, int]]:
    """Where each host the findings name by rank is: its worker within its slice, and the
    slice when the TPU has several (a one-slice TPU's rank is its worker)."""
    several = len({h.slice for h in hosts}) > 1 or any(h.slice for h in hosts)
    return {h.id: ({"slice": h.slice, "worker": h.worker} if several else {"worker": h.worker}) for h in hosts}


def _place_text(place: dict[str, int]) -> str:
    return f"{place['slice']}/{place['worker']}" if "slice" in place else str(place["worker"])


def _print_findings(report: Report, title: str, places: dict[int, dict[str, int]]) -> None:
    sliced = any("slice" in p for p in places.values())
    rows = [(_place_text(places.get(f.worker, {"worker": f.worker})), f.check,
             Text({"fix": "fixable"}.get(f.status, f.status), style=STYLE[f.status]),
             f.message, REPAIRS[f.fix.kind] if f.fix else "")  # a host's words, as text: "[" is no markup
            for f in report.findings]
    print_table(title, ("slice/worker" if sliced else "worker", "check", "status", "finding", "safe repair"), rows)


@click.command("doctor")
@click.argument("target", metavar="JOB|TPU")
@click.option("--worker", "-w", "workers", type=int, multiple=True, help="Only this worker (repeatable; within its slice); default: all.")
@click.option("--slice", "-s", "slice_", type=int, default=None, help="Only this slice of a multislice job; default: every slice.")
@click.option("--fix", is_flag=True, help="Apply the safe repairs, recorded in the job's stream as an audited override.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--zone", default=None, help="The TPU's zone, when no job of the ledger names it.")
@tpu_access_options
@click.option("--host-root", envvar="LEDGER_HOST_ROOT", default=None,
              help="Where the VMs' /dev, /tmp and /proc/mounts are: '' on real VMs (the default), "
                   f"{defaults.EMULATOR_HOST_ROOT} on the emulator's hosts (the default with --tpu-endpoint) [env: LEDGER_HOST_ROOT].")
@click.pass_context
def doctor_cmd(ctx: click.Context, target: str, workers: tuple[int, ...], slice_: int | None, fix: bool, as_json: bool, zone: str | None,
               project: str, tpu_endpoint: str | None, ssh_key: Path | None, ssh_user: str, host_root: str | None) -> None:
    """Check the hosts of a job's TPU (or of a TPU by name) before they fail a start.

    On every worker, in parallel over SSH: which processes hold the TPU devices (/dev/accel*,
    /dev/vfio/*) and libtpu's lockfile, and whose they are by the ledger's records; processes
    of the job's earlier attempts still running; the spec's gcsfuse mount; free disk in the
    working directory and /tmp; python, jax and libtpu versions across workers.

    With --fix, the safe repairs: kill the job's own leftovers and processes of jobs the
    ledger knows have ended (never a live job's), remove a lockfile no process holds,
    remount gcsfuse. Each repair is recorded in the job's stream (intent, then outcome),
    by you, like `ledger cancel`. The reconciler runs the same checks before every start.

    \b
    Examples:
      ledger doctor alice/train-7b                 # every check on every worker
      ledger doctor lab-v4-32 --worker 3 --json    # a shared TPU by name, one worker
      ledger doctor alice/maxtext --slice 1        # one slice of a multislice job
      ledger doctor alice/train-7b --fix           # repair what is safe, recorded
    """
    store = store_from(ctx)
    try:
        jobs = load_lazy(store)  # the snapshot's index + the tail, as `ledger tpus`
        job, tpu = _target(jobs, target)
        settings = Settings(store_url=store.url, project=project or defaults.PROJECT, tpu_endpoint=tpu_endpoint, ssh_user=ssh_user, host_root=host_root)
        if ssh_key:
            settings.ssh_key = ssh_key
        ensure_key(settings.ssh_key)
        hosts = hosts_of(ssh_user, job_keys_of(settings))(job) if job else _hosts_of_tpu(tpu or {}, zone, project, tpu_endpoint, ssh_user)
        if slice_ is not None:
            if slice_ not in {h.slice for h in hosts}:
                raise UsageError(f"no slice {slice_} on {tpu and tpu.get('name')}: it has {len({h.slice for h in hosts})}",
                                 hint="slices count from 0")
            hosts = [h for h in hosts if h.slice == slice_]
        if workers:
            missing = set(workers) - {h.worker for h in hosts}
            if missing:
                raise UsageError(f"no worker {sorted(missing)} on {tpu and tpu.get('name')}: it has {len(hosts)}")
            hosts = [h for h in hosts if h.worker in set(workers)]
        places = _places(hosts)
        last_job = tpu.get("last_job") if tpu else None
        record_on = job or (jobs.job(last_job) if last_job else None)
        if fix and record_on is None:
            raise UsageError(f"no job of this ledger used {target}: there is no stream to record repairs on",
                             hint="repair by hand, or doctor the job that holds it")
        runner = RemoteRunner(private_key_path=settings.ssh_key, known_hosts_path=settings.ssh_key.parent / "known_hosts",
                              log_dir=settings.log_dir, username=ssh_user, retries=2, probe_retries=1)
        doc = Doctor(runner, host_paths(settings))
        try:
            ctx_ = context(store, job, tpu=tpu)
            report = doc.examine(hosts, ctx_)
            repaired: list[dict[str, Any]] = []
            if fix and report.fixable and record_on is not None:
                who = actor("cli", getpass.getuser(), manual=True)
                report, result = clean(doc, store, record_on, hosts, report, ctx_, who, key=f"doctor:{uuid.uuid4().hex}",
                                       reason="ledger doctor --fix")
                repaired = [{**places.get(d["worker"], {"worker": d["worker"]}), "check": d["check"], "done": d["what"]}
                            for d in result.get("done", [])]
        finally:
            doc.close()
            runner.close()
    finally:
        store.close()
    name = (tpu or {}).get("name", target)
    if as_json:
        findings = [{**f, **places.get(f["worker"], {})} for f in report.to_json()["findings"]]
        print_json({"target": target, "job": job.id if job else None, "tpu": name, "health": report.health, "findings": findings,
                    **({"repaired": repaired} if fix else {})})
    else:
        out = console()
        _print_findings(report, f"{name}" + (f" ({job.id}, attempt {job.attempt})" if job else "") + f": {report.health}", places)
        for r in repaired:
            out.print(f"{'slice ' + str(r['slice']) + ' ' if 'slice' in r else ''}worker {r['worker']}: {r['done']}", markup=False)
        if report.fixable and not fix:
            out.print("repairs are safe for the rows marked fixable: run again with --fix")
    if report.failures:
        ctx.exit(1)
