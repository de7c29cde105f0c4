"""`ledger emulator`: run the local Cloud TPU emulator, and inject faults into a running one."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from emulator import Emulator, Timings
from emulator.control import ControlClient, ControlError
from emulator.gcs import GcsEmulator
from emulator.pubsub import PubSubEmulator
from ledger import defaults
from ledger.app.commands.common import console, print_json, print_table
from ledger.errors import LedgerError, UsageError


def _default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "tpu-ledger", "emulator")


def _control(ctx: click.Context) -> ControlClient:
    params = ctx.find_object(dict) or {}
    url = params.get("emulator_control")
    if not url:
        state = Path(params.get("emulator_state_dir") or _default_state_dir())
        try:
            url = json.loads((state / "emulator.json").read_text())["control"]
        except (OSError, ValueError, KeyError):
            raise LedgerError(
                f"no running emulator found in {state}",
                hint="start one with `ledger emulator`, or pass --control URL / --state-dir DIR",
            ) from None
    return ControlClient(url)


def _call(ctx: click.Context, method: str, *args: Any, **kwargs: Any) -> Any:
    client = _control(ctx)
    try:
        return getattr(client, method)(*args, **kwargs)
    except ControlError as exc:
        raise LedgerError(f"emulator refused: {exc} [{exc.code}]") from None
    except OSError as exc:
        raise LedgerError(f"cannot reach the emulator at {client.url}: {exc}", hint="is `ledger emulator` still running?") from None


@click.group("emulator", invoke_without_command=True)
@click.option("--port", type=int, default=0, envvar="LEDGER_EMULATOR_PORT", show_default=True, help="gRPC port of the TPU API (0 = any free port).")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, envvar="LEDGER_EMULATOR_STATE", help=f"Hosts' sandboxes, faults.jsonl, emulator.json. [default: {_default_state_dir()}]")
@click.option("--control-port", type=int, default=0, help="Port of the HTTP control API (0 = any free port).")
@click.option("--rest-port", type=int, default=0, help="Port of the TPU API over REST, for gcloud (0 = any free port).")
@click.option("--project", envvar="LEDGER_PROJECT", default=defaults.PROJECT, show_default=True, help="Project the printed gcloud settings name (the emulator accepts any).")
@click.option("--control", "control_url", default=None, envvar="LEDGER_EMULATOR_CONTROL", metavar="URL", help="Control URL of a running emulator (for the fault subcommands).")
@click.option("--pubsub/--no-pubsub", default=False, help="Also run the official Pub/Sub emulator and print PUBSUB_EMULATOR_HOST.")
@click.option("--pubsub-port", type=int, default=0, help="Port of the Pub/Sub emulator (0 = any free port).")
@click.option("--create-delay", type=float, default=None, help="Seconds a node takes from CREATING to READY [default: 0.3].")
@click.option("--gcs", "gcs_buckets", multiple=True, metavar="BUCKET",
              help="Also serve a local Cloud Storage (the JSON API the official client uses) with this bucket "
                   "(repeatable), and print STORAGE_EMULATOR_HOST and a --log-archive for it: job logs in gs:// on "
                   "the emulator. Objects live in memory until the emulator stops.")
@click.pass_context
def emulator_group(ctx: click.Context, port: int, state_dir: str | None, control_port: int, rest_port: int, project: str, control_url: str | None, pubsub: bool, pubsub_port: int, create_delay: float | None,
                   gcs_buckets: tuple[str, ...]) -> None:
    """A local Cloud TPU API (google.cloud.tpu.v2 over gRPC and REST) whose TPU hosts are real
    SSH servers on 127.0.0.1, for rehearsing jobs, preemptions included, without quota.

    Without a subcommand, runs in the foreground until Ctrl-C / SIGTERM and prints the
    variables to export, e.g. `export LEDGER_TPU_ENDPOINT=127.0.0.1:PORT`, and those that
    point `gcloud compute tpus ...` at it (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU). Each node's
    network_endpoints[i] is 127.0.0.1 with port = that worker's SSH port; its hosts accept
    the keys in the node's `ssh-keys` metadata and publish host keys as guest attributes.

    gcloud's GA `compute tpus tpu-vm` and `queued-resources` commands work against it once
    the printed CLOUDSDK_* lines are exported in their shell (docs/emulator.md).

    The subcommands drive a running emulator (found through --control, or emulator.json in
    --state-dir):

    \b
      ledger emulator preempt my-node          # now; or --in 30, --rate 2 (per hour)
      ledger emulator capacity us-central2-b v4 0     # zone runs out of v4 chips
      ledger emulator faults --json

    `ledger emulator --gcs lab-logs` also serves Cloud Storage, for a reconciler started
    with the printed STORAGE_EMULATOR_HOST and `--log-archive gs://lab-logs/jobs`.
    """
    ctx.ensure_object(dict)
    ctx.obj["emulator_state_dir"] = state_dir
    ctx.obj["emulator_control"] = control_url
    if ctx.invoked_subcommand is not None:
        return
    _serve(Path(state_dir or _default_state_dir()), port, control_port, rest_port, project, pubsub, pubsub_port, create_delay,
           gcs_buckets)


def _serve(state_dir: Path, port: int, control_port: int, rest_port: int, project: str, pubsub: bool, pubsub_port: int, create_delay: float | None,
           gcs_buckets: tuple[str, ...] = ()) -> None:
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    timings = Timings() if create_delay is None else Timings(create=create_delay)
    emu = Emulator(state_dir, port=port, control_port=control_port, rest_port=rest_port, timings=timings)
    ps: PubSubEmulator | None = None
    gcs: GcsEmulator | None = None
    try:
        try:
            emu.start()
        except OSError as exc:
            raise LedgerError(f"cannot start the emulator: {exc}", hint="pick other ports (--port, --rest-port, --control-port) or 0 for any free one") from None
        out = [
            f"# TPU emulator: gRPC {emu.endpoint}, REST {emu.rest_url}, control {emu.control_url}, state {state_dir}",
            f"export LEDGER_TPU_ENDPOINT={emu.endpoint}",
            f"export LEDGER_EMULATOR_CONTROL={emu.control_url}",
            "# gcloud compute tpus tpu-vm|queued-resources ... against it (GA track only):",
            *(f"export {k}={v}" for k, v in emu.gcloud_env(project).items()),
        ]
        if pubsub:
            ps = PubSubEmulator(state_dir / "pubsub.log", port=pubsub_port)
            try:
                ps.start()
            except (OSError, RuntimeError, TimeoutError) as exc:
                ps = None
                raise LedgerError(f"cannot start the Pub/Sub emulator: {exc}") from None
            out.append(f"export PUBSUB_EMULATOR_HOST={ps.endpoint}")
        if gcs_buckets:
            try:
                gcs = GcsEmulator()
                gcs.start()
            except OSError as exc:
                gcs = None
                raise LedgerError(f"cannot start the Cloud Storage emulator: {exc}") from None
            for bucket in gcs_buckets:
                gcs.create_bucket(bucket)
            out += ["# Cloud Storage for job logs (google-cloud-storage talks to it; no credentials):",
                    f"export STORAGE_EMULATOR_HOST={gcs.url}",
                    f"export LEDGER_LOG_ARCHIVE=gs://{gcs_buckets[0]}/job-logs"]
        out.append("# Ctrl-C or SIGTERM stops it")
        click.echo("\n".join(out))
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    finally:
        if gcs is not None:
            gcs.stop()
        if ps is not None:
            ps.stop()
        emu.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo("# emulator stopped", err=True)


@emulator_group.command("preempt")
@click.argument("node")
@click.option("--in", "after", type=float, default=None, metavar="SECONDS", help="Preempt this many seconds from now.")
@click.option("--rate", type=float, default=None, metavar="PER_HOUR", help="Preempt after a random delay: this many preemptions per hour on average.")
@click.option("--terminate", is_flag=True, help="End in TERMINATED rather than PREEMPTED.")
@click.pass_context
def preempt(ctx: click.Context, node: str, after: float | None, rate: float | None, terminate: bool) -> None:
    """Preempt NODE (its id or full name): hosts die, processes are killed, state PREEMPTED."""
    if after is not None and rate is not None:
        raise UsageError("give --in or --rate, not both")
    delay = _call(ctx, "preempt", node, at=after, rate=rate, state="TERMINATED" if terminate else "PREEMPTED")
    click.echo(f"{node}: preemption {'now' if delay == 0 else f'in {delay:.1f} s'}")


@emulator_group.command("maintenance")
@click.argument("node")
@click.option("--duration", type=float, default=None, help="Seconds the event lasts [default: 1].")
@click.pass_context
def maintenance(ctx: click.Context, node: str, duration: float | None) -> None:
    """Put NODE through a maintenance event: UNHEALTHY_MAINTENANCE, its processes killed."""
    _call(ctx, "maintenance_event", node, duration=duration)
    click.echo(f"{node}: maintenance event started")


@emulator_group.command("capacity")
@click.argument("zone")
@click.argument("family")
@click.argument("chips")
@click.option("--pricing", type=click.Choice(["spot", "preemptible", "ondemand", "reserved"]), default=None,
              help="Only this pricing's chips (spot capacity runs out apart from on-demand); default: the zone's in all.")
@click.pass_context
def capacity(ctx: click.Context, zone: str, family: str, chips: str, pricing: str | None) -> None:
    """Set ZONE's chip capacity for FAMILY (v4, v5p, v5litepod, v6e, ...); CHIPS=default restores it."""
    if chips != "default" and not chips.isdigit():
        raise UsageError(f"CHIPS must be a number of chips or 'default', not {chips!r}")
    _call(ctx, "set_capacity", zone, family, None if chips == "default" else int(chips), pricing)
    click.echo(f"{zone} {family}{' ' + pricing if pricing else ''}: capacity {chips}")


