"""`ledger queue`: the jobs waiting for TPUs, in the order they will get them, and why each waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ledger.app.commands.common import console, print_json, print_table, store_from
from ledger.app.figures import chip_hours, percent
from ledger.app.queueview import (
    admission_jobs,
    policy_at,
    policy_option,
    queue_rows,
    recent_usage,
    share_rows,
)
from ledger.describe import figure


@click.command("queue")
@policy_option
@click.option("--owner", metavar="USER", help="Only this owner's jobs (their place is still the place in the whole queue).")
@click.option("--tree", is_flag=True, help="Only the fair tree: each team's and user's weight, share and decayed usage.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list, one object per waiting job (with --tree: one per level of the tree).")
@click.pass_context
def queue_cmd(ctx: click.Context, policy_path: Path | None, owner: str | None, tree: bool, as_json: bool) -> None:
    """List waiting jobs in admission order, with why each waits.

    The order is the reconciler's: higher priority first, then the fair tree (the team owed
    the most share for its recent usage first, then within it the user owed the most; usage
    is chip-hours held, decayed by the policy's half-life), then submission order. A job
    waits for its own first blocker: a quota (its user's, a team's or the lab's, chips or
    chip-hours of the week, with the live figures), the lab's chips (capacity: behind the
    first job in line), lower-priority jobs being preempted for it, a shared TPU held by
    another job, or the cloud's capacity; `admitted` means its TPU is asked for at the next
    pass. Below the queue, the tree: each level's weight and share, its decayed usage and
    that usage's share, and share / usage (the higher, the sooner).
    The rules are the ones the reconciler recorded in the ledger; --policy FILE asks "what if".

    \b
    ledger queue --policy jobs/.ledger/policy.yaml
    ledger queue --owner alice
    ledger queue --json | jq '.[] | select(.wait == "quota") | .job'
    ledger queue --tree --json | jq '.[] | select(.level == "team")'
    """
    store = store_from(ctx)
    policy = policy_at(policy_path, store)
    jobs = admission_jobs(store)
    usage = recent_usage(store, policy)
    levels = share_rows(policy, jobs, usage)
    if tree:
        if as_json:
            print_json(levels, plain=True)
        elif levels:
            _print_tree(levels)
        else:
            console().print("no sharing policy: no fair tree")
        return
    rows = queue_rows(store, policy, jobs, usage)
    if owner:
        rows = [r for r in rows if r["owner"] == owner]
    if as_json:
        print_json(rows, plain=True)  # JSON types only: msgspec writes the same bytes
        return
    if not rows:
        console().print("no job is waiting")
    else:
        print_table(f"{len(rows)} waiting job(s)", ("#", "job", "class", "needs", "waits for", "why"),
                    [_queue_row(r) for r in rows])
    if levels and not owner:
        _print_tree(levels)


def _queue_row(r: dict[str, Any]) -> tuple[str, ...]:
    needs = f"{r['chips']} {r['family']}" if r["chips"] is not None else "?"
    why = r["reason"] if not r.get("placement") or r["placement"] in r["reason"] else f"{r['reason']}; {r['placement']}"
    return str(r["position"]), r["job"], f"{r['class']} ({r['priority']})", needs, r["wait"], why


def _print_tree(levels: list[dict[str, Any]]) -> None:
    rows = []
    for lv in levels:
        name = lv["name"] if lv["level"] == "lab" else f"  {lv['name']}" if lv["level"] == "team" else f"    {lv['name']}"
        factor = "-" if lv["fair_share"] is None else f"{lv['fair_share']:.2f}"
        if lv["level"] == "lab":
            factor = ""
        elif lv["fair_share"] is None and lv["weight"]:
            factor = "no usage yet"
        rows.append((name, figure(lv["weight"]), percent(lv["share"]), chip_hours(lv["usage"]), percent(lv["usage_share"]), factor))
    print_table("fair tree: lab -> team -> user, in the order admission serves them",
                ("", "weight", "share", "usage (chip-h)", "usage share", "share / usage"), rows)
