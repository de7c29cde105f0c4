"""`ledger status`: which services live, from their heartbeats in the store."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from ledger import defaults
from ledger.app.commands.common import print_json, store_from
from ledger.errors import safe_url
from ledger.store import open_heartbeats
from ledger.store.heartbeats import DEAD


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="One object per instance (state: alive, dead or stopped).")
@click.option("--check", is_flag=True, help="Exit 1 when an instance is dead (for a cron job or a probe).")
@click.pass_context
def status_cmd(ctx: click.Context, as_json: bool, check: bool) -> None:
    """List every service instance (watch, reconcile, fanout, notify, dashboard) and its last heartbeat.

    Each long-running command writes a heartbeat to the store every few seconds: its host,
    pid, version, when it started, and whether it holds its lease. An instance whose last
    beat is older than the dead threshold is marked dead; one that stopped cleanly, stopped.
    Heartbeats live beside the ledger, not in it.

    \b
    ledger status
    ledger status --json | jq '.[] | select(.state == "dead")'
    ledger status --check || page-the-operator
    """
    store = store_from(ctx)
    url = store.url
    store.close()
    beats = open_heartbeats(url, create=False)
    try:
        rows = [b.to_dict(defaults.HEARTBEAT_DEAD_S) for b in beats.all()]
    finally:
        beats.close()
    if as_json:
        print_json(rows)
    elif not rows:
        click.echo(f"no service has written a heartbeat to {safe_url(url)} yet")
    else:
        width = max(len(r["instance"]) for r in rows)
        click.echo(f"{'INSTANCE':<{width}}  {'COMPONENT':<10} {'STATE':<8} {'LAST BEAT':>10}  {'LEASE':<8} {'VERSION':<8} STARTED")
        for r in rows:
            lease = "-" if r["lease_held"] is None or r["state"] == "stopped" else ("held" if r["lease_held"] else "lost")
            click.echo(f"{r['instance']:<{width}}  {r['component']:<10} {r['state']:<8} {r['age']:>8.1f} s  {lease:<8} "
                       f"{r['version']:<8} {_when(r['started'])}")
        click.echo(f"(dead: no heartbeat for {defaults.HEARTBEAT_DEAD_S:g} s)")
    if check and any(r["state"] == DEAD for r in rows):
        ctx.exit(1)
