"""`ledger chaos`: run the real watcher and reconcilers under random faults; print the invariants."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from ledger.app.chaos.report import render
from ledger.app.chaos.run import run_chaos
from ledger.app.chaos.scenario import KINDS, Scenario
from ledger.app.commands.common import console, print_json
from ledger.errors import LedgerError, UsageError


@click.command("chaos")
@click.option("--duration", type=click.FloatRange(min=10), default=120.0, show_default=True,
              help="Seconds of the fault window (settling comes after it).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the fault schedule: a run is replayed with its seed.")
@click.option("--jobs", type=click.IntRange(1, 50), default=6, show_default=True, help="Spot jobs committed to the jobs repository.")
@click.option("--store", "store_kind", type=click.Choice(["sqlite", "postgres"]), default="sqlite", show_default=True,
              help="The ledger's backend (the run makes its own: a file, or a fresh schema, dropped at the end "
                   "once its events are exported to WORKDIR/ledger.jsonl for `ledger import`).")
@click.option("--pg-url", envvar="LEDGER_CHAOS_PG", default=None, metavar="URL",
              help="With --store postgres: a database to make the ledger's schema in "
                   "[default: postgresql://postgres@127.0.0.1:5432/postgres; env: LEDGER_CHAOS_PG].")
@click.option("--reconcilers", type=click.IntRange(1, 4), default=None,
              help="Reconciler processes sharing the jobs through leases [default: 1 on SQLite, 2 on PostgreSQL].")
@click.option("--settle", type=float, default=240.0, show_default=True,
              help="Seconds every job may take to end after the window and the work it has left (by its "
                   "checkpoint); a job still live then is stuck.")
@click.option("--faults", "kinds", default=",".join(KINDS), show_default=True,
              help="Comma-separated fault kinds to inject.")
@click.option("--workdir", type=click.Path(path_type=Path), default=None,
              help="Where the ledger, the hub, logs and report.json go (default: a new temporary folder, kept).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def chaos_cmd(duration: float, seed: int, jobs: int, store_kind: str, pg_url: str | None, reconcilers: int | None,
              settle: float, kinds: str, workdir: Path | None, as_json: bool) -> None:
    """Run `ledger watch` and `ledger reconcile` as real processes against the local TPU
    emulator, with spot jobs pushed to a real jobs repository, and inject random faults for
    --duration seconds: kill -9 of a reconciler (every 3-8 s) and of the watcher (15-30 s),
    preemptions and host kills of READY nodes, capacity drops, failed operations and
    creations. Then everything settles, and the invariants are printed as figures:
    double-provisioned samples, orphaned TPU-seconds, jobs finished / failed by rule /
    stuck, events per type, `ledger verify`, time from the last fault to every job settled,
    and release intent -> outcome times under the kill loop.

    Exits 1 when an invariant is broken: a job with two live TPUs at one sample, a TPU left
    after every job let go, an unsound ledger, or a stuck job. docs/reliability.md explains
    the figures.

    \b
    ledger chaos --duration 120 --seed 7
    ledger chaos --store postgres --duration 600 --json > chaos.json
    ledger chaos --faults kill_reconciler,preempt --jobs 3
    """
    chosen = tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise UsageError(f"--faults: unknown kind {', '.join(unknown)}", hint=f"use some of {','.join(KINDS)}")
    scenario = Scenario(duration=duration, seed=seed, jobs=jobs, store=store_kind, settle=settle, kinds=chosen,
                        reconcilers=reconcilers or (2 if store_kind == "postgres" else 1))
    workdir = workdir or Path(tempfile.mkdtemp(prefix="tpu-ledger-chaos-"))
    out = console()
    say = (lambda _: None) if as_json else out.print
    try:
        result = run_chaos(scenario, workdir, pg_url=pg_url, say=say)
    except (RuntimeError, OSError) as exc:
        raise LedgerError(f"chaos run stopped: {exc}", hint=f"everything it started was stopped; files are in {workdir}") from exc
    if as_json:
        print_json({**result.to_dict(), "workdir": str(workdir)})
    else:
        out.print()
        out.print(render(result))
        out.print(f"report: {workdir / 'report.json'}")
    if result.broken():
        raise SystemExit(1)
