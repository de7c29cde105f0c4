"""`ledger fanout`, `ledger tail`, `ledger notify`: events out of the ledger, as they happen."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from typing import Any

import click
from rich.markup import escape

from ledger import defaults
from ledger.app.commands.common import console, print_json, store_from
from ledger.app.observability.service import Service, metrics_option
from ledger.errors import UsageError, safe_url
from ledger.fanout import pubsub
from ledger.fanout.notifier import Notifier, parse_smtp
from ledger.fanout.publisher import OutboxPublisher
from ledger.fanout.subscriber import PubSubSubscriber, StoreSubscriber, iter_events
from ledger.spec.policy import Policy, load_policy

log = logging.getLogger("tpu_ledger.fanout")
PROJECT_HELP = f"Google Cloud project of the topic [env: LEDGER_PROJECT; default: {defaults.PROJECT}]"
TOPIC_HELP = "Pub/Sub topic of the fan-out [env: LEDGER_PUBSUB_TOPIC; default: ledger-events]"


class Stop(threading.Event):
    """Set by SIGTERM or SIGINT; remembers which, for the shutdown's log line."""

    def __init__(self) -> None:
        super().__init__()
        self.signal: str | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signal = self.signal or signal.Signals(signum).name
        self.set()

    def log_stopping(self, what: str) -> None:
        if self.signal:
            log.info("stopping on %s: %s", self.signal, what, extra={"signal": self.signal})


@click.command("fanout")
@click.option("--project", envvar="LEDGER_PROJECT", default=None, help=PROJECT_HELP)
@click.option("--topic", envvar="LEDGER_PUBSUB_TOPIC", default=None, help=TOPIC_HELP)
@click.option("--subscription", "subscriptions", multiple=True, metavar="NAME",
              help="Also create this ordered subscription if missing (repeatable), so it misses nothing.")
