"""`ledger upgrade`: bring the ledger to this tpu-ledger's on-disk format, explicitly.

Nothing else upgrades a ledger: every other command, service and the dashboard refuses an
older format in one line that names both formats and this command. docs/upgrades.md is the
runbook for a rolling upgrade across hosts."""

from __future__ import annotations

import click

from ledger.app.commands.common import print_json
from ledger.errors import safe_url
from ledger.store import default_store_url, upgrade_store


@click.command("upgrade")
@click.option("--dry-run", is_flag=True,
              help="Run the upgrade in its transaction, then roll it back: proves it would succeed, changes nothing.")
@click.option("--force", is_flag=True,
              help="Upgrade even while leases are held (a reconciler that died without releasing them, "
                   "whose leases have not lapsed yet).")
@click.option("--json", "as_json", is_flag=True, help="Print {store, from, to, upgraded, dry_run} as JSON.")
@click.pass_context
def upgrade_cmd(ctx: click.Context, dry_run: bool, force: bool, as_json: bool) -> None:
    """Upgrade the ledger's on-disk format to this tpu-ledger's (`ledger upgrade --dry-run` names both).

    One transaction: it replaces triggers, indexes and the snapshot cache, never an event;
    a failure or a crash leaves the old format whole. Run it once, after every process of
    the older tpu-ledger on every host (reconcilers, watchers, dashboards, fan-out) has
    stopped: they refuse the new format. While any lease is held (a reconciler still
    running) it refuses, naming the holders. Take a backup first, with the older tpu-ledger
    (`ledger backup DEST`): rolling back means restoring it.

    \b
    ledger upgrade --dry-run     # prints from/to; changes nothing
    ledger upgrade               # prints "upgraded ... from format 3 to 4"
    """
    url = (ctx.find_root().obj or {}).get("store_url") or default_store_url()
    found, to = upgrade_store(url, dry_run=dry_run, force=force)
    upgraded = found != to and not dry_run
    if as_json:
        print_json({"store": safe_url(url), "from": found, "to": to, "upgraded": upgraded, "dry_run": dry_run})
        return
    where = safe_url(url)
    if found == to:
        click.echo(f"ledger {where} is at format {to} already: nothing to upgrade")
    elif dry_run:
        click.echo(f"ledger {where} would be upgraded from format {found} to {to} (dry run: the transaction "
                   "ran and was rolled back)")
    else:
        click.echo(f"upgraded ledger {where} from format {found} to {to}")