@emulator_group.command("capacity-schedule")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def capacity_schedule(ctx: click.Context, file: Path) -> None:
    """Capacity that comes and goes, from FILE (JSON): a list of steps, or {"repeat_s": S,
    "steps": [...]} to start again every S seconds. A step is {"at": seconds from now,
    "zone", "family", "chips" (null: the default), "pricing" (optional)}.

    \b
      [{"at": 0, "zone": "us-central2-b", "family": "v4", "pricing": "spot", "chips": 0},
       {"at": 60, "zone": "us-central2-b", "family": "v4", "pricing": "spot", "chips": null}]
    """
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the capacity schedule {file}: {exc}", hint="a JSON list of steps") from None
    steps, repeat = (data, None) if isinstance(data, list) else (data.get("steps"), data.get("repeat_s")) if isinstance(data, dict) else (None, None)
    if not isinstance(steps, list):
        raise UsageError(f"{file} is not a capacity schedule", hint='a JSON list of steps, or {"repeat_s": S, "steps": [...]}')
    n = _call(ctx, "capacity_schedule", steps, repeat_s=repeat)
    click.echo(f"{n} capacity step(s) scheduled" + (f", every {repeat:g} s" if repeat else ""))


@emulator_group.command("kill-host")
@click.argument("node")
@click.argument("worker", type=int)
@click.pass_context
def kill_host(ctx: click.Context, node: str, worker: int) -> None:
    """Kill worker WORKER of NODE: its processes die and its SSH port closes."""
    _call(ctx, "kill_host", node, worker)
    click.echo(f"{node}: worker {worker} killed")


