"""`ledger tpus`: every TPU the ledger knows, with the job holding it and its hosts' health."""

from __future__ import annotations

import click
from rich.text import Text

from ledger.app.commands.common import console, print_json, print_table, store_from
from ledger.app.readmodels import TpuHealth, health_streams, tpu_health_of_rows, tpu_jobs, tpu_rows
from ledger.replay import load_lazy


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_context
def tpus(ctx: click.Context, as_json: bool) -> None:
    """Every TPU the ledger knows: its state, the job and owner holding it, since when, and
    its hosts' health at the last check (before a start, or `ledger doctor --fix`). A
    multislice job's TPU is listed slice by slice (its queued resource's nodes)."""
    store = store_from(ctx)
    # Read models, not a replay: the jobs from the newest snapshot's index and the events
    # after it, only the TPUs' holders decoded; the hosts' health from the few streams that
    # hold it (readmodels.health_streams).
    state = load_lazy(store)
    holders = state.holders()
    health = tpu_health_of_rows(store.stream_rows(health_streams(holders, state.releasing), TpuHealth.TYPES, state.position)).checks
    rows = tpu_rows(state.jobs(tpu_jobs(holders)), health)
    if as_json:  # the dashboard's /api/tpus answers the same rows; `ledger doctor --json` has the checks
        print_json(rows, plain=True)
        return

    if not rows:
        console().print("no TPU is held or awaited")
        return
    colour = {"healthy": "green", "fixed": "green", "warning": "yellow", "unhealthy": "bold red"}
    cells = []
    for r in rows:
        h = r["health"]
        slice_ = f" (slice {r['slice']} of {r['slices']})" if r["slices"] > 1 else ""
        kind = " ".join(x for x in (r["accelerator"], r["pricing"]) if x)
        cells.append((f"{r['tpu']}{slice_}", r["zone"], kind, "yes" if r["shared"] else "", r["job"], r["owner"],
                      r["job_state"], r["since"], Text(h, style=colour.get(h, ""))))
    print_table(None, ("TPU", "zone", "type", "shared", "job", "owner", "state", "since", "health"), cells)
