"""`ledger inspect JOB`: a job's timeline, who asked for what and what happened."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime

import click
from rich.console import Console
from rich.table import Table

from ledger.app.commands.common import print_json, store_from
from ledger.app.commands.usage import accounting_line
from ledger.describe import actor_text, summarize
from ledger.errors import LedgerError
from ledger.timeline import Row, compact, wrap
from ledger.usage import POLICY_STREAM, job_usage, to_us


@click.command("inspect")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the job's events as a JSON list of full envelopes.")
@click.option("--wide", is_flag=True,
              help="One table row per event at its full width (for a wide terminal or `less -S`).")
@click.pass_context
def inspect_cmd(ctx: click.Context, job: str, as_json: bool, wide: bool) -> None:
    """Show JOB's timeline (JOB is owner/name): time, event, who, what; then its usage
    in one line (`ledger usage --by job` explains the figures).

    Compact by default: fits the terminal (80 columns in a pipe, or $COLUMNS), each
    event a short head line with its summary wrapped below; ids and hashes are never cut.

    \b
    ledger inspect alice/bert-pretrain
    ledger inspect alice/bert-pretrain --wide | less -S
    ledger inspect alice/bert-pretrain --json | jq '.[].type'
    """
    store = store_from(ctx)
    events = store.read_stream(job)
    if not events:
        raise LedgerError(f"no job {job!r} in the ledger at {store.url}", hint="`ledger list` shows the job ids (owner/name)")
    if as_json:
        print_json([e.to_dict() for e in events])
        return

    title = f"{job}: {len(events)} event(s)"
    rows = [Row(e.seq, e.time, e.type, actor_text(e.actor), summarize(e.type, e.data)) for e in events]
    width = shutil.get_terminal_size().columns
    if not wide:
        click.echo("\n".join(compact(title, rows, width)))
    else:
        _wide_table(title, rows)
    usage = job_usage(events, to_us(datetime.now(UTC)), policy=store.read_stream(POLICY_STREAM))
    if usage is not None:
        line = accounting_line(usage)
        click.echo(line if wide else "\n".join(wrap(line.split(), width, "", 2)))


def _wide_table(title: str, rows: list[Row]) -> None:
    """Every column at its natural width: nothing wraps, nothing is cut."""
    click.echo(title)
    table = Table()
    for name in ("seq", "time", "event", "actor", "summary"):
        table.add_column(name, no_wrap=True)
    for r in rows:
        table.add_row(str(r.seq), r.time, r.type, r.actor, r.summary)
    Console(highlight=False, width=100_000).print(table, crop=False)
