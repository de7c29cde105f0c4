"""`ledger verify`: is the ledger sound? Exit 0 if so, 1 naming the first bad position."""

from __future__ import annotations

from pathlib import Path

import click

from ledger.app.commands.checkpoint import (
    allowed_signers_option,
    checkpoint_ref_option,
    checkpoint_repo_option,
    verify_checkpoints,
)
from ledger.app.commands.common import ProgressBar, print_json, store_from
from ledger.errors import LedgerError
from ledger.replay import load_state, save_snapshot
from ledger.verify import verify_ledger

PROGRESS_FROM = 50_000  # smaller ledgers verify faster than a progress bar draws


class Unsound(LedgerError):
    exit_code = 1


@click.command("verify")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"ok", "events", "head", "problem", "snapshots": [...]} as JSON '
                   '(with --checkpoints, also "checkpoints": {"ok", "checked", "problems", "newest"}).')
@click.option("--rebuild-snapshots", is_flag=True,
              help="Delete every snapshot that fails its checks and save a fresh one built from the events.")
@click.option("--checkpoints", is_flag=True,
              help="Also check the ledger against its published signed checkpoints: detects a ledger "
                   "cut short, restored from an old copy, or rewritten and re-hashed.")
@click.option("--from", "sources", multiple=True, metavar="REF|FILE",
              help="Where the checkpoints are (repeatable; implies --checkpoints): a ref of "
                   "--checkpoint-repo, or a file (`ledger checkpoint --out`, or JSON lines of "
                   "Pub/Sub checkpoint messages). Default: --checkpoint-ref of --checkpoint-repo.")
@checkpoint_repo_option
@checkpoint_ref_option
@allowed_signers_option
@click.pass_context
def verify_cmd(ctx: click.Context, as_json: bool, rebuild_snapshots: bool, checkpoints: bool,
               sources: tuple[str, ...], checkpoint_repo: str | None, checkpoint_ref: str,
               allowed_signers: Path | None) -> None:
    """Check the whole ledger: hash chain, contiguous seq and versions, event schema, and
    legal job transitions; then every snapshot: its own hash, the event it was made from,
    and its state against the state rebuilt from the events. Exit 0 when sound; 1 with the
    first bad position (or the bad snapshot) and why.

    A chain cannot show its own end cut off, or a whole history replaced. With
    --checkpoints, each signed checkpoint published by the reconciler (seq, hash, time,
    signer) is checked too: its signature against the allowed signers, then the ledger
    must reach its seq with the same hash there. Exit 1 names the checkpoint the ledger
    contradicts (or the forged one).

    \b
    ledger verify --checkpoints --checkpoint-repo git@github.com:lab/jobs.git
    ledger verify --from saved/checkpoint --allowed-signers allowed_signers
    """
    store = store_from(ctx)
    total = store.head()
    if total >= PROGRESS_FROM and not as_json:
        with ProgressBar("verifying", total) as bar:

            def walked(n: int) -> None:  # at its end the snapshots made at the head are compared (seconds at 1M)
                bar(n, "verifying" if n < total else "checking the snapshots")

            report, verdicts = verify_ledger(store, progress=walked)
    else:
        report, verdicts = verify_ledger(store)
    # Checkpoints are checked against the events: only once they are sound.
    published = None
    if (checkpoints or sources) and report.ok:
        published = verify_checkpoints(store, sources=sources, repo_url=checkpoint_repo, ref=checkpoint_ref,
                                       allowed_path=allowed_signers, head=report.head)
    bad = [v for v in verdicts if v.problem is not None]
    rebuilt = False
    if bad and rebuild_snapshots:
        for verdict in bad:
            store.delete_snapshot(verdict.snapshot)
        save_snapshot(store, load_state(store, use_snapshot=False))
        rebuilt, bad = True, []
    if as_json:
        contradicted = published is not None and bool(published.bad)
        print_json({**report.to_dict(), "ok": report.ok and not bad and not contradicted,
                    "snapshots": [v.to_dict() for v in verdicts], "snapshots_rebuilt": rebuilt,
                    **({"checkpoints": published.to_dict()} if published is not None else {})})
        if not report.ok or bad or contradicted:
            ctx.exit(1)
        return
    if report.problem is not None:
        raise Unsound(f"ledger unsound at seq {report.problem.position}: {report.problem.reason}",
                      hint="`ledger inspect` the job; export what precedes it to recover")
    if published is not None and published.bad:
        raise Unsound(published.problem())
    if bad:
        others = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise Unsound(f"{bad[0].snapshot.label} is bad: {bad[0].problem}{others}; replay does not use it",
                      hint="`ledger verify --rebuild-snapshots` deletes it and saves one built from the events")
    checked = f", {len(verdicts)} snapshot(s) checked" if verdicts else ""
    if rebuilt:
        checked += "; bad snapshots deleted and a fresh one saved"
    click.echo(f"ok: {report.events} event(s), chain, versions, schema and transitions sound{checked} (head {report.head})")
    if published is not None:
        click.echo(published.summary())
