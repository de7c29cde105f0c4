"""`ledger queue`: the jobs waiting for TPUs, in the order they will get them, and why each waits."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from ledger.app.commands.common import console, print_json, store_from
from ledger.app.queueview import policy_at, policy_option, queue_rows


@click.command("queue")
@policy_option
@click.option("--owner", metavar="USER", help="Only this owner's jobs (their place is still the place in the whole queue).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per waiting job.")
@click.pass_context
def queue_cmd(ctx: click.Context, policy_path: Path | None, owner: str | None, as_json: bool) -> None:
    """List waiting jobs in admission order, with why each waits.

    The order is the reconciler's: higher priority first, then fair share (the owner with
    the least recent usage, decayed by the policy's half-life), then submission order.
    A job waits because it is over a quota (user, team or lab, with the numbers), because
    the lab's chips of its family are in use (capacity), because lower-priority jobs are
    being preempted for it, because a shared TPU is held by another job, or because the
    cloud has no capacity; `admitted` means its TPU is asked for at the next pass.
    The rules are the ones the reconciler recorded in the ledger; --policy FILE asks "what if".

    \b
    ledger queue --policy jobs/.ledger/policy.yaml
    ledger queue --owner alice
    ledger queue --json | jq '.[] | select(.wait == "quota") | .job'
    """
    store = store_from(ctx)
    rows = queue_rows(store, policy_at(policy_path, store))
    if owner:
        rows = [r for r in rows if r["owner"] == owner]
    if as_json:
        print_json(rows)
        return
    if not rows:
        console().print("no job is waiting")
        return
    table = Table("#", "job", "class", "needs", "waits for", "why", title=f"{len(rows)} waiting job(s)")
    for r in rows:
        needs = f"{r['chips']} {r['family']}" if r["chips"] is not None else "?"
        why = r["reason"] if not r.get("placement") or r["placement"] in r["reason"] else f"{r['reason']}; {r['placement']}"
        table.add_row(str(r["position"]), r["job"], f"{r['class']} ({r['priority']})", needs, r["wait"], why)
    console().print(table)
