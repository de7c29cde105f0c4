"""The audited overrides: `ledger cancel`, `resume`, `rerun` and `admit`, signed or not.

Each appends one event to the job's stream, fenced by the version it was decided on. With
`--sign-with KEY`, `ssh-keygen -Y sign` signs a statement of the override (ledger.overrides)
and the signature is checked against the allowed-signers file before anything is recorded;
the event then names the verified principal as its actor and keeps the statement and its
signature. When the policy in force says `overrides: {signatures: required}`, an unsigned
override is refused.
"""

from __future__ import annotations

import base64
import getpass
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import click
from msgspec import UNSET

from ledger.app.commands.checkpoint import (
    allowed_signers_option,
    checkpoint_repo_option,
    load_allowed_signers,
)
from ledger.app.commands.common import store_from
from ledger.app.optiontypes import FC
from ledger.app.queueview import recorded_policy
from ledger.checkpoints import DEFAULT_REF, CheckpointRepo
from ledger.checkpoints.note import utc_seconds
from ledger.checkpoints.signers import AllowedSigners
from ledger.checkpoints.sshsig import SignatureError, SigningKey
from ledger.errors import LedgerError, UsageError
from ledger.events import NewEvent, actor
from ledger.events.data import (
    Admitted,
    CancelRequested,
    EventData,
    OverrideSignature,
    Rerun,
    Resumed,
)
from ledger.fold import BLOCKED, LIVE, JobState, replay
from ledger.overrides import NAMESPACE, SignatureRefused, Statement, recorded, verify
from ledger.spec.layout import ALLOWED_SIGNERS_PATH

SIGN_TIMEOUT_S = 300  # a passphrase or a hardware key's touch may take a while


@dataclass(frozen=True, slots=True)
class Signing:
    key: Path | None
    signer: str | None
    allowed_signers: Path | None
    checkpoint_repo: str | None


def signing_options(func: FC) -> FC:
    """`--sign-with`, `--signer`, `--allowed-signers`, `--checkpoint-repo`: who signs an override."""
    for option in reversed((
        click.option("--sign-with", "sign_with", envvar="LEDGER_SIGNING_KEY", type=click.Path(dir_okay=False, path_type=Path),
                     default=None, metavar="KEY",
                     help="Sign the override with this SSH key (ssh-keygen -Y sign: a private key, or a public key "
                          f"whose private half ssh-agent holds), one {ALLOWED_SIGNERS_PATH} trusts for namespace "
                          f"{NAMESPACE} [env: LEDGER_SIGNING_KEY].",),
        click.option("--signer", envvar="LEDGER_SIGNER", default=None, metavar="PRINCIPAL",
                     help="Who signs, as the allowed-signers file names the key [env: LEDGER_SIGNER; default: the "
                          "one principal the file gives the key]."),
        allowed_signers_option,
        checkpoint_repo_option,
    )):
        func = option(func)
    return func


def _public_key(key: Path) -> bytes:
    """The public half of what --sign-with names: a public key file, the .pub beside a private
    key, or the private key itself (read without a passphrase)."""
    for candidate in (key, Path(f"{key}.pub")):
        try:
            text = candidate.read_text().split()
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) >= 2 and text[0].startswith(("ssh-", "ecdsa-", "sk-")):
            return base64.b64decode(text[1])
    return SigningKey.load(key).public_key


