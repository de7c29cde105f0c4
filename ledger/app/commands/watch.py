"""git -> ledger: `ledger watch`, `ledger ingest`, `ledger plan`, `ledger install-hook`."""

from __future__ import annotations

import getpass
import logging
import signal
import time
from pathlib import Path

import click

from ledger import defaults
from ledger.app.commands.common import console, print_json, print_table, store_from, topic_option
from ledger.app.forgeopts import (
    ForgeSetup,
    forge_options,
    forge_setup,
    listen_address,
    webhook_secret,
)
from ledger.app.observability.health import recent_check
from ledger.app.observability.service import Service, metrics_option
from ledger.app.queueview import would_start
from ledger.app.webhook import WebhookServer
from ledger.errors import LedgerError, UsageError, safe_url
from ledger.fanout import publishing
from ledger.forge.webhook import Action
from ledger.gitops.hook import install_hook
from ledger.gitops.ingest import IngestReport
from ledger.gitops.plan import PlanReport, plan, to_markdown
from ledger.gitops.watch import Watcher
from ledger.store import default_store_url

log = logging.getLogger("tpu_ledger.watch")
REPO_HELP = "Jobs repository: a local path (bare or not) or a remote URL (mirrored locally) [env: LEDGER_REPO]"
BRANCH_HELP = "The protected branch whose commits are approved jobs [env: LEDGER_BRANCH]"


def _summary(report: IngestReport) -> str:
    if report.paused:
        rw = report.rewritten or {}
        return (
            f"paused: {report.branch} was rewritten ({str(rw.get('old_head'))[:12]} -> "
            f"{str(rw.get('new_head'))[:12]}); inspect it, then run `ledger watch --accept-rewrite --once`"
        )
    if not report.commits:
        return f"up to date at {str(report.position)[:12]} ({report.branch})"
    counts = ", ".join(f"{n} {t}" for t, n in sorted(report.counts.items())) or "no job changes"
    return (
        f"ingested {report.commits} commit(s) on {report.branch} up to {str(report.position)[:12]}: "
        f"{counts} ({report.seconds * 1000:.0f} ms)"
    )


@click.command("watch")
@click.option("--repo", "source", envvar="LEDGER_REPO", required=True, help=REPO_HELP)
@click.option("--branch", envvar="LEDGER_BRANCH", default="main", show_default=True, help=BRANCH_HELP)
@click.option("--once", is_flag=True, help="Ingest what is new, then exit (cron, CI).")
@click.option("--interval", envvar="LEDGER_WATCH_INTERVAL", type=float, default=5.0, show_default=True,
              help="Seconds between polls: the backstop behind the file system hint. [env: LEDGER_WATCH_INTERVAL]")
@click.option("--accept-rewrite", is_flag=True,
              help="Accept a rewritten (force-pushed) branch: ingest the net change from the old head to the new one.")
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
              help="Where mirrors of remote repositories live [default: ~/.cache/tpu-ledger/mirrors].")
@click.option("--no-watchdog", is_flag=True, help="Poll only; no file system hints.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per ingest.")
@click.option("--project", envvar="LEDGER_PROJECT", default=defaults.PROJECT, show_default=True,
              help="Google Cloud project of the Pub/Sub topic [env: LEDGER_PROJECT].")
@topic_option
@forge_options
@click.option("--webhook-listen", envvar="LEDGER_WEBHOOK_LISTEN", default=None,
              help="HOST:PORT to receive the forge's webhook on: a push or a merged pull request is ingested at once "
                   "[env: LEDGER_WEBHOOK_LISTEN].")
@click.option("--webhook-secret-file", type=click.Path(dir_okay=False, path_type=Path),
              envvar="LEDGER_WEBHOOK_SECRET_FILE", default=None,
              help="The webhook's shared secret [env: LEDGER_WEBHOOK_SECRET_FILE; or the secret in LEDGER_WEBHOOK_SECRET].")
@click.option("--webhook-forge", type=click.Choice(["github", "gitlab"]), envvar="LEDGER_WEBHOOK_FORGE",
              default="github", show_default=True, help="Who sends the webhook [env: LEDGER_WEBHOOK_FORGE].")
