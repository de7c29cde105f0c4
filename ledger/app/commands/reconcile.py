"""`ledger reconcile` (the overrides `cancel`, `resume`, `rerun` and `admit` are in overrides.py).

A reconciler restarted in a crash loop must act within a second of starting: this module
imports only what `reconcile` needs (no rich; `ledger tpus` is in tpus.py)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import click

from ledger import defaults
from ledger.app.commands.checkpoint import (
    checkpoint_ref_option,
    checkpoint_repo_option,
    start_checkpoints,
)
from ledger.app.commands.common import (
    log_archive_option,
    store_from,
    topic_option,
    tpu_access_options,
)
from ledger.app.observability.reconciler import member_lease, observe_reconciler
from ledger.app.observability.service import Service, metrics_option
from ledger.app.queueview import LedgerPolicy, PolicyFile
from ledger.app.wiring import Settings, build
from ledger.errors import safe_url
from ledger.fanout import publishing
from reconciler.joblogs import Collector, CollectorThread, Limits, open_archive
from reconciler.joblogs.bounds import MIB
from reconciler.model import Action
from reconciler.tpu import project_for

log = logging.getLogger("tpu_ledger.reconciler")
DRAIN_S = 60.0  # how long a stopping reconciler waits for its actions in flight (TimeoutStopSec=90 in the unit)


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
@log_archive_option
@click.option("--log-collect-every", type=click.FloatRange(0), default=defaults.LOG_COLLECT_EVERY_S, show_default=True,
              envvar="LEDGER_LOG_COLLECT_EVERY",
              help="Seconds between copies of new job output from --log-dir into --log-archive; 0 = do not collect "
                   "[env: LEDGER_LOG_COLLECT_EVERY].")
@click.option("--log-max-file-mib", type=click.IntRange(1), default=defaults.LOG_MAX_FILE_MIB, show_default=True,
              envvar="LEDGER_LOG_MAX_FILE_MIB",
              help="Collect at most this much of each log file (an attempt's output on one worker) "
                   "[env: LEDGER_LOG_MAX_FILE_MIB].")
@click.option("--log-max-job-mib", type=click.IntRange(1), default=defaults.LOG_MAX_JOB_MIB, show_default=True,
              envvar="LEDGER_LOG_MAX_JOB_MIB",
              help="Collect at most this much of one job, all attempts and workers together: one job cannot fill "
                   "the archive for the others [env: LEDGER_LOG_MAX_JOB_MIB].")
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
@metrics_option
@click.pass_context
def reconcile(ctx: click.Context, once: bool, timeout: float | None, interval: float, project: str, tpu_endpoint: str | None,
              ssh_key: Path | None, ssh_user: str, secrets_dir: Path | None, log_dir: Path | None, log_archive: str | None,
              log_collect_every: float, log_max_file_mib: int, log_max_job_mib: int, holder: str | None,
              api_backoff_max: float, orphan_grace: float,
              lease_ttl: float, topic: str | None, checkpoint_repo: str | None, checkpoint_ref: str,
              checkpoint_every: float, policy_path: Path | None, metrics_address: str | None) -> None:
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
      ledger reconcile --metrics-address 0.0.0.0:9464    # Prometheus scrapes /metrics;
                                                         # probes ask /healthz and /readyz
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

    def report(action: Action, result: str) -> None:
        log.info("%s %s: %s", action.kind, action.job_id or "-", result, extra={"action": action.kind, "result": result})

    rec = build(settings, on_action=report, policy_source=source)
    collector = None
    if log_collect_every > 0:
        limits = Limits(file_bytes=log_max_file_mib * MIB, job_bytes=log_max_job_mib * MIB)
        archive = open_archive(log_archive or defaults.LOG_ARCHIVE, project=project)
        collector = CollectorThread(Collector(settings.log_dir, archive, limits), log_collect_every)
    checkpoints = start_checkpoints(settings.store_url, settings.ssh_key, settings.holder, repo=checkpoint_repo,
                                    ref=checkpoint_ref, project=project, topic=topic, every=checkpoint_every)
    service = Service("reconcile", settings.store_url, metrics_address, lease_held=lambda: member_lease(rec))
    observe_reconciler(service, rec, interval)
    service.start()
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:  # only flags: logging waits for the loop
        received.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    log.info("reconciling %s against %s (project %s) as %s", safe_url(settings.store_url),
             tpu_endpoint or "Google Cloud", project, settings.holder, extra={"holder": settings.holder})
    try:
        with publishing(settings.store_url, project, topic):
            rec.run(once=once, stop=stop, timeout=timeout)
    except KeyboardInterrupt:
        received.append("SIGINT")
        stop.set()
    finally:
        if received:
            log.info("stopping on %s: finishing %d action(s) in flight (at most %.0f s), then releasing the leases",
                     received[0], len(rec.in_flight), DRAIN_S, extra={"signal": received[0], "in_flight": rec.in_flight})
        left = rec.drain(timeout=DRAIN_S)
        if left:
            log.warning("%d action(s) still running after %.0f s (%s): their intents stay without an outcome, "
                        "and whoever holds each job next resolves them", len(left), DRAIN_S, ", ".join(left),
                        extra={"in_flight": left})
        rec.close()
        service.close()
        if collector is not None:  # after the last probes: their output is collected too
            collector.close()
        if checkpoints is not None:  # the last one covers the last outcomes recorded above
            last = checkpoints.close()
            if last is not None:
                log.info("%s: published to %s", last.checkpoint.label, ", ".join(last.sent) or "nowhere")
        if received:
            log.info("stopped", extra={"signal": received[0]})