@emulator_group.command("stale-process")
@click.argument("node")
@click.argument("worker", type=int)
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="An environment variable the process carries (e.g. LEDGER_JOB_ID=alice/old-run, as a "
                   "child of that job's command would); repeatable.")
@click.option("--no-lock", is_flag=True, help="Hold the devices only, not libtpu's lockfile.")
@click.pass_context
def stale_process(ctx: click.Context, node: str, worker: int, env: tuple[str, ...], no_lock: bool) -> None:
    """Leave a process on WORKER of NODE that holds its TPU devices and outlives its session.

    \b
    Example:
      ledger emulator stale-process my-tpu 0 --env LEDGER_JOB_ID=alice/old-run
    """
    pairs = dict(e.split("=", 1) for e in env if "=" in e)
    if len(pairs) != len(env):
        raise UsageError("--env takes NAME=VALUE")
    pid = _call(ctx, "stale_process", node, worker, env=pairs, lock=not no_lock)
    click.echo(f"{node}: worker {worker}: pid {pid} holds the TPU devices")


@emulator_group.command("stale-lock")
@click.argument("node")
@click.argument("worker", type=int)
@click.pass_context
def stale_lock(ctx: click.Context, node: str, worker: int) -> None:
    """Leave libtpu's lockfile on WORKER of NODE with no process holding it."""
    path = _call(ctx, "stale_lock", node, worker)
    click.echo(f"{node}: worker {worker}: stale lockfile {path}")


@emulator_group.command("unmount")
@click.argument("node")
@click.argument("worker", type=int)
@click.option("--path", default=None, help="The mount point (`~/...` in the host's home); default: every gcsfuse mount.")
@click.pass_context
def unmount(ctx: click.Context, node: str, worker: int, path: str | None) -> None:
    """Drop the gcsfuse mounts of WORKER of NODE, as a dead fuse daemon does."""
    gone = _call(ctx, "unmount", node, worker, path)
    click.echo(f"{node}: worker {worker}: unmounted {', '.join(gone) or 'nothing'}")


@emulator_group.command("fill-disk")
@click.argument("node")
@click.argument("worker", type=int)
@click.option("--free", default="0", show_default=True, help="Bytes `df` reports free, or 'default' for the real disk.")
@click.pass_context
def fill_disk(ctx: click.Context, node: str, worker: int, free: str) -> None:
    """Make the disk of WORKER of NODE read (nearly) full to `df`."""
    try:
        value = None if free == "default" else int(free)
    except ValueError:
        raise UsageError(f"--free must be a number of bytes or 'default', not {free!r}") from None
    _call(ctx, "fill_disk", node, worker, value)
    click.echo(f"{node}: worker {worker}: {'real disk' if value is None else f'{value} bytes free'}")


