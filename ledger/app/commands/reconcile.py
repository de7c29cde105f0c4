"""`ledger reconcile` and the audited manual overrides (`cancel`, `resume`, `rerun`).

A reconciler restarted in a crash loop must act within a second of starting: this module
imports only what `reconcile` needs (no rich; `ledger tpus` is in tpus.py)."""

from __future__ import annotations

import getpass
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import click

from ledger import defaults
from ledger.app.commands.checkpoint import (
    checkpoint_ref_option,
    checkpoint_repo_option,
    start_checkpoints,
)
from ledger.app.commands.common import (
    publishing,
    store_from,
    topic_option,
    tpu_access_options,
)
from ledger.app.queueview import LedgerPolicy, PolicyFile
from ledger.app.wiring import Settings, build
from ledger.errors import UsageError, safe_url
from ledger.events import NewEvent, actor
from ledger.events.data import CancelRequested, EventData, Rerun, Resumed
from ledger.fold import BLOCKED, LIVE, JobState, replay
from reconciler.tpu import project_for


@click.command()
@click.option("--once", is_flag=True,
              help="Run passes until nothing more can be done without waiting (a TPU being created is "
                   "awaited; capacity and running commands are not), then exit.")
@click.option("--timeout", type=float, default=None, envvar="LEDGER_ONCE_TIMEOUT",
              help="With --once: exit after SECONDS even if operations are still under way.")
@click.option("--interval", type=float, default=2.0, show_default=True, envvar="LEDGER_INTERVAL",
              help="Seconds between observations when no event wakes the loop.")
@tpu_access_options
@click.option("--secrets-dir", envvar="LEDGER_SECRETS_DIR", type=click.Path(path_type=Path), default=None,
              help="The only place files a spec names (secret://NAME, keys, conda and requirements files) are "
                   "read from: <dir>/<owner>/NAME [default: ~/.local/share/tpu-ledger/secrets; env: LEDGER_SECRETS_DIR].")
@click.option("--log-dir", envvar="LEDGER_LOG_DIR", type=click.Path(path_type=Path), default=None,
              help="Where job and setup logs are kept [env: LEDGER_LOG_DIR].")
@click.option("--id", "holder", envvar="LEDGER_RECONCILER_ID", default=None,
              help="This reconciler's stable id (default: the hostname); its own unfinished intents are resolved at start.")
@click.option("--api-backoff-max", type=float, default=defaults.TPU_BACKOFF_MAX_S, show_default=True,
              envvar="LEDGER_API_BACKOFF_MAX",
              help="Seconds: a zone whose TPU API fails is tried again after a jittered exponential backoff capped "
                   "at this (one call per step, nothing recorded per try); work resumes within it once the API "
                   "answers again [env: LEDGER_API_BACKOFF_MAX].")
@click.option("--orphan-grace", type=float, default=defaults.ORPHAN_GRACE_S, show_default=True,
              help="Seconds before a labelled node no job holds is deleted.")
@click.option("--lease-ttl", type=float, default=15.0, show_default=True, envvar="LEDGER_LEASE_TTL",
              help="Seconds a reconciler's job leases outlive it: several reconcilers on one ledger share "
                   "the jobs, and a dead one's jobs move to the others within this time. 0 = no leases.")
@topic_option
@checkpoint_repo_option
@checkpoint_ref_option
@click.option("--checkpoint-every", type=float, default=60.0, show_default=True, envvar="LEDGER_CHECKPOINT_EVERY",
              help="Seconds between signed checkpoints of the ledger's head (made when it moved, and at "
                   "shutdown), published to --checkpoint-repo and --topic; 0 = at shutdown only.")
@click.option("--policy", "policy_path", envvar="LEDGER_POLICY", default=None, metavar="PATH",
              type=click.Path(path_type=Path),
              help="A .ledger/policy.yaml to enforce (quotas, priority classes, fair share) instead of the one the "
                   "watcher recorded from the branch; read again when it changes, its rules recorded in the "
                   "ledger when they differ [env: LEDGER_POLICY; unset = the ledger's: the branch's file].")
