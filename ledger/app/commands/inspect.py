"""`ledger inspect JOB`: a job's timeline, who asked for what and what happened."""

from __future__ import annotations

import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ledger.app.commands.common import print_json, store_from, write_columns
from ledger.app.commands.usage import accounting_line
from ledger.app.queueview import policy_at, policy_option, queue_rows
from ledger.app.readmodels import (
    placement_label,
    placements_of,
    release_refused,
    release_refused_line,
)
from ledger.describe import actor_text, summarize
from ledger.errors import LedgerError
from ledger.fold import JobState, replay
from ledger.spec.policy import Policy
from ledger.store import Reader
from ledger.timeline import Row, compact, wrap
from ledger.usage import POLICY_STREAM, job_usage, to_us


@click.command("inspect")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON object: `events` (the full envelopes) and `waiting` (the job's `ledger queue "
                   "--json` row while it waits for a TPU, else null).")
@click.option("--wide", is_flag=True,
              help="One table row per event at its full width (for a wide terminal or `less -S`).")
@policy_option
@click.pass_context
def inspect_cmd(ctx: click.Context, job: str, as_json: bool, wide: bool, policy_path: Path | None) -> None:
    """Show JOB's timeline (JOB is owner/name): time, event, who, what; then its usage
    in one line (`ledger usage --by job` explains the figures), and for a job waiting for
    a TPU its place in the queue and why it waits (as `ledger queue` says).

    Compact by default: fits the terminal (80 columns in a pipe, or $COLUMNS), each
    event a short head line with its summary wrapped below; ids and hashes are never cut.

    \b
    ledger inspect alice/bert-pretrain
    ledger inspect alice/bert-pretrain --wide | less -S
    ledger inspect alice/bert-pretrain --json | jq '.events[].type'
    ledger inspect alice/bert-pretrain --json | jq -r '.waiting.reason // "not waiting"'
    """
    store = store_from(ctx)
    events = store.read_stream(job)
    if not events:
        raise LedgerError(f"no job {job!r} in the ledger at {store.url}", hint="`ledger list` shows the job ids (owner/name)")
    policy = policy_at(policy_path, store)
    state = replay(events).jobs.get(job)
    refused = release_refused(state)
    if as_json:
        print_json({"job": job, "events": [e.to_dict() for e in events], "waiting": waiting_row(store, job, policy, state),
                    "placements": placements_of(events), "release_refused": refused})
        return

    title = f"{job}: {len(events)} event(s)"
    rows = [Row(e.seq, e.time, e.type, actor_text(e.actor), summarize(e.type, e.data)) for e in events]
    width = shutil.get_terminal_size().columns
    if not wide:
        click.echo("\n".join(compact(title, rows, width)))
    else:
        _wide_table(title, rows)
    placed = placements_of(events)
    if placed:
        line = "placed: " + "; ".join(placement_label(p) for p in placed)
        click.echo(line if wide else "\n".join(wrap(line.split(), width, "", 2)))
    usage = job_usage(events, to_us(datetime.now(UTC)), policy=store.read_stream(POLICY_STREAM))
    if usage is not None:
        line = accounting_line(usage)
        click.echo(line if wide else "\n".join(wrap(line.split(), width, "", 2)))
    if refused is not None:
        line = f"release refused: {release_refused_line(refused)}"
        click.echo(line if wide else "\n".join(wrap(line.split(), width, "", 2)))
    row = waiting_row(store, job, policy, state)
    if row is not None:
        line = f"waiting: #{row['position']} in the queue ({row['class']}, {row['wait']}): {row['reason']}"
        if row.get("placement") and row["placement"] not in row["reason"]:
            line += f"; {row['placement']}"
        click.echo(line if wide else "\n".join(wrap(line.split(), width, "", 2)))


def waiting_row(store: Reader, job: str, policy: Policy | None, state: JobState | None) -> dict[str, Any] | None:
    """The job's row of `ledger queue --json` (its place and why it waits) while it waits
    for a TPU; None otherwise. The text's last line and the JSON's `waiting` both come from it."""
    if state is None or state.tpu is not None or state.terminal:
        return None
    return next((r for r in queue_rows(store, policy) if r["job"] == job), None)



def _wide_table(title: str, rows: list[Row]) -> None:
    """Every column at its natural width: nothing wraps, nothing is cut (a long-running job's
    thousands of events are written as they come, not measured cell by cell by rich)."""
    write_columns(sys.stdout, title, ("seq", "time", "event", "actor", "summary"),
                  [(str(r.seq), r.time, r.type, r.actor, r.summary) for r in rows])
