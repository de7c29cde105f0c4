"""`ledger admit JOB --reason`: an audited override that lets one job past its quotas."""

from __future__ import annotations

import getpass

import click

from ledger.app.commands.reconcile import _append_override
from ledger.events.data import Admitted
from ledger.fold import LIVE


@click.command("admit")
@click.argument("job_id")
@click.option("--reason", required=True, help="Why: kept in the ledger for the audit trail.")
@click.pass_context
def admit_cmd(ctx: click.Context, job_id: str, reason: str) -> None:
    """Let JOB past its user and team quotas (an admin's override, recorded with your name).

    The job is admitted at the reconciler's next pass if the lab's chips allow: the lab's
    quota still holds, and the order of the queue is unchanged. It lasts until the job is
    submitted again. `ledger queue` shows who admitted a job.

    \b
    ledger admit alice/bert --reason "paper deadline, approved by the PI"
    """
    who = getpass.getuser()
    _append_override(ctx, job_id, "admitted", set(LIVE), lambda _: Admitted(reason=reason, by=who, manual=True))
