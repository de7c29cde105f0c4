"""`ledger checkpoint`, and the checkpoint parts of `ledger reconcile` and `ledger verify`.

A checkpoint is the ledger's head (seq, hash), the time and the signer, signed with the
reconciler's SSH key and published outside the ledger: to a ref of the jobs repository
and to the Pub/Sub topic. `ledger verify --checkpoints` checks the ledger against them.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import click

from ledger import defaults
from ledger.app.commands.common import print_json, store_from
from ledger.app.optiontypes import FC
from ledger.checkpoints import (
    ALLOWED_SIGNERS_PATH,
    DEFAULT_REF,
    NAMESPACE,
    AllowedSigners,
    Checkpointer,
    CheckpointRepo,
    CheckpointThread,
    GitSink,
    PubSubSink,
    SignersError,
    SigningKey,
    Verdict,
    check_all,
    files,
    signers,
)
from ledger.checkpoints.check import REWRITTEN, TRUNCATED
from ledger.checkpoints.gitref import check_ref
from ledger.checkpoints.publish import Sink
from ledger.errors import LedgerError, UsageError
from ledger.fanout import pubsub
from ledger.store.base import Reader
from reconciler.keys import ensure_key


def checkpoint_repo_option(func: FC) -> FC:
    return click.option(
        "--checkpoint-repo", envvar="LEDGER_CHECKPOINT_REPO", default=None, metavar="URL",
        help="Git repository that holds the signed checkpoints: the jobs hub, as `ledger watch "
             "--repo` names it [env: LEDGER_CHECKPOINT_REPO].",
    )(func)


def checkpoint_ref_option(func: FC) -> FC:
    return click.option(
        "--checkpoint-ref", envvar="LEDGER_CHECKPOINT_REF", default=DEFAULT_REF, show_default=True,
        metavar="REF", callback=lambda _c, _p, value: check_ref(value),
        help="The ref of that repository with one commit per checkpoint [env: LEDGER_CHECKPOINT_REF].",
    )(func)


def allowed_signers_option(func: FC) -> FC:
    return click.option(
        "--allowed-signers", envvar="LEDGER_ALLOWED_SIGNERS", type=click.Path(path_type=Path), default=None,
        metavar="FILE",
        help="OpenSSH allowed-signers file of the trusted keys [env: LEDGER_ALLOWED_SIGNERS; default: "
             f"{ALLOWED_SIGNERS_PATH} on the default branch of --checkpoint-repo].",
    )(func)


def default_signer() -> str:
    """The principal a checkpoint names: the reconciler's id (its default is the hostname)."""
    return os.environ.get("LEDGER_RECONCILER_ID") or socket.gethostname()


def _sinks(repo: str | None, ref: str, project: str | None, topic: str | None) -> list[Sink]:
    sinks: list[Sink] = []
    if repo:
        sinks.append(GitSink(repo, ref))
    if topic:
        sinks.append(PubSubSink(pubsub.config_from_env(project, topic)))
    return sinks


def start_checkpoints(store_url: str, key_path: Path, signer: str, *, repo: str | None, ref: str,
                      project: str | None, topic: str | None, every: float) -> CheckpointThread | None:
    """For `ledger reconcile`: checkpoints every `every` seconds and at shutdown, when there is
    somewhere to publish them (a checkpoint repository, a topic); None otherwise."""
    if not repo and not topic:
        return None
    key = SigningKey.load(key_path)  # now: a bad key is a startup error, not a silent thread
    return CheckpointThread(
        store_url, lambda store: Checkpointer(store, key, signer, _sinks(repo, ref, project, topic)), every)


@click.command("checkpoint")
@click.option("--ssh-key", envvar="LEDGER_SSH_KEY", type=click.Path(path_type=Path), default=None,
              help="The reconciler's private key, which signs; created if missing [env: LEDGER_SSH_KEY].")
@click.option("--signer", envvar="LEDGER_RECONCILER_ID", default=None,
              help="The principal the checkpoint names, as the allowed-signers file lists it "
                   "[env: LEDGER_RECONCILER_ID; default: the hostname].")
