"""`ledger verify`: is the ledger sound? Exit 0 if so, 1 naming the first bad position."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from ledger.app.commands.common import print_json, store_from
from ledger.errors import LedgerError
from ledger.store import store_errors
from ledger.verify import verify_store

PROGRESS_FROM = 50_000  # smaller ledgers verify faster than a progress bar draws


class Unsound(LedgerError):
    exit_code = 1


@click.command("verify")
@click.option("--json", "as_json", is_flag=True, help='Print {"ok", "events", "head", "problem"} as JSON.')
@click.pass_context
def verify_cmd(ctx: click.Context, as_json: bool) -> None:
    """Check the whole ledger: hash chain, contiguous seq and versions, event schema, and
    legal job transitions. Exit 0 when sound; 1 with the first bad position and why.
    """
    store = store_from(ctx)
    with store_errors(store.url):
        total = store.head()
        if total >= PROGRESS_FROM and not as_json:
            with Progress(
                TextColumn("verifying"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                console=Console(file=sys.stderr), transient=True,
            ) as bar:
                task = bar.add_task("verify", total=total)
                report = verify_store(store, progress=lambda n: bar.update(task, completed=n))
        else:
            report = verify_store(store)
    if as_json:
        print_json(report.to_dict())
        if not report.ok:
            ctx.exit(1)
        return
    if report.problem is not None:
        raise Unsound(f"ledger unsound at seq {report.problem.position}: {report.problem.reason}",
                      hint="`ledger inspect` the job; export what precedes it to recover")
    click.echo(f"ok: {report.events} event(s), chain, versions, schema and transitions sound (head {report.head})")
