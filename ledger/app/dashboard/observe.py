"""The dashboard as a service: its metrics (jobs, chips, the queue from its live fold; the
last full verify; the publisher's lag), its readiness (the last verify found the ledger
sound) and the instances' heartbeats its health page lists."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prometheus_client.exposition import choose_encoder
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ledger import defaults
from ledger.app.dashboard.live import LiveLedger
from ledger.app.dashboard.responses import FastJSONResponse
from ledger.app.observability.collectors import JobSources
from ledger.app.observability.health import Check
from ledger.app.observability.server import health_body
from ledger.app.observability.service import Service
from ledger.app.queueview import recorded_policy, waiting_summary
from ledger.fanout.publisher import cursor_name
from ledger.spec.policy import Policy
from ledger.store import open_heartbeats


def verify_check(live: LiveLedger) -> Check:
    run = live.last_verify
    if run is None:
        return Check(True, "the first verify is running")
    if run.report is None:
        return Check(False, f"verify could not run: {run.error}")
    problem = run.report.get("problem")
    if problem:
        return Check(False, f"verify found the ledger unsound at seq {problem['position']}: {problem['reason']}")
    return Check(True, f"verified {run.report['events']} event(s) up to seq {run.report['head']} at {run.started}")


def observe_dashboard(service: Service, live: LiveLedger) -> Service:
    def queue() -> dict[str, Any]:
        with live.lock:
            return waiting_summary(list(live.state.jobs.values()))

    def values() -> dict[str, Any]:
        run = live.last_verify
        ended = None
        if run is not None:
            ended = datetime.fromisoformat(run.started.replace("Z", "+00:00")).timestamp() + run.seconds
        return {
            "tpu_ledger_verify_ok": None if run is None else (1 if run.ok else 0),
            "tpu_ledger_verify_last_run_timestamp_seconds": ended,
            **service.follower.outbox_gauges("fanout", live.topic, cursor_name(live.topic)),
        }

    def policy() -> Policy | None:
        with service.follower.lock:
            return recorded_policy(service.follower.store())

    service.jobs(JobSources(jobs=lambda: live.state.jobs, policy=policy, queue=queue,
                            settled=lambda: live.jobs.shelf.states))
    service.gauges(values)
    service.readiness.add("verify", lambda: verify_check(live))
    return service


def instances(store_url: str) -> list[dict[str, Any]]:
    """Every instance's last heartbeat, as `ledger status --json` lists them."""
    beats = open_heartbeats(store_url, create=False)
    try:
        return [b.to_dict(defaults.HEARTBEAT_DEAD_S) for b in beats.all()]
    finally:
        beats.close()


class Endpoints:
    """/metrics, /healthz and /readyz on the dashboard's own port."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def metrics(self, request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        data = await run_in_threadpool(encoder, self.service.registry)
        return Response(data, media_type=content_type)

    async def healthz(self, request: Request) -> Response:
        return FastJSONResponse(health_body(self.service.component))

    async def readyz(self, request: Request) -> Response:
        ready, body = await run_in_threadpool(self.service.readiness.run)
        return FastJSONResponse(body, status_code=200 if ready else 503)
