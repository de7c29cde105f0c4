"""`ledger demo`: the whole loop on this machine, with no Google Cloud account."""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console

from ledger.app.commands.common import console
from ledger.app.commands.usage import chip_hours
from ledger.app.demo import EXPECTED, JOB_ID, DemoResult, _ledger, run_demo, start_dashboard
from ledger.errors import LedgerError


@click.command()
@click.option("--workdir", type=click.Path(path_type=Path), default=None,
              help="Where the hub, the ledger and the logs go (default: a new temporary folder, kept).")
@click.option("--pubsub/--no-pubsub", default=None,
              help="Fan out through the official Pub/Sub emulator (default: when installed).")
@click.option("--timeout", type=float, default=110.0, show_default=True, help="Give up after this many seconds.")
@click.option("--dashboard", is_flag=True, envvar="LEDGER_DEMO_DASHBOARD",
              help="Also serve `ledger dashboard` over the demo's ledger: its URL is printed first, the pages follow "
                   "the story live, and it stays up for --keep seconds afterwards [env: LEDGER_DEMO_DASHBOARD].")
@click.option("--dashboard-port", type=click.IntRange(0, 65535), default=8900, show_default=True,
              help="With --dashboard: the port on 127.0.0.1 (0 = any free port).")
@click.option("--keep", type=float, default=600.0, show_default=True, metavar="SECONDS",
              help="With --dashboard: how long it stays up after the story (Ctrl-C stops it sooner).")
def demo(workdir: Path | None, pubsub: bool | None, timeout: float, dashboard: bool, dashboard_port: int,
         keep: float) -> None:
    """Run the whole story on local emulators, and check it.

    A jobs hub is laid from the template; alice opens a pull request with a 4-host pod job,
    a steward's approval merges it, and an unreviewed job pushed straight to main is
    rejected. The watcher records the commits, the reconciler creates the TPU on the
    emulator, sets the hosts up over SSH and starts training. Midway the emulator preempts
    the TPU; the reconciler deletes it, creates a new one and resumes from the checkpoint.
    Exits 0 only when every step happened in order and `ledger verify` passes.

    \b
    ledger demo --dashboard            # or: LEDGER_DEMO_DASHBOARD=1 make demo
    """
    out = console()
    workdir = workdir or Path(tempfile.mkdtemp(prefix="tpu-ledger-demo-"))
    out.print(f"[bold]tpu-ledger demo[/] in {workdir}\n")
    site = start_dashboard(workdir, port=dashboard_port) if dashboard else None
    try:
        if site is not None:
            out.print(f"[bold]dashboard:[/] {site.url}/jobs  (watch the story live; the job: {site.url}/jobs/{JOB_ID})\n")
        try:
            result = run_demo(workdir, pubsub=pubsub, say=out.print, timeout=timeout)
        except (RuntimeError, TimeoutError) as exc:
            raise LedgerError(f"demo stopped: {exc}", hint=f"everything it started was stopped; files are in {workdir}") from exc
        out.print()
        _report(out, result)
        if site is not None and keep > 0:
            out.print(f"\n[bold]dashboard:[/] {site.url}/jobs/{JOB_ID} stays up for {keep:.0f} s (Ctrl-C stops it)")
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(keep)
    finally:
        if site is not None:
            site.stop()
    if not result.ok:
        raise SystemExit(1)


def _report(out: Console, result: DemoResult) -> None:
    """What the demo shows once the story is over, and whether it passed."""

    def show(title: str, args: list[str]) -> None:
        shown = _ledger(args, result.store_url)
        out.print(f"[bold]$ {title}[/]")
        click.echo(shown.stdout.rstrip() or shown.stderr.rstrip())
        out.print()

    for title, args in (("ledger inspect " + JOB_ID, ["inspect", JOB_ID]), ("ledger list", ["list"]), ("ledger verify", ["verify"])):
        show(title, args)
    out.print(f"ledger: {result.store_url}")
    out.print(f"logs:   {result.log_dir}/{JOB_ID}/<attempt>/")
    out.print(f"        ledger --store {result.store_url} logs {JOB_ID} --attempt 2 --log-dir {result.log_dir}\n")
    # Last, what it all cost: chip-hours, the preemption and the work it lost.
    show("ledger usage --by job", ["usage", "--by", "job"])
    if result.ok:
        out.print(f"[bold green]demo passed[/] in {result.seconds:.0f} s: {len(EXPECTED)} events in order, "
                  f"attempt {result.attempt} resumed from step {result.resumed_from}, unreviewed job rejected, "
                  f"the preemption's lost work counted from checkpoint step "
                  f"{result.checkpoints[-1][1] if result.checkpoints else '?'} "
                  f"({chip_hours(result.usage.lost_chip_hours) if result.usage else '?'} chip-h)"
                  + (", fanned out over the Pub/Sub emulator" if result.pubsub else ""))
        return
    out.print("[bold red]demo failed[/]:")
    for problem in result.problems:
        out.print(f"  - {problem}")
