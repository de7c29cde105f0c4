"""`ledger dashboard`: the ledger in a browser, read-only and live (docs/dashboard.md)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from ledger import defaults
from ledger.app.commands.common import log_archive_option, store_from
from ledger.app.dashboard import server
from ledger.app.dashboard.live import LiveLedger
from ledger.app.dashboard.observe import observe_dashboard
from ledger.app.dashboard.views import redact
from ledger.app.observability.service import Service, metrics_option
from ledger.fanout.pubsub import DEFAULT_TOPIC
from reconciler.joblogs import open_archive

log = logging.getLogger("tpu_ledger.dashboard")


@click.command("dashboard")
@click.option("--host", envvar="LEDGER_DASHBOARD_HOST", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the dashboard, which has no "
                   "authentication: put it behind the lab's proxy [env: LEDGER_DASHBOARD_HOST].")
@click.option("--port", envvar="LEDGER_DASHBOARD_PORT", type=click.IntRange(0, 65535), default=8900,
              show_default=True, help="Port to listen on; 0 = any free port [env: LEDGER_DASHBOARD_PORT].")
@click.option("--log-dir", envvar="LEDGER_LOG_DIR", type=click.Path(path_type=Path), default=None,
              help="A reconciler's own log directory on this host, for the job page's log tail [env: LEDGER_LOG_DIR; "
                   "default: $XDG_DATA_HOME/tpu-ledger/logs].")
@log_archive_option
@click.option("--topic", envvar="LEDGER_PUBSUB_TOPIC", default=DEFAULT_TOPIC, show_default=True,
              help="The fan-out's Pub/Sub topic, whose publisher lag the health page shows [env: LEDGER_PUBSUB_TOPIC].")
@click.option("--root-path", envvar="LEDGER_DASHBOARD_ROOT_PATH", default="", metavar="PATH",
              help="Serve every page, asset and API URL below this path, as the lab's reverse proxy does "
                   "(https://lab.example/tpu/ -> --root-path /tpu); the proxy may strip it or pass it on "
                   "[env: LEDGER_DASHBOARD_ROOT_PATH].")
@click.option("--verify-every", type=click.FloatRange(1.0), default=600.0, show_default=True, metavar="SECONDS",
              help="Check the whole ledger (as `ledger verify`) at start, then again as it grows: at most this many "
                   "seconds apart (sooner on a small ledger: a run costs at most ~5% of a core).")
@metrics_option
@click.pass_context
def dashboard_cmd(ctx: click.Context, host: str, port: int, log_dir: Path | None, log_archive: str | None,
                  topic: str, root_path: str, verify_every: float, metrics_address: str | None) -> None:
    """Serve a read-only web dashboard of the ledger, updated live as events are appended.

    Pages: jobs (filter, sort, search), one job (its timeline as a picture, who asked,
    approved and merged, the spec, the events with their hash chain status, the tail of
    worker 0's log), TPUs (who holds what, shared TPUs and their line), usage (chip-hours
    by owner and by week, goodput) and the ledger's health (head, last verify, publisher
    lag, the services' heartbeats). /api/ answers the same in the shapes of the CLI's
    --json. Nothing can be changed from it: every route is GET. /metrics, /healthz and
    /readyz are served on its port (and on --metrics-address too, if given).

    \b
    ledger dashboard                        # http://127.0.0.1:8900/
    ledger dashboard --port 0               # any free port
    ssh -L 8900:127.0.0.1:8900 ledger-host  # then open http://127.0.0.1:8900/ locally
    """
    root = server.root_path(root_path)
    store = store_from(ctx)
    url = store.url
    store.close()
    sock = server.bind(host, port)
    warning = server.exposure_warning(host)
    if warning:
        log.warning("%s", warning.removeprefix("warning: "))
    service = None
    try:
        live = LiveLedger(url, topic=topic, verify_every=verify_every)
        service = observe_dashboard(Service("dashboard", url, metrics_address), live).start()
        logs = defaults.LOG_DIR if log_dir is None else Path(os.path.expanduser(log_dir))
        app = server.create_app(live, store_label=redact(url), log_dir=logs, allowed_hosts=server.hosts_for(host),
                                log_archive=open_archive(log_archive or defaults.LOG_ARCHIVE), root=root, service=service)
        log.info("dashboard of %s: %s  (%d job(s) at seq %d, loaded in %.1f s; read-only; Ctrl-C stops)", redact(url),
                 server.url_of(sock).rstrip("/") + root + "/", live.job_count(), live.position, live.loaded_in)
        server.serve(app, sock)
        log.info("stopped")
    finally:
        sock.close()
        if service is not None:
            service.close()
