"""`ledger replay`: every job's state at the head, or at a past position or time."""

from __future__ import annotations

import contextlib

import click

from ledger.app.commands.common import ProgressBar, print_json, store_from
from ledger.app.commands.jobtable import print_jobs
from ledger.app.queueview import refresh_capacity_snapshot, refresh_usage_snapshot
from ledger.app.readmodels import job_json
from ledger.errors import LedgerError
from ledger.replay import load_state, maybe_snapshot, resolve_until
from ledger.store import store_errors


@click.command("replay")
@click.option("--until", metavar="SEQ|ISO-TIME", help="State as it was at this seq, or at this UTC time (e.g. 2026-03-01T12:00:00Z).")
@click.option("--no-snapshot", is_flag=True, help="Fold every event from the start instead of the newest snapshot plus the events after it.")
@click.option("--json", "as_json", is_flag=True, help='Print {"position": N, "jobs": [...]} instead of a table.')
@click.pass_context
def replay_cmd(ctx: click.Context, until: str | None, no_snapshot: bool, as_json: bool) -> None:
    """Rebuild every job's state from the ledger.

    \b
    ledger replay                         # now
    ledger replay --until 1200            # right after event 1200
    ledger replay --until 2026-03-01T12:00:00Z --json
    """
    store = store_from(ctx)
    position = resolve_until(store, until)
    # A fold from before the oldest snapshot kept (or --no-snapshot) walks every event up to
    # there: seconds at a lab's 1M events, shown as it goes.
    with ProgressBar("replaying", store.head() if position is None else position) as bar:
        state = load_state(store, until=position, use_snapshot=not no_snapshot, progress=None if as_json else bar)
    if position is None and not no_snapshot:
        # A read at the head keeps the next one fast; a read-only ledger still answers.
        with contextlib.suppress(LedgerError), store_errors(store.url):
            maybe_snapshot(store, state)
            refresh_usage_snapshot(store)  # the usage fold's snapshot beside it (ledger queue, usage)
            refresh_capacity_snapshot(store)  # and the capacity memory's (ledger queue)
    jobs = sorted(state.jobs.values(), key=lambda j: j.id)
    if as_json:
        print_json({"position": state.position, "jobs": [job_json(j) for j in jobs]}, plain=True)  # as `ledger list` writes them
        return
    print_jobs(jobs, f"ledger at seq {state.position}: {len(jobs)} job(s)")
