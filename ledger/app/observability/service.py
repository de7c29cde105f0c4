"""What every long-running command runs beside its work: a heartbeat in the store and, with
`--metrics-address`, the metrics listener (/metrics, /healthz, /readyz).

    with Service("watch", store_url, address) as service:
        service.gauges(lambda: {...})           # the command's own scrape-time gauges
        service.readiness.add("ingest", ...)    # and readiness checks
        ...run...

Every service gets: `tpu_ledger_build_info`, the events appended by type and the preemption
to re-create histogram (from the ledger's tail), the head and the tail's soundness, and the
readiness checks `store` and `ledger` (plus its own), each also exported as
`tpu_ledger_ready{check}`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import click
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ledger.app.observability.collectors import (
    FollowerCollector,
    InfoCollector,
    JobsCollector,
    JobSources,
    LedgerFollower,
    ValuesCollector,
    gauge,
)
from ledger.app.observability.health import Readiness, sound_check, store_check
from ledger.app.observability.heartbeat import HeartbeatThread
from ledger.app.observability.metrics import COUNTERS, LedgerMetrics
from ledger.app.observability.server import MetricsServer, parse_address
from ledger.app.optiontypes import FC
from ledger.errors import UsageError

METRICS_HELP = ("Serve Prometheus metrics at http://HOST:PORT/metrics, with /healthz (alive) and /readyz (ready: "
                "503 and the failed checks when not); off by default; port 0 = any free port "
                "[env: LEDGER_METRICS_ADDRESS].")


def _checked_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value:
        try:
            parse_address(value)
        except UsageError as exc:
            raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:9464; port 0 = any free port)") from exc
    return value


def metrics_option(func: FC) -> FC:
    """`--metrics-address HOST:PORT` for a long-running command (checked before anything starts)."""
    return click.option("--metrics-address", envvar="LEDGER_METRICS_ADDRESS", default=None, metavar="HOST:PORT",
                        callback=_checked_address, help=METRICS_HELP)(func)


class ReadyCollector(Collector):
    """`tpu_ledger_ready{check}`: the readiness checks, run at the scrape (they are cheap)."""

    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness

    def collect(self) -> Iterator[Metric]:
        self.readiness.run()
        family = gauge("tpu_ledger_ready")
        for name, result in self.readiness.last.items():
            family.add_metric([name], 1 if result.ok else 0)
        yield family


class Service:
    def __init__(self, component: str, store_url: str, address: str | None, *,
                 lease_held: Callable[[], bool | None] | None = None, heartbeat: bool = True) -> None:
        self.component = component
        self.registry = CollectorRegistry()
        self.ledger = LedgerMetrics(self.registry)
        self.follower = LedgerFollower(store_url, self.ledger)
        self.readiness = Readiness().add("store", store_check(store_url)).add("ledger", sound_check(self.follower))
        for collector in (InfoCollector(component), FollowerCollector(self.follower), ReadyCollector(self.readiness)):
            self.registry.register(collector)
        self.server = MetricsServer(address, self.registry, self.readiness, component) if address else None
        self.heartbeat = HeartbeatThread(store_url, component, lease_held=lease_held) if heartbeat else None

    def gauges(self, read: Callable[[], Mapping[str, Any]]) -> None:
        """Scrape-time gauges (and the counters of metrics.COUNTERS) from `read()`."""
        self.registry.register(ValuesCollector(read, COUNTERS))

    def jobs(self, sources: JobSources) -> None:
        """Jobs by state, chips held and the queue, from a fold the service holds."""
        self.registry.register(JobsCollector(sources))

    def start(self) -> Service:
        # The tail is checked from the head at start: later scrapes and probes read only what is new.
        try:
            self.follower.refresh()
        except Exception as exc:  # /readyz reports it; the service itself decides whether to run
            click.echo(f"metrics: cannot read the ledger yet: {exc}", err=True)
        if self.heartbeat is not None:
            self.heartbeat.start()
        if self.server is not None:
            self.server.start()
            click.echo(f"metrics on {self.server.url}/metrics (/healthz, /readyz)", err=True)
            sys.stderr.flush()
        return self

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.close()
        if self.server is not None:
            self.server.close()
        self.follower.close()

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
