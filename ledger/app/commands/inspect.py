"""`ledger inspect JOB`: a job's timeline, who asked for what and what happened."""

from __future__ import annotations

from datetime import UTC, datetime

import click
from rich.table import Table

from ledger.app.commands.common import console, print_json, store_from
from ledger.app.commands.usage import accounting_line
from ledger.describe import actor_text, summarize
from ledger.errors import LedgerError
from ledger.usage import job_usage, to_us


@click.command("inspect")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the job's events as a JSON list of full envelopes.")
@click.pass_context
def inspect_cmd(ctx: click.Context, job: str, as_json: bool) -> None:
    """Show JOB's timeline (JOB is owner/name): time, event, who, what; then its usage
    in one line (`ledger usage --by job` explains the figures).

    \b
    ledger inspect alice/bert-pretrain
    ledger inspect alice/bert-pretrain --json | jq '.[].type'
    """
    store = store_from(ctx)
    events = store.read_stream(job)
    if not events:
        raise LedgerError(f"no job {job!r} in the ledger at {store.url}", hint="`ledger list` shows the job ids (owner/name)")
    if as_json:
        print_json([e.to_dict() for e in events])
        return

    table = Table(title=f"{job}: {len(events)} event(s)", title_justify="left")
    for name in ("seq", "time", "event", "actor", "summary"):
        # fold, never ellipsis: a cut actor or reason would hide what the audit trail is for
        table.add_column(name, no_wrap=name in ("time", "event"), overflow="fold")
    for e in events:
        table.add_row(str(e.seq), e.time, e.type, actor_text(e.actor), summarize(e.type, e.data))
    out = console()
    out.print(table)
    usage = job_usage(events, to_us(datetime.now(UTC)))
    if usage is not None:
        out.print(accounting_line(usage))