@click.pass_context
def reconcile(ctx: click.Context, once: bool, timeout: float | None, interval: float, project: str, tpu_endpoint: str | None,
              ssh_key: Path | None, ssh_user: str, secrets_dir: Path | None, log_dir: Path | None, holder: str | None,
              api_backoff_max: float, orphan_grace: float,
              lease_ttl: float, topic: str | None, checkpoint_repo: str | None, checkpoint_ref: str,
              checkpoint_every: float, policy_path: Path | None) -> None:
    """Replay the ledger, observe TPUs and hosts, and act on every job.

    Creates TPU VMs or queued resources, sets hosts up over SSH, starts commands, and
    recovers from preemptions and errors by each job's rules. Every action is recorded as
    an intent before and an outcome after, so a restart repairs instead of repeating.

    Jobs are admitted by the policy's quotas, priority classes and fair share, and urgent
    jobs may preempt lower classes (`ledger queue` explains who waits): the policy the
    watcher recorded from the branch's .ledger/policy.yaml, followed as it changes, or the
    file given with --policy.

    \b
    Examples:
      ledger reconcile --tpu-endpoint 127.0.0.1:8470     # run until stopped (SIGTERM)
      ledger reconcile --once --timeout 300              # cron/CI: carry every job as far
                                                         # as it goes now, then exit
      ledger reconcile --interval 2 --policy jobs/.ledger/policy.yaml
    """
    project = project_for(project, tpu_endpoint)
    store = store_from(ctx, create=True)
    settings = Settings(store_url=store.url, project=project, tpu_endpoint=tpu_endpoint,
                        ssh_user=ssh_user, interval=interval, orphan_grace_s=orphan_grace, lease_ttl_s=lease_ttl,
                        api_backoff_max_s=api_backoff_max)
    # The sharing rules in force, followed at every pass: by default the ones the watcher
    # recorded from the branch's policy file; with --policy, that file's, recorded in the
    # ledger when they differ (`ledger queue` and `inspect` explain by the ledger's).
    source = PolicyFile(policy_path, store.url, holder or settings.holder) if policy_path else LedgerPolicy(store.url)
    policy = source()
    store.close()
    if ssh_key:
        settings.ssh_key = ssh_key
    settings.secrets_dir = secrets_dir
    if log_dir:
        settings.log_dir = log_dir
    if holder:
        settings.holder = holder
    settings.policy = policy

    def report(action, result) -> None:
        click.echo(f"{action.kind} {action.job_id or '-'}: {result}")

    rec = build(settings, on_action=report, policy_source=source)
    checkpoints = start_checkpoints(settings.store_url, settings.ssh_key, settings.holder, repo=checkpoint_repo,
                                    ref=checkpoint_ref, project=project, topic=topic, every=checkpoint_every)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    click.echo(f"reconciling {safe_url(settings.store_url)} against {tpu_endpoint or 'Google Cloud'} (project {project}) "
               f"as {settings.holder}")
    try:
        with publishing(settings.store_url, project, topic):
            rec.run(once=once, stop=stop, timeout=timeout)
    except KeyboardInterrupt:
        stop.set()
    finally:
        rec.drain(timeout=60)
        rec.close()
        if checkpoints is not None:  # the last one covers the last outcomes recorded above
            last = checkpoints.close()
            if last is not None:
                click.echo(f"{last.checkpoint.label}: published to {', '.join(last.sent) or 'nowhere'}")


def _append_override(ctx: click.Context, job_id: str, type_: str, allowed: set[str] | None,
                     data: Callable[[JobState], EventData]) -> None:
    """Record an operator's override on JOB, fenced by the version it was decided on."""
    store = store_from(ctx)
    events = store.read_stream(job_id)
    if not events:
        raise UsageError(f"no job {job_id!r} in {store.url}", hint="see `ledger list` for job ids")
    job = replay(events).jobs[job_id]
    if allowed is not None and job.state not in allowed:
        raise UsageError(f"job {job_id} is {job.state}; {type_} applies to {', '.join(sorted(allowed))}")
    who = actor("cli", getpass.getuser(), manual=True)
    store.append(job_id, [NewEvent(type_, data(job), who)], expected_version=job.version)
    click.echo(f"{type_} recorded for {job_id} by {who['name']}")


def _next_attempt(again: type[Resumed | Rerun]) -> Callable[[JobState], EventData]:
    # The TPU is re-created (reapply): a manual restart should not depend on a TPU that failed.
    return lambda job: again(attempt=job.attempt + 1, restarts=job.restarts, rule="manual", reapply=True)


@click.command()
@click.argument("job_id")
@click.option("--reason", required=True, help="Why: kept in the ledger for the audit trail.")
@click.pass_context
def cancel(ctx: click.Context, job_id: str, reason: str) -> None:
    """Cancel a job now (emergency override; deleting its spec in git is the normal way)."""
    _append_override(ctx, job_id, "cancel_requested", set(LIVE), lambda _: CancelRequested(reason=reason, manual=True))


@click.command()
@click.argument("job_id")
@click.pass_context
def resume(ctx: click.Context, job_id: str) -> None:
    """Run a failed job again from its last checkpoint, with the next attempt number; or try a
    blocked job's TPU again, once what the TPU API refused is fixed (a permission, a quota)."""
    _append_override(ctx, job_id, "resumed", {"failed_final", "failed", "preempted", BLOCKED}, _next_attempt(Resumed))


@click.command()
@click.argument("job_id")
@click.pass_context
def rerun(ctx: click.Context, job_id: str) -> None:
    """Run a job again from scratch (a new attempt, clean working directory)."""
    _append_override(ctx, job_id, "rerun", {"failed_final", "failed", "preempted", "finished", "cancelled", BLOCKED},
                     _next_attempt(Rerun))