@metrics_option
@click.pass_context
def watch_cmd(ctx: click.Context, source: str, branch: str, once: bool, interval: float,
              accept_rewrite: bool, cache_dir: Path | None, no_watchdog: bool, as_json: bool,
              project: str, topic: str | None, forge: str | None, forge_repo: str | None, forge_url: str | None,
              forge_token_file: Path | None, web_flow_keys: Path | None, webhook_listen: str | None,
              webhook_secret_file: Path | None, webhook_forge: str, metrics_address: str | None) -> None:
    """Turn every new commit on BRANCH into ledger events, exactly once.

    Each commit's diff of jobs/ against its first parent becomes events: an added spec is
    `submitted`, a changed one `spec_updated`, a deleted one `cancel_requested`, an invalid
    or unapproved one `rejected` (see .ledger/policy.yaml). The position lives in the ledger,
    so restarting, or running two watchers, never appends anything twice.

    A force-pushed branch pauses ingestion (`history_rewritten`) until you run
    `ledger watch --repo R --accept-rewrite --once`.

    On GitHub: `--forge github` records each merged pull request's approving reviews
    (and can require them: `approval.reviews` in the policy), and `--webhook-listen`
    ingests a push or a merged pull request as soon as GitHub delivers it.

    \b
    Examples:
      ledger watch --repo /srv/git/jobs.git
      ledger watch --repo git@github.com:lab/jobs.git --interval 30
      ledger watch --repo /srv/git/jobs.git --once --json
      LEDGER_FORGE_TOKEN=... ledger watch --repo https://github.com/lab/jobs.git --forge github \\
          --forge-repo lab/jobs --webhook-listen 0.0.0.0:8731 --webhook-secret-file /etc/tpu-ledger/hook
    """
    if interval <= 0:
        raise UsageError("--interval must be positive", hint="e.g. --interval 5")
    store = store_from(ctx, create=True)
    out = console()

    def show(report: IngestReport) -> None:
        if as_json:
            print_json(report.to_dict())
        elif once:
            out.print(_summary(report))
        else:  # the service logs what it ingested
            log.info("%s", _summary(report), extra={"commits": report.commits, "position": report.position})

    setup = forge_setup(forge, forge_repo, forge_url, forge_token_file, web_flow_keys)
    watcher = Watcher(source, store, branch, interval=interval, cache_dir=cache_dir,
                      use_watchdog=not no_watchdog, accept_rewrite=accept_rewrite,
                      accepted_by=getpass.getuser(), on_report=show, web_flow=setup.web_flow,
                      reviews=setup.forge.reviews if setup.forge else None)
    if once:
        report = watcher.run_once()
        show(report)
        if report.paused:
            raise LedgerError("ingestion is paused by a rewritten branch",
                              hint="check the new history, then rerun with --accept-rewrite")
        return
    receiver = None
    if webhook_listen:
        host, port = listen_address(webhook_listen)
        receiver = WebhookServer(host, port, secret=webhook_secret(webhook_secret_file), branch=branch,
                                 forge=webhook_forge, on_ingest=lambda action: _on_delivery(action, setup, watcher))
    where = f"; webhook on {webhook_listen}" if receiver else ""
    log.info("watching %s (%s) into %s; poll every %g s%s", source, branch, safe_url(store.url), interval, where)
    service = observe_watcher(Service("watch", store.url, metrics_address), watcher)
    received: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        # The ingest under way (one transaction per commit) ends; no new one starts.
        received.append(signal.Signals(signum).name)
        watcher.stop()

    signal.signal(signal.SIGTERM, on_signal)
    try:
        if receiver is not None:
            receiver.start()
        with publishing(store.url, project, topic), service:
            watcher.run()
    except KeyboardInterrupt:
        received.append("SIGINT")
    finally:
        if received:
            log.info("stopping on %s: the ingest under way was finished", received[0], extra={"signal": received[0]})
        watcher.stop()
        if receiver is not None:
            receiver.stop()
        if received:
            log.info("stopped", extra={"signal": received[0]})


def observe_watcher(service: Service, watcher: Watcher) -> Service:
    """The watcher's lag behind the branch, its failed ingests, and readiness: an ingest ran
    through within a few polls (a failing git or store makes it unready)."""
    service.gauges(lambda: {
        "tpu_ledger_watcher_last_success_timestamp_seconds": watcher.last_success,
        "tpu_ledger_watcher_lag_seconds": None if watcher.last_success is None else max(0.0, time.time() - watcher.last_success),
        "tpu_ledger_watcher_errors": watcher.errors,
    })
    max_age = max(defaults.READY_PASS_MIN_S, defaults.READY_PASS_INTERVALS * watcher.interval)
    service.readiness.add("ingest", recent_check("ingest", lambda: watcher.last_success, max_age))
    return service


def _on_delivery(action: Action, setup: ForgeSetup, watcher: Watcher) -> None:
    """A verified delivery: remember a merged pull request's head (saves the forge a call), wake."""
    if action.merged is not None and setup.forge is not None:
        setup.forge.note_merged(*action.merged)
    watcher.wake()