@click.option("--once", is_flag=True, help="Publish the backlog up to the head, wait for acknowledgement, exit.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="With --once: give up after SECONDS.")
@click.option("--batch-size", type=click.IntRange(1, 1000), default=1000, show_default=True,
              help="Events per Publish request (Pub/Sub allows at most 1000).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@metrics_option
@click.pass_context
def fanout_cmd(ctx: click.Context, project: str | None, topic: str | None, subscriptions: tuple[str, ...],
               once: bool, timeout: float, batch_size: int, as_json: bool, metrics_address: str | None) -> None:
    """Publish every ledger event to a Pub/Sub topic (the outbox).

    Reads the ledger from the cursor `fanout:<topic>` stored beside the events, publishes
    each event's envelope as JSON with attributes type, stream, seq and id and the job as
    ordering key, and advances the cursor only after Pub/Sub acknowledged. Stopped or killed,
    it resumes where the acknowledgements end: at least once, nothing skipped. Runs until
    interrupted, or with --once drains the backlog and exits.

    For the emulator: PUBSUB_EMULATOR_HOST=127.0.0.1:8085 ledger fanout --topic ledger-events
    """
    store = store_from(ctx)
    config = pubsub.config_from_env(project, topic)
    publisher = OutboxPublisher(store, config, subscriptions=subscriptions, batch_size=batch_size)
    if not once:  # a long-running command says which ledger it serves (the absolute file)
        log.info("publishing %s to %s", safe_url(store.url), config.topic_path)
    service = Service("fanout", store.url, metrics_address, heartbeat=not once)

    service.gauges(lambda: service.follower.outbox_gauges("fanout", config.topic_path, publisher.cursor))
    try:
        with service:
            if once:
                stats = publisher.run(threading.Event(), until_caught_up=True, deadline=time.monotonic() + timeout)
            else:
                stop = Stop()
                stats = publisher.run(stop)
                stop.log_stopping("the batch under way was acknowledged or will be published again")
    finally:
        publisher.close()
        store.close()
    summary = {"topic": config.topic_path, **stats.as_dict()}
    if as_json:
        print_json(summary)
    elif once:
        click.echo(f"published {stats.published} event(s) to {config.topic_path}; cursor at seq {stats.position}")
    else:
        log.info("stopped: published %d event(s) to %s; cursor at seq %d", stats.published, config.topic_path,
                 stats.position, extra={"published": stats.published, "position": stats.position})


@click.command("tail")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until interrupted.")
@click.option("--type", "types", multiple=True, metavar="T", help="Only events of this type (repeatable).")
@click.option("--job", "jobs", multiple=True, metavar="J", help="Only this job, <owner>/<name> (repeatable).")
@click.option("--since", type=int, default=None, metavar="SEQ",
              help="Start after this seq (store only). Default: head minus --lines.")
@click.option("--lines", "-n", type=click.IntRange(0), default=20, show_default=True,
              help="How many of the ledger's last events to go through first (store only; filters apply).")
@click.option("--subscription", default=None, metavar="NAME",
              help="Read this Pub/Sub subscription instead of the store (created, ordered, if missing).")
@click.option("--project", envvar="LEDGER_PROJECT", default=None, help=PROJECT_HELP)
@click.option("--topic", envvar="LEDGER_PUBSUB_TOPIC", default=None, help=TOPIC_HELP)
@click.option("--json", "as_json", is_flag=True, help="One JSON envelope per line.")
@click.pass_context
def tail_cmd(ctx: click.Context, follow: bool, types: tuple[str, ...], jobs: tuple[str, ...], since: int | None,
             lines: int, subscription: str | None, project: str | None, topic: str | None, as_json: bool) -> None:
    """Print ledger events as they are appended, like `tail -f`.

    From the store by default (every event, in ledger order); with --subscription from
    Pub/Sub (each job's events in order, duplicates dropped by event id).

    \b
    ledger tail -f --job alice/train-7
    ledger tail --type preempted --type failed --json
    """
    source: Any
    if subscription:
        source = PubSubSubscriber(subscription, project=project, topic=topic, types=types, streams=jobs)
    else:
        store = store_from(ctx)
        after = since if since is not None else max(0, store.head() - lines)
        source = StoreSubscriber(store, after=after, types=types, streams=jobs)

    out = console()
    try:
        for event in iter_events(source, follow=follow, idle=0.2 if not subscription else 2.0):
            if as_json:
                click.echo(json.dumps(event.to_dict(), sort_keys=True, ensure_ascii=False))
            else:
                data = escape(json.dumps(event.data, ensure_ascii=False)[:120])
                out.print(f"[dim]{event.seq:>7}[/dim] {event.time[:19]}  [bold]{escape(event.stream)}[/bold] "
                          f"{event.type}  {data}")
    finally:
        source.close()


@click.command("notify")
@click.option("--webhook", envvar="LEDGER_NOTIFY_WEBHOOK", default=None, metavar="URL",
              help="Slack-compatible incoming webhook [env: LEDGER_NOTIFY_WEBHOOK; default: policy notify.webhook]")
@click.option("--smtp", envvar="LEDGER_SMTP", default=None, metavar="HOST:PORT",
              help="SMTP server for emails to job owners [env: LEDGER_SMTP]")
@click.option("--policy", "policy_path", envvar="LEDGER_POLICY", default=None, metavar="PATH",
              help="The jobs repo's .ledger/policy.yaml (owners' addresses, opt-outs) [env: LEDGER_POLICY]")
@click.option("--name", default="default", show_default=True, help="Notifier name: its own cursor in the store.")
@click.option("--follow", "-f", is_flag=True, help="Keep running and notify as events arrive.")
@click.option("--from-start", is_flag=True, help="On a notifier's first run, go through all history (default: from now).")
@click.option("--json", "as_json", is_flag=True, help="Print what was sent as JSON.")
@metrics_option
@click.pass_context
def notify_cmd(ctx: click.Context, webhook: str | None, smtp: str | None, policy_path: str | None, name: str,
               follow: bool, from_start: bool, as_json: bool, metrics_address: str | None) -> None:
    """Tell people when a job is rejected, preempted, failed, finished or cancelled.

    Posts Slack-compatible JSON to a webhook and/or emails the job's owner (addresses and
    per-owner opt-out under `notify:` in .ledger/policy.yaml). Never more than one message
    per event and channel, even across crashes (a crash mid-delivery can lose that one
    message; it is then reported as uncertain, never sent twice).
    """
    # The same reading as `ledger validate` and the watcher; any problem refuses to start.
    policy = load_policy(policy_path).notify if policy_path else Policy().notify
    if not (webhook or policy.webhook or smtp):
        raise UsageError("nothing to notify with", hint="pass --webhook URL and/or --smtp HOST:PORT")
    store = store_from(ctx)
    notifier = Notifier(store, policy, webhook=webhook, smtp=parse_smtp(smtp) if smtp else None,
                        name=name, from_start=from_start)
    if follow:
        log.info("notifying from %s", safe_url(store.url))
    service = Service("notify", store.url, metrics_address, heartbeat=follow)
    service.gauges(lambda: service.follower.outbox_gauges("notify", name, notifier.cursor))
    try:
        with service:
            if follow:
                stop = Stop()
                report = notifier.run(stop)
                stop.log_stopping("the delivery under way was finished")
            else:
                report = notifier.run_once()
    finally:
        store.close()
    if as_json:
        print_json(report.as_dict())
    elif follow:
        log.info("stopped: sent %d, failed %d, uncertain %d; cursor at seq %d", len(report.sent), len(report.failed),
                 len(report.uncertain), report.position, extra={"position": report.position})
    else:
        click.echo(f"sent {len(report.sent)}, failed {len(report.failed)}, uncertain {len(report.uncertain)}; "
                   f"cursor at seq {report.position}")
        for entry in report.failed:
            click.echo(f"failed: seq {entry['seq']} {entry['channel']} {entry['target']}: {entry['error']}", err=True)
