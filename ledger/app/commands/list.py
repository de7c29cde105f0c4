"""`ledger list`: one row per job, filtered by owner or state."""

from __future__ import annotations

import click

from ledger.app.commands.common import console, print_json_items, store_from
from ledger.app.commands.jobtable import print_jobs
from ledger.app.readmodels import release_refused, release_refused_line
from ledger.fold import BLOCKED, LIVE, TERMINAL
from ledger.replay import load_lazy
from ledger.snapshots.jobs import lines_decoder

# What the table reads of each job (jobtable.job_row, readmodels.last_change) and the lines
# after it (the blocked ones' error, release_refused): the rest of a state is not decoded.
_TABLE = lines_decoder(("id", "owner", "state", "attempt", "restarts", "tpu", "times", "last_error"))


@click.command("list")
@click.option("--owner", metavar="USER", help="Only this owner's jobs (the first part of owner/name).")
@click.option("--state", "state_", metavar="STATE", help="Only jobs in this state (pending, running, finished, ...).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of job states.")
@click.pass_context
def list_cmd(ctx: click.Context, owner: str | None, state_: str | None, as_json: bool) -> None:
    """List jobs and their current state.

    \b
    ledger list --owner alice --state running
    """
    if state_ is not None and state_ not in LIVE | TERMINAL:
        raise click.BadParameter(f"{state_!r}; one of {', '.join(sorted(LIVE | TERMINAL))}", param_hint="--state")
    store = store_from(ctx)
    # The newest snapshot's index and the events after it: the jobs are chosen by the index
    # (readmodels.select_jobs' order, by id), and `--json` writes the snapshot's text of each
    # as it is; only the table decodes the jobs it shows.
    state = load_lazy(store)
    ids = state.select(owner=owner, state=state_)
    if as_json:
        print_json_items(state.texts(ids))
        return
    jobs = state.lines(ids, _TABLE)
    print_jobs(jobs, f"{len(jobs)} job(s) at seq {state.position}")
    out = console()
    for job in jobs:  # the TPU API refused it for good: say why, and what to do
        if job.state == BLOCKED:
            out.print(f"{job.id} is blocked: {(job.last_error or {}).get('message', '')} (then `ledger resume {job.id}`)",
                      markup=False)
        elif (refused := release_refused(job)) is not None:
            out.print(f"{job.id}: release refused: {release_refused_line(refused)}", markup=False)