@checkpoint_repo_option
@checkpoint_ref_option
@click.option("--topic", envvar="LEDGER_PUBSUB_TOPIC", default=None, metavar="TOPIC",
              help="Also publish it on this Pub/Sub topic, the fan-out's, with attribute kind=checkpoint "
                   "[env: LEDGER_PUBSUB_TOPIC].")
@click.option("--project", envvar="LEDGER_PROJECT", default=None,
              help="Google Cloud project of the topic [env: LEDGER_PROJECT].")
@click.option("--out", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Also write the checkpoint to FILE and its signature to FILE.sig.")
@click.option("--allowed-signer", "print_signer", is_flag=True,
              help=f"Print the line that trusts this key in {ALLOWED_SIGNERS_PATH}, and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the checkpoint and where it went as JSON.")
@click.pass_context
def checkpoint_cmd(ctx: click.Context, ssh_key: Path | None, signer: str | None, checkpoint_repo: str | None,
                   checkpoint_ref: str, topic: str | None, project: str | None, out: Path | None,
                   print_signer: bool, as_json: bool) -> None:
    """Sign the ledger's head now and publish it (`ledger reconcile` also does, every
    --checkpoint-every seconds and when it stops).

    The checkpoint is the head's seq and hash, the time and the signer, signed with the
    reconciler's SSH key in OpenSSH's format (namespace tpu-ledger-checkpoint). It goes to
    --checkpoint-repo as a new commit on --checkpoint-ref, to the Pub/Sub --topic, and to
    --out FILE; `ledger verify --checkpoints` then detects a ledger cut short, rolled back
    or rewritten. Trust the key once, by pull request:

    \b
    ledger checkpoint --allowed-signer >> .ledger/allowed_signers   # in the jobs repo
    ledger checkpoint --checkpoint-repo git@github.com:lab/jobs.git
    ledger verify --checkpoints --checkpoint-repo git@github.com:lab/jobs.git
    """
    key_path = ssh_key or defaults.SSH_KEY
    ensure_key(key_path)
    key = SigningKey.load(key_path)
    who = signer or default_signer()
    if print_signer:
        click.echo(AllowedSigners(()).line_for(who, key.public_key, NAMESPACE))
        return
    sinks = _sinks(checkpoint_repo, checkpoint_ref, project, topic)
    if not sinks and out is None:
        raise UsageError("nowhere to publish the checkpoint",
                         hint="give --checkpoint-repo URL (or LEDGER_CHECKPOINT_REPO), --topic, or --out FILE")
    store = store_from(ctx)
    checkpointer = Checkpointer(store, key, who, sinks)
    try:
        outcome = checkpointer.publish(force=True)
    finally:
        checkpointer.close()
    if outcome is None:
        raise LedgerError(f"the ledger at {store.url} is empty: there is no head to sign")
    if out is not None:
        files.write(out, outcome.signed)
        outcome.sent[f"file {out}"] = str(out)
    if as_json:
        print_json(outcome.to_dict())
    else:
        for name, where in outcome.sent.items():
            click.echo(f"{outcome.checkpoint.label}: published to {name} ({where})")
    if outcome.failed:
        raise LedgerError(f"{outcome.checkpoint.label} was not published: {next(iter(outcome.failed.values()))}")


# -- verify --------------------------------------------------------------------------------
@dataclass
class CheckpointReport:
    """What `ledger verify --checkpoints` found: every verdict, the sources read, the head."""

    verdicts: list[Verdict]
    sources: list[str]
    head: int
    bad: list[Verdict] = field(init=False)

    def __post_init__(self) -> None:
        # The ledger contradicting a valid checkpoint comes first: that is the finding.
        # Among each kind, publication order: the first is where the histories part.
        bad = [v for v in self.verdicts if not v.ok]
        self.bad = [v for v in bad if v.kind in (TRUNCATED, REWRITTEN)] + \
                   [v for v in bad if v.kind not in (TRUNCATED, REWRITTEN)]

    @property
    def newest(self) -> Verdict | None:
        sound = [v for v in self.verdicts if v.ok and v.checkpoint is not None]
        return max(sound, key=lambda v: (v.checkpoint.seq, v.checkpoint.time)) if sound else None  # type: ignore[union-attr]

    def problem(self) -> str:
        first = self.bad[0]
        others = f" (and {len(self.bad) - 1} more)" if len(self.bad) > 1 else ""
        if first.kind in (TRUNCATED, REWRITTEN):
            return f"the ledger contradicts {first.label}: {first.kind}: {first.reason}{others}"
        return f"{first.label} is {first.kind}: {first.reason}{others}"

    def summary(self) -> str:
        newest = self.newest
        text = f"checkpoints: {len(self.verdicts)} agree with the ledger"
        if newest is not None and newest.checkpoint is not None:
            text += f"; the newest is the {newest.label}"
            if newest.checkpoint.seq < self.head:
                text += f"; events after seq {newest.checkpoint.seq} are in no checkpoint yet"
        return text

    def to_dict(self) -> dict:
        newest = self.newest
        return {"ok": not self.bad, "checked": len(self.verdicts), "sources": self.sources,
                "problems": [v.to_dict() for v in self.bad],
                "newest": None if newest is None else newest.to_dict()}


def load_allowed_signers(path: Path | None, repo: CheckpointRepo | None) -> AllowedSigners:
    try:
        if path is not None:
            try:
                return signers.parse(path.read_text("utf-8"), str(path))
            except OSError as exc:
                raise UsageError(f"cannot read allowed signers {path}: {exc.strerror}") from exc
        if repo is not None:
            text = repo.default_branch_file(ALLOWED_SIGNERS_PATH)
            if text is None:
                raise UsageError(f"{repo.shown} has no {ALLOWED_SIGNERS_PATH} on its default branch",
                                 hint="add the reconciler's key there by pull request (`ledger checkpoint "
                                      "--allowed-signer`), or pass --allowed-signers FILE")
            return signers.parse(text.decode("utf-8", "replace"), f"{repo.shown} {ALLOWED_SIGNERS_PATH}")
    except SignersError as exc:
        raise UsageError(str(exc), hint="see ALLOWED SIGNERS in ssh-keygen(1)") from exc
    raise UsageError("no allowed signers to check the checkpoints' signatures against",
                     hint="pass --allowed-signers FILE, or --checkpoint-repo URL whose default branch "
                          f"has {ALLOWED_SIGNERS_PATH}")


def verify_checkpoints(store: Reader, *, sources: tuple[str, ...], repo_url: str | None, ref: str,
                       allowed_path: Path | None, head: int | None = None) -> CheckpointReport:
    """Read the published checkpoints (`sources`: files, or refs of `repo_url`; default: `ref`)
    and check each against the ledger and the allowed signers. `head`: the last seq the
    events themselves reach, as verify walked them (default: the store's own head)."""
    repo = CheckpointRepo(repo_url, ref) if repo_url else None
    try:
        published, read = [], []
        for source in sources or (ref,):
            if Path(source).is_file():
                published += files.read(Path(source))
                read.append(source)
            elif source.startswith("refs/"):
                if repo is None:
                    raise UsageError(f"--from {source} is a ref, but no repository is named",
                                     hint="give --checkpoint-repo URL (or LEDGER_CHECKPOINT_REPO)")
                if source == repo.ref:
                    published += repo.history()
                else:
                    with CheckpointRepo(repo.url, source) as other:
                        published += other.history()
                read.append(f"{repo.shown} {source}")
            else:
                raise UsageError(f"--from {source}: no such file, and not a ref (refs/...)")
        if not published:
            raise LedgerError(f"no checkpoint found in {', '.join(read)}: nothing vouches for this ledger",
                              hint="`ledger checkpoint` publishes one; `ledger reconcile --checkpoint-repo` does it "
                                   "regularly. A ref that vanished may have been deleted on purpose")
        allowed = load_allowed_signers(allowed_path, repo)
        head = store.head() if head is None else head
        verdicts = check_all(published, head=head, hash_at=store.hash_at, allowed=allowed)
        return CheckpointReport(verdicts, read, head)
    finally:
        if repo is not None:
            repo.close()
