"""`ledger backup DEST` and `ledger restore SOURCE`: the ledger copied while services run,
with a signed checkpoint of its head; loaded back into an empty ledger and proved.

docs/backup.md is the runbook (what else to keep: the reconciler's key, config, job logs)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from ledger import defaults
from ledger.app.commands.checkpoint import (
    allowed_signers_option,
    checkpoint_repo_option,
    default_signer,
    load_allowed_signers,
)
from ledger.app.commands.common import print_json
from ledger.backup import backup, restore
from ledger.checkpoints import DEFAULT_REF, CheckpointRepo, SigningKey
from ledger.store import default_store_url


def _root_url(ctx: click.Context) -> str:
    return (ctx.find_root().obj or {}).get("store_url") or default_store_url()


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


@click.command("backup")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--ssh-key", envvar="LEDGER_SSH_KEY", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The reconciler's private key, which signs the backup's checkpoint [env: LEDGER_SSH_KEY; "
                   "default: ~/.local/share/tpu-ledger/ssh/id_ecdsa].")
@click.option("--signer", envvar="LEDGER_RECONCILER_ID", default=None,
              help="The principal the checkpoint names, as the allowed-signers file lists the key "
                   "[env: LEDGER_RECONCILER_ID; default: the hostname].")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and timing as JSON.")
@click.pass_context
def backup_cmd(ctx: click.Context, dest: Path, ssh_key: Path | None, signer: str | None, as_json: bool) -> None:
    """Copy the ledger into the new folder DEST while the services keep running.

    SQLite: the online backup API, one consistent snapshot of the file. PostgreSQL: pg_dump
    of the ledger's schema (repeatable read; pg_dump of the server's major version or newer).
    Beside the copy: a checkpoint of the copy's head signed with the reconciler's key (the
    key `ledger checkpoint` signs with, trusted in .ledger/allowed_signers) and a manifest
    with the copy's SHA-256. The key itself is never copied: keep it apart (docs/backup.md).

    \b
    ledger backup /backups/ledger-$(date +%F-%H%M)
    ledger --store sqlite:///restored.db restore /backups/ledger-2026-11-25-0300 \\
           --allowed-signers allowed_signers
    """
    key = SigningKey.load((ssh_key or defaults.ssh_key()).expanduser())
    taken = backup(_root_url(ctx), dest, key, signer or default_signer())
    m = taken.manifest
    if as_json:
        print_json({"folder": str(taken.folder), "seconds": round(taken.seconds, 3), "manifest": asdict(m)})
        return
    click.echo(f"backed up {m.source} to {taken.folder} in {taken.seconds:.1f} s: {m.file}, {_megabytes(m.bytes)}, "
               f"head seq {m.head} ({m.head_hash[:12]}), checkpoint signed by {signer or default_signer()} "
               f"with {key.fingerprint}")


@click.command("restore")
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=Path))
@allowed_signers_option
@checkpoint_repo_option
@click.option("--json", "as_json", is_flag=True, help="Print what was restored and verified as JSON.")
@click.pass_context
def restore_cmd(ctx: click.Context, source: Path, allowed_signers: Path | None, checkpoint_repo: str | None,
                as_json: bool) -> None:
    """Load the backup folder SOURCE into the empty ledger --store names, and prove it.

    Refused when that ledger holds any event. The copy's digest is checked first; after
    loading, the ledger is verified as `ledger verify` does, and the backup's checkpoint
    must be signed by a key of the allowed signers and match the restored chain. A restore
    that fails a check leaves nothing behind. Exit 1 naming what failed.

    \b
    ledger --store sqlite:///var/lib/tpu-ledger/ledger.db restore /backups/ledger-2026-11-25-0300 \\
           --checkpoint-repo git@github.com:lab/jobs.git
    """
    repo = CheckpointRepo(checkpoint_repo, DEFAULT_REF) if checkpoint_repo and allowed_signers is None else None
    try:
        allowed = load_allowed_signers(allowed_signers, repo)
    finally:
        if repo is not None:
            repo.close()
    done = restore(source, _root_url(ctx), allowed)
    checkpoint = done.verdict.checkpoint
    if as_json:
        print_json({"url": done.url, "events": done.report.events, "head": done.report.head, "verified": True,
                    "checkpoint": checkpoint.to_dict() if checkpoint else None, "seconds": round(done.seconds, 3),
                    "backup": {"created": done.manifest.created, "source": done.manifest.source}})
        return
    click.echo(f"restored {done.report.events} event(s) into {done.url} in {done.seconds:.1f} s; chain, versions, "
               f"schema and transitions sound; matches the {done.verdict.label}")