def _ssh_sign(key: Path, message: bytes) -> str:
    binary = shutil.which("ssh-keygen")
    if binary is None:
        raise UsageError("ssh-keygen is not installed", hint="install OpenSSH's client (Debian: openssh-client)")
    try:
        done = subprocess.run([binary, "-q", "-Y", "sign", "-n", NAMESPACE, "-f", str(key)], input=message,
                              capture_output=True, timeout=SIGN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LedgerError(f"ssh-keygen -Y sign with {key} did not finish in {SIGN_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise LedgerError(f"ssh-keygen -Y sign with {key} failed: {said[-1] if said else f'exit {done.returncode}'}",
                          hint="is it the private key (or its .pub with the key in ssh-agent)?")
    return done.stdout.decode()


def _allowed(signing: Signing) -> AllowedSigners:
    repo = CheckpointRepo(signing.checkpoint_repo, DEFAULT_REF) \
        if signing.checkpoint_repo and signing.allowed_signers is None else None
    try:
        return load_allowed_signers(signing.allowed_signers, repo)
    finally:
        if repo is not None:
            repo.close()


def _principal(signing: Signing, allowed: AllowedSigners, public_key: bytes) -> str:
    if signing.signer:
        return signing.signer
    names = allowed.principals_of(public_key, NAMESPACE)
    if len(names) == 1:
        return names[0]
    if not names:
        raise SignatureRefused(f"{allowed.where} does not let the key of {signing.key} sign overrides",
                               hint=f'add it by pull request: PRINCIPAL namespaces="{NAMESPACE}" KEY')
    raise UsageError(f"{allowed.where} names the key {', '.join(names)}", hint="say which with --signer")


def sign_override(signing: Signing, action: str, job: JobState, reason: str) -> OverrideSignature:
    """Sign a statement of the override with ssh-keygen and check it as a reader will."""
    assert signing.key is not None
    allowed = _allowed(signing)
    try:
        principal = _principal(signing, allowed, _public_key(signing.key))
    except SignatureError as exc:
        raise UsageError(f"{signing.key} is not an SSH key: {exc}") from exc
    now = datetime.now(UTC)
    statement = Statement(action=action, job=job.id, version=job.version, reason=reason, signer=principal,
                          time=utc_seconds(now))
    armored = _ssh_sign(signing.key, statement.text())
    return recorded(statement, verify(statement, armored, allowed, time.time()), armored)


def append_override(ctx: click.Context, job_id: str, type_: str, allowed_states: set[str] | None, signing: Signing,
                    data: Callable[[JobState, str, OverrideSignature | None], EventData], reason: str = "") -> None:
    """Record an operator's override on JOB, fenced by the version it was decided on."""
    store = store_from(ctx)
    events = store.read_stream(job_id)
    if not events:
        raise UsageError(f"no job {job_id!r} in {store.url}", hint="see `ledger list` for job ids")
    job = replay(events).jobs[job_id]
    if allowed_states is not None and job.state not in allowed_states:
        raise UsageError(f"job {job_id} is {job.state}; {type_} applies to {', '.join(sorted(allowed_states))}")
    if signing.key is None:
        policy = recorded_policy(store)
        if policy is not None and policy.overrides.signatures:
            raise SignatureRefused(f"the policy in force requires overrides to be signed: {type_} was not recorded",
                                   hint=f"sign it: --sign-with ~/.ssh/id_ed25519 (a key of {ALLOWED_SIGNERS_PATH})")
        signed, who = None, actor("cli", getpass.getuser(), manual=True)
    else:
        signed = sign_override(signing, type_, job, reason)
        who = actor("cli", signed.signer, manual=True, signed=True, key=signed.key)
    store.append(job_id, [NewEvent(type_, data(job, who["name"], signed), who)], expected_version=job.version)
    click.echo(f"{type_} recorded for {job_id} by {who['name']}" + (f" (signature verified, {signed.key})" if signed else ""))


def _signing(sign_with: Path | None, signer: str | None, allowed_signers: Path | None,
             checkpoint_repo: str | None) -> Signing:
    return Signing(sign_with, signer, allowed_signers, checkpoint_repo)


def _next_attempt(again: type[Resumed | Rerun]) -> Callable[[JobState, str, OverrideSignature | None], EventData]:
    # The TPU is re-created (reapply): a manual restart should not depend on a TPU that failed.
    return lambda job, _who, signed: again(attempt=job.attempt + 1, restarts=job.restarts, rule="manual", reapply=True,
                                           signed=signed or UNSET)


@click.command()
@click.argument("job_id")
@click.option("--reason", required=True, help="Why: kept in the ledger for the audit trail.")
@signing_options
@click.pass_context
def cancel(ctx: click.Context, job_id: str, reason: str, **signing: object) -> None:
    """Cancel a job now (emergency override; deleting its spec in git is the normal way).

    \b
    ledger cancel alice/bert --reason "burning quota" --sign-with ~/.ssh/id_ed25519
    """
    append_override(ctx, job_id, "cancel_requested", set(LIVE), _signing(**signing),  # type: ignore[arg-type]
                    lambda _, __, signed: CancelRequested(reason=reason, manual=True, signed=signed or UNSET), reason)


@click.command()
@click.argument("job_id")
@signing_options
@click.pass_context
def resume(ctx: click.Context, job_id: str, **signing: object) -> None:
    """Run a failed job again from its last checkpoint, with the next attempt number; or try a
    blocked job's TPU again, once what the TPU API refused is fixed (a permission, a quota)."""
    append_override(ctx, job_id, "resumed", {"failed_final", "failed", "preempted", BLOCKED}, _signing(**signing),  # type: ignore[arg-type]
                    _next_attempt(Resumed))


@click.command()
@click.argument("job_id")
@signing_options
@click.pass_context
def rerun(ctx: click.Context, job_id: str, **signing: object) -> None:
    """Run a job again from scratch (a new attempt, clean working directory)."""
    append_override(ctx, job_id, "rerun", {"failed_final", "failed", "preempted", "finished", "cancelled", BLOCKED},
                    _signing(**signing), _next_attempt(Rerun))  # type: ignore[arg-type]


@click.command("admit")
@click.argument("job_id")
@click.option("--reason", required=True, help="Why: kept in the ledger for the audit trail.")
@signing_options
@click.pass_context
def admit_cmd(ctx: click.Context, job_id: str, reason: str, **signing: object) -> None:
    """Let JOB past its user and team quotas (an admin's override, recorded with your name).

    The job is admitted at the reconciler's next pass if the lab's chips allow: the lab's
    quota still holds, and the order of the queue is unchanged. It lasts until the job is
    submitted again. `ledger queue` shows who admitted a job.

    \b
    ledger admit alice/bert --reason "paper deadline, approved by the PI"
    """
    append_override(ctx, job_id, "admitted", set(LIVE), _signing(**signing),  # type: ignore[arg-type]
                    lambda _, who, signed: Admitted(reason=reason, by=who, manual=True, signed=signed or UNSET), reason)