_CODE_HELP = ("Status code name: UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ABORTED, CANCELLED, RESOURCE_EXHAUSTED, "
              "PERMISSION_DENIED, UNAUTHENTICATED, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION.")
_REASON_HELP = ("google.rpc.ErrorInfo reason sent with it (e.g. QUOTA_EXCEEDED makes RESOURCE_EXHAUSTED a quota, "
                "RATE_LIMIT_EXCEEDED a rate limit; default: the code's usual one).")


@emulator_group.command("fail-creations")
@click.option("-n", "count", type=int, default=1, show_default=True)
@click.option("--zone", default=None)
@click.option("--code", default="INTERNAL", show_default=True, help="The code the operations end with. " + _CODE_HELP)
@click.option("--reason", default="", help=_REASON_HELP)
@click.pass_context
def fail_creations(ctx: click.Context, count: int, zone: str | None, code: str, reason: str) -> None:
    """Make the next N creations (in ZONE, or anywhere) fail inside their operation: the call
    is accepted, the TPU shows CREATING, then it is gone and the operation says why."""
    _call(ctx, "fail_creations", count, zone=zone, code=code, reason=reason)
    click.echo(f"next {count} creation(s) will fail with {code} in their operation")


@emulator_group.command("fail-calls")
@click.argument("method", default="CreateNode")
@click.option("-n", "count", type=int, default=1, show_default=True)
@click.option("--zone", default=None)
@click.option("--code", required=True, help=_CODE_HELP)
@click.option("--reason", default="", help=_REASON_HELP)
@click.pass_context
def fail_calls(ctx: click.Context, method: str, count: int, zone: str | None, code: str, reason: str) -> None:
    """Refuse the next N calls of METHOD (CreateNode, ListNodes, ..., or '*') with CODE.

    \b
    Examples:
      ledger emulator fail-calls CreateNode --code PERMISSION_DENIED
      ledger emulator fail-calls CreateNode --code RESOURCE_EXHAUSTED --reason QUOTA_EXCEEDED -n 3
    """
    _call(ctx, "fail_calls", method, code, n=count, zone=zone, reason=reason)
    click.echo(f"next {count} call(s) of {method} will be refused with {code}")


@emulator_group.command("outage")
@click.argument("mode", type=click.Choice(["refuse", "hang", "off"]))
@click.pass_context
def outage(ctx: click.Context, mode: str) -> None:
    """Take the whole TPU API down (gRPC and REST) until `outage off`: `refuse` answers every
    call UNAVAILABLE, `hang` answers none (callers hit their deadlines)."""
    _call(ctx, "outage", mode)
    click.echo("the TPU API answers again" if mode == "off" else f"the TPU API is down ({mode})")


@emulator_group.command("slow-creations")
@click.argument("seconds")
@click.pass_context
def slow_creations(ctx: click.Context, seconds: str) -> None:
    """Creations take SECONDS from now on ('default' restores the configured delay)."""
    try:
        value = None if seconds == "default" else float(seconds)
    except ValueError:
        raise UsageError(f"SECONDS must be a number or 'default', not {seconds!r}") from None
    _call(ctx, "slow_creations", value)
    click.echo(f"creations take {seconds} s")


@emulator_group.command("fail-next-operation")
@click.option("--code", default="INTERNAL", show_default=True)
@click.option("--message", default=None)
@click.pass_context
def fail_next_operation(ctx: click.Context, code: str, message: str | None) -> None:
    """The next mutating call's operation ends with an error and changes nothing."""
    _call(ctx, "fail_next_operation", code, message)
    click.echo(f"next operation will fail with {code}")


@emulator_group.command("faults")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def faults(ctx: click.Context, as_json: bool) -> None:
    """The faults injected so far, with timestamps."""
    items = _call(ctx, "faults")
    if as_json:
        print_json(items)
        return

    print_table(None, ("time", "fault", "details"), [
        (f["iso"], f["fault"], ", ".join(f"{k}={v}" for k, v in f.items() if k not in ("time", "iso", "fault")))
        for f in items])


@emulator_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Nodes, queued resources and capacity overrides of the running emulator."""
    st = _call(ctx, "status")
    if as_json:
        print_json(st)
        return

    print_table(None, ("node", "type", "state", "health", "ssh ports"),
                [(n["name"], n["accelerator_type"], n["state"], n["health"], ",".join(map(str, n["ports"]))) for n in st["nodes"]])
    for q in st["queued_resources"]:
        console().print(f"queued resource {q['name']}: {q['state']}")