@click.command("ingest")
@click.option("--repo", "source", envvar="LEDGER_REPO", required=True, help=REPO_HELP)
@click.option("--branch", envvar="LEDGER_BRANCH", default="main", show_default=True, help=BRANCH_HELP)
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None, help="Mirror cache for remote URLs.")
@click.option("--quiet", is_flag=True, help="Print nothing unless something goes wrong (hooks).")
@click.option("--json", "as_json", is_flag=True, help="The ingest report as JSON.")
@forge_options
@click.pass_context
def ingest_cmd(ctx: click.Context, source: str, branch: str, cache_dir: Path | None, quiet: bool, as_json: bool,
               forge: str | None, forge_repo: str | None, forge_url: str | None, forge_token_file: Path | None,
               web_flow_keys: Path | None) -> None:
    """Ingest the new commits on BRANCH once (what a post-receive hook runs).

    Same work as one turn of `ledger watch`; safe to run at any time and concurrently with
    a running watcher. `ledger install-hook` wires it into a hub repository.
    """
    store = store_from(ctx, create=True)
    setup = forge_setup(forge, forge_repo, forge_url, forge_token_file, web_flow_keys)
    report = Watcher(source, store, branch, cache_dir=cache_dir, use_watchdog=False, web_flow=setup.web_flow,
                     reviews=setup.forge.reviews if setup.forge else None).run_once()
    if as_json:
        print_json(report.to_dict())
    elif not quiet or report.paused:
        click.echo(_summary(report), err=quiet)


@click.command("plan")
@click.argument("ref", default="HEAD")
@click.option("--repo", default=".", show_default=True, type=click.Path(exists=True, file_okay=False),
              help="The jobs repository (a clone with REF and BRANCH).")
@click.option("--branch", envvar="LEDGER_BRANCH", default="main", show_default=True,
              help="The branch REF would merge into (a local branch, or e.g. origin/main).")
@click.option("--json", "as_json", is_flag=True, help="The plan as one JSON object (same as --format json).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table", show_default=True,
              help="markdown: a pull-request comment (what CI posts on the pull request).")
@click.pass_context
def plan_cmd(ctx: click.Context, ref: str, repo: str, branch: str, as_json: bool, fmt: str) -> None:
    """What merging REF into BRANCH would do: jobs to submit, update and cancel.

    Validates every changed spec, lists TPU types and chips requested (per family), the
    shared TPUs already held by live jobs (when a ledger is reachable), whether each new
    job would start now or wait under the branch's policy (quotas, priorities, fair share;
    with a ledger), and who may still approve each change (its CODEOWNERS or policy approvers, teams expanded, its authors
    left out). Exits 1 when a spec would be rejected, so it serves as a pull-request check.

    \b
    Examples:
      ledger plan                      # HEAD of this clone against main
      ledger plan origin/alice-sweep --branch origin/main --json
      ledger plan HEAD --branch origin/main --format markdown > plan.md
    """
    store = None
    try:
        store = store_from(ctx, create=False)
    except LedgerError:
        store = None  # a PR check in CI has no ledger: plan without the held-TPU column
    report = plan(repo, ref, branch, store=store, admission=would_start(store))
    if as_json or fmt == "json":
        print_json(report.to_dict())
    elif fmt == "markdown":
        click.echo(to_markdown(report), nl=False)
    else:
        _print_plan(report)
    if not report.ok:
        ctx.exit(1)


def _print_plan(report: PlanReport) -> None:

    out = console()
    t = report.totals()
    out.print(f"plan: {report.ref} ({report.head[:12]}) into {report.branch} (base {report.base[:12]})")
    if not report.items and not report.config_changes:
        out.print("no job changes")
        return
    print_table(None, ("action", "job", "path", "tpu", "chips", "notes"), [
        (item.action, item.job or "-", item.path, item.tpu_label(), str(item.chips or ""),
         "; ".join(item.notes("approvers: " + " ".join(item.approvers) if item.approvers else None)))
        for item in report.items])
    if report.config_changes:
        out.print("configuration changed (needs approval under the current policy): " + ", ".join(report.config_changes))
    out.print(f"{t['submit']} to submit, {t['update']} to update, {t['cancel']} to cancel, "
              f"{t['invalid']} invalid; {t['chips']} new chips requested")


@click.command("install-hook")
@click.option("--repo", required=True, type=click.Path(exists=True, file_okay=False),
              help="The hub repository (usually bare) that receives pushes.")
@click.option("--branch", envvar="LEDGER_BRANCH", default="main", show_default=True, help=BRANCH_HELP)
@click.option("--force", is_flag=True, help="Replace a post-receive hook not written by ledger.")
@click.pass_context
def install_hook_cmd(ctx: click.Context, repo: str, branch: str, force: bool) -> None:
    """Install a post-receive hook so each push to BRANCH is ingested before `git push` returns.

    The hook runs `ledger ingest` with this Python and this ledger (--store / LEDGER_STORE);
    a failure never blocks the push, and `ledger watch` catches up at its next poll.
    """
    url = (ctx.find_root().obj or {}).get("store_url") or default_store_url()
    path = install_hook(repo, url, branch, force=force)
    click.echo(f"installed {path} (ingests pushes to {branch} into {url})")
