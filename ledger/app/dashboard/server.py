"""The dashboard's web application: Starlette, Jinja2 templates and static assets from this
package, served by uvicorn. Read-only by construction: every route answers GET (and HEAD)
only, and nothing in it can append to the ledger.

Security, for a page that may sit behind a lab's proxy: every value is escaped by Jinja2's
autoescape; ids are looked up in the state, never used as paths; pages are bounded; a strict
Content-Security-Policy allows only this server's own script and stylesheet (no inline
script or style anywhere); the Host header must name this server (against DNS rebinding)
unless it was told to listen beyond loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledger import defaults
from ledger.app.dashboard import timeline, views
from ledger.app.dashboard.live import LiveLedger, StorePool, UsagePending
from ledger.app.dashboard.observe import Endpoints, instances
from ledger.app.dashboard.responses import FastJSONResponse
from ledger.app.figures import USAGE_HEADERS, chip_hours, percent, usage_cells
from ledger.app.observability.service import Service
from ledger.describe import figure
from ledger.errors import LedgerError, UsageError
from ledger.events import Event
from reconciler.joblogs import DirArchive, LogArchive, LogView

log = logging.getLogger("tpu_ledger.dashboard")
PACKAGE = "ledger.app.dashboard"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
KEEPALIVE_S = 15.0
SSE_EVENTS = 100  # events listed in one message (a big batch says how many it left out)
SSE_STREAMS = 200  # streams named in one message; more = "many" (every page refreshes)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str) -> str | None:
    """What `ledger dashboard` says before listening beyond this machine."""
    if is_loopback(host):
        return None
    return (f"warning: the dashboard listens on {host}: it has no authentication, and shows every job, spec and "
            "log tail to whoever reaches it. Put it behind the lab's authenticating proxy, or keep the default "
            "--host 127.0.0.1")


class SecurityHeaders:
    """Adds the security headers to every response, streams and errors included (a plain ASGI
    middleware: Starlette's BaseHTTPMiddleware would buffer the event stream)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def root_path(value: str | None) -> str:
    """`--root-path`: "" or "/a/b" (no trailing slash): where the lab's proxy serves the dashboard."""
    text = (value or "").strip()
    if text in ("", "/"):
        return ""
    if not text.startswith("/") or any(c in text for c in "?#%\"\'<> ") or "//" in text:
        raise UsageError(f"--root-path {value!r} is not a URL path", hint="e.g. --root-path /tpu")
    return text.rstrip("/")


class RootPath:
    """Serves the app below `root` whether the proxy strips the prefix (`proxy_pass
    http://127.0.0.1:8900/;`) or passes it on: the path gets the prefix if it lacks it, and
    `root_path` tells Starlette to route below it."""

    def __init__(self, app: ASGIApp, root: str) -> None:
        self.app = app
        self.root = root

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.root:
            path = scope["path"]
            if not (path == self.root or path.startswith(self.root + "/")):
                path = self.root + path
            if path == self.root:
                path += "/"
            scope = {**scope, "root_path": self.root, "path": path,
                     "raw_path": path.encode()}
        await self.app(scope, receive, send)


class Broadcast:
    """Wakes every event-stream client when the tail folded new events: one notification
    per batch, from the tail's thread into the server's event loop."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.closed = False

    def publish(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def close(self) -> None:
        self.closed = True
        self.publish()

    async def wait(self, timeout: float) -> bool:
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader(PACKAGE, "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(chip_hours=chip_hours, percent=percent, figure=figure, span=timeline.span_text,
                       clock=lambda iso: iso[11:19] if iso else "", day=lambda iso: iso[:10] if iso else "",
                       short=lambda text, n=12: text if len(text) <= n else text[:n] + "…")
    env.globals.update(kinds=timeline.KINDS, job_href=views.job_href, usage_cells=usage_cells,
                       usage_headers=USAGE_HEADERS)
    return env


def _int_param(request: Request, name: str) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    if not value.isdigit() or len(value) > 9:
        raise views.BadRequest(f"{name} must be a whole number")
    return int(value)


class Dashboard:
    """The routes, bound to one live ledger."""

    def __init__(self, live: LiveLedger, *, store_label: str, logs: LogView | None, service: Service | None = None,
                 root: str = "") -> None:
        self.live = live
        self.service = service
        self.store_label = store_label
        self.logs = logs
        self.root = root  # every link, asset and API URL starts with it (--root-path)
        self.pool = StorePool(live.store_url)
        self.env = templates()
        self.env.globals.update(root=root, job_href=lambda job_id: (root + href) if (href := views.job_href(job_id)) else None)
        self.broadcast: Broadcast | None = None

    # -- plumbing ---------------------------------------------------------------------------
    def render(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("position", self.live.position)
        context.setdefault("live_job", None)
        context.setdefault("refresh", None)  # seconds: a page that answers soon reloads itself (`error`)
        return HTMLResponse(self.env.get_template(name).render(**context), status_code=status,
                            headers={"Cache-Control": "no-store"})

    def error(self, request: Request, status: int, message: str, retry_after: int | None = None) -> Response:
        """The refusal as JSON under /api/, else as a page; `retry_after` (seconds): a page
        that will answer soon, which a browser then reloads by itself."""
        message = message if len(message) <= 160 else message[:160] + "…"
        if request.url.path.removeprefix(self.root).startswith("/api/"):
            response: Response = FastJSONResponse({"error": message, "status": status}, status_code=status)
        else:
            response = self.render("error.html", status, title=f"{status}", code=status, message=message, nav="",
                                   refresh=retry_after)
        if retry_after is not None:
            response.headers["Retry-After"] = str(retry_after)
        return response

    def page(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """Turns the dashboard's refusals into their HTTP answers: 400, 404, 503."""

        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except views.BadRequest as exc:
                return self.error(request, 400, str(exc))
            except views.NotFound as exc:
                return self.error(request, 404, f"no job {exc.args[0]!r} in the ledger")
            except UsagePending as exc:  # at start, on a large ledger: a few seconds
                return self.error(request, 503, str(exc), retry_after=5)
            except LedgerError as exc:
                return self.error(request, 503, f"the ledger cannot be read: {exc}")

        return endpoint

    def job_id(self, request: Request) -> str:
        job_id = f"{request.path_params['owner']}/{request.path_params['name']}"
        if not views.addressable(job_id):
            raise views.NotFound(job_id)
        return job_id

    # -- pages ------------------------------------------------------------------------------
    async def jobs(self, request: Request) -> Response:
        query = views.JobQuery.parse(request.query_params)
        data = views.jobs_page(self.live, query)
        return self.render("jobs.html", title="jobs", nav="jobs", q=query, data=data, states_all=views.STATES)

    async def job(self, request: Request) -> Response:
        job_id = self.job_id(request)
        events_page = _int_param(request, "events")
        data = await run_in_threadpool(self._job_data, job_id, events_page)
        return self.render("job.html", title=job_id, nav="jobs", d=data, live_job=job_id)

    def _job_data(self, job_id: str, events_page: int | None) -> dict[str, Any]:
        with self.pool.store() as store:
            return views.job_page(self.live, store, job_id, events_page=events_page, logs=self.logs)

    async def tpus(self, request: Request) -> Response:
        return self.render("tpus.html", title="TPUs", nav="tpus", d=views.tpus_page(self.live))

    async def queue(self, request: Request) -> Response:
        query = views.QueueQuery.parse(request.query_params)
        data = await run_in_threadpool(self._queue)
        return self.render("queue.html", title="queue", nav="queue", d=data, q=query, shown=views.queue_shown(data, query))

    def _queue(self) -> dict[str, Any]:
        with self.pool.store() as store:
            return views.queue_page(self.live, store)

    async def usage(self, request: Request) -> Response:
        by = request.query_params.get("by", "owner")
        data = await run_in_threadpool(views.usage_page, self.live, by)
        return self.render("usage.html", title="usage", nav="usage", d=data,
                           groupings=[g for g in views.GROUPINGS if g != "attempt"])

    async def health(self, request: Request) -> Response:
        data = await run_in_threadpool(self._health)
        return self.render("health.html", title="health", nav="health", d=data)

    def _health(self) -> dict[str, Any]:
        with self.pool.store() as store:
            data = views.health_page(self.live, store, self.store_label)
        data["instances"] = instances(self.live.store_url)
        data["dead_after"] = defaults.HEARTBEAT_DEAD_S
        return data

    # -- /api/ ------------------------------------------------------------------------------
    async def api_index(self, request: Request) -> Response:
        return FastJSONResponse({"endpoints": [self.root + path for path in (
            "/api/jobs?owner=&state=&accelerator=&q=&sort=&order=&page=&per_page=",
            "/api/jobs/{owner}/{name}", "/api/jobs/{owner}/{name}/events", "/api/jobs/{owner}/{name}/timeline",
            "/api/jobs/{owner}/{name}/log?attempt=&worker=", "/api/tpus", "/api/queue", "/api/queue/tree", "/api/usage?by=owner", "/api/usage/weeks",
            "/api/health", "/api/stream (text/event-stream)",
        )]})

    async def api_jobs(self, request: Request) -> Response:
        data = views.jobs_page(self.live, views.JobQuery.parse(request.query_params))
        return FastJSONResponse({k: data[k] for k in ("position", "total", "offset", "page", "pages", "per_page", "jobs")})

    async def api_job(self, request: Request) -> Response:
        return FastJSONResponse(views.job_state(self.live, self.job_id(request)))

    async def api_events(self, request: Request) -> Response:
        job_id = self.job_id(request)
        views.require_job(self.live, job_id)  # a job the state knows, or 404
        events = await run_in_threadpool(self._events, job_id)
        return FastJSONResponse([e.to_dict() for e in events])  # `ledger inspect --json`'s events

    def _events(self, job_id: str) -> list[Event]:
        with self.pool.store() as store:
            return store.read_stream(job_id)

    async def api_timeline(self, request: Request) -> Response:
        job_id = self.job_id(request)
        views.require_job(self.live, job_id)
        events = await run_in_threadpool(self._events, job_id)
        return FastJSONResponse(timeline.build(events, self.live.now_us()).to_dict())

    async def api_log(self, request: Request) -> Response:
        job_id = self.job_id(request)
        views.require_job(self.live, job_id)
        worker = _int_param(request, "worker") or 0
        data = await run_in_threadpool(views.log_tail, self.logs, job_id, _int_param(request, "attempt"), worker)
        return FastJSONResponse({"job": job_id, **data})

    async def api_tpus(self, request: Request) -> Response:
        return FastJSONResponse(views.tpus_page(self.live)["rows"])  # `ledger tpus --json`

    async def api_queue(self, request: Request) -> Response:
        """Every row (`ledger queue --json`); with any of `owner`, `wait`, `page`, `per_page`, one
        page of the rows those choose, as `/api/jobs` pages (a script polling a lab's 10,000)."""
        data = await run_in_threadpool(self._queue)
        params = request.query_params
        if not any(k in params for k in views.QueueQuery.PARAMS):
            return FastJSONResponse(data["rows"])
        query = views.QueueQuery.parse(params)
        shown = views.queue_shown(data, query)
        return FastJSONResponse({"position": data["position"], "per_page": query.per_page,
                             **{k: shown[k] for k in ("total", "offset", "page", "pages", "rows")}})

    async def api_queue_tree(self, request: Request) -> Response:
        return FastJSONResponse((await run_in_threadpool(self._queue))["tree"])  # `ledger queue --tree --json`

    async def api_usage(self, request: Request) -> Response:
        data = await run_in_threadpool(views.usage_page, self.live, request.query_params.get("by", "owner"))
        return FastJSONResponse(data["report"])  # `ledger usage --json`

    async def api_weeks(self, request: Request) -> Response:
        data = await run_in_threadpool(views.usage_page, self.live, "owner")
        return FastJSONResponse({"weeks": data["weeks"], "position": data["position"]})

    async def api_health(self, request: Request) -> Response:
        """503 when the last verify found the ledger unsound or could not run."""
        data = await run_in_threadpool(self._health)
        verify = data.get("verify")
        failed = verify is not None and not (verify.get("report") or {}).get("ok", False)
        return FastJSONResponse(data, status_code=503 if failed else 200)

    # -- the live stream --------------------------------------------------------------------
    async def stream(self, request: Request) -> Response:
        """Server-Sent Events: one `ledger` message per batch of new events (their seq,
        stream, type and time), `reset` when the client fell too far behind, a comment
        every KEEPALIVE_S seconds. `?after=SEQ` (or Last-Event-ID) resumes."""
        after = _int_param(request, "after")
        last_id = request.headers.get("last-event-id", "")
        if last_id.isdigit() and len(last_id) <= 12:
            after = int(last_id)
        start = self.live.position if after is None else min(after, self.live.position)
        broadcast = self.broadcast
        if broadcast is None:
            raise views.BadRequest("the event stream is not running")
        return StreamingResponse(self._messages(request, broadcast, start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def _messages(self, request: Request, broadcast: Broadcast, last: int) -> AsyncIterator[str]:
        yield f"retry: 1000\nid: {last}\nevent: hello\ndata: {json.dumps({'head': last})}\n\n"
        while not broadcast.closed:
            events, dropped = self.live.events_after(last)
            if dropped:
                last = self.live.position
                yield f"id: {last}\nevent: reset\ndata: {json.dumps({'head': last})}\n\n"
                continue
            if events:
                last = events[-1]["seq"]
                streams = sorted({e["stream"] for e in events})
                body = {"head": last, "count": len(events), "streams": streams if len(streams) <= SSE_STREAMS else None,
                        "events": events[-SSE_EVENTS:]}
                yield f"id: {last}\nevent: ledger\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"
                continue
            if not await broadcast.wait(KEEPALIVE_S):
                if await request.is_disconnected():
                    return
                yield ": keepalive\n\n"

    # -- the application --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        broadcast = self.broadcast = Broadcast()

        def announce() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed while the tail folded
                loop.call_soon_threadsafe(broadcast.publish)

        self.live.listeners.append(announce)
        self.live.start()
        try:
            yield
        finally:
            broadcast.close()
            self.live.listeners.remove(announce)
            await run_in_threadpool(self.live.close)
            self.pool.close()

    def _service_routes(self) -> list[Route]:
        """/metrics, /healthz, /readyz when the dashboard runs as a service (`ledger dashboard`)."""
        if self.service is None:
            return []
        ends = Endpoints(self.service)
        return [Route("/metrics", ends.metrics, methods=["GET"]), Route("/healthz", ends.healthz, methods=["GET"]),
                Route("/readyz", ends.readyz, methods=["GET"])]

    def app(self, allowed_hosts: list[str] | None = None) -> Starlette:
        get = ["GET"]
        p = self.page
        routes = [
            Route("/", lambda request: RedirectResponse(self.root + "/jobs", status_code=302), methods=get),
            Route("/jobs", p(self.jobs), methods=get),
            Route("/jobs/{owner}/{name}", p(self.job), methods=get),
            Route("/tpus", p(self.tpus), methods=get),
            Route("/queue", p(self.queue), methods=get),
            Route("/usage", p(self.usage), methods=get),
            Route("/health", p(self.health), methods=get),
            Route("/api", p(self.api_index), methods=get),
            Route("/api/jobs", p(self.api_jobs), methods=get),
            Route("/api/jobs/{owner}/{name}", p(self.api_job), methods=get),
            Route("/api/jobs/{owner}/{name}/events", p(self.api_events), methods=get),
            Route("/api/jobs/{owner}/{name}/timeline", p(self.api_timeline), methods=get),
            Route("/api/jobs/{owner}/{name}/log", p(self.api_log), methods=get),
            Route("/api/tpus", p(self.api_tpus), methods=get),
            Route("/api/queue", p(self.api_queue), methods=get),
            Route("/api/queue/tree", p(self.api_queue_tree), methods=get),
            Route("/api/usage", p(self.api_usage), methods=get),
            Route("/api/usage/weeks", p(self.api_weeks), methods=get),
            Route("/api/health", p(self.api_health), methods=get),
            Route("/api/stream", p(self.stream), methods=get),
            *self._service_routes(),
            Mount("/static", StaticFiles(packages=[(PACKAGE, "static")]), name="static"),
        ]

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            detail = {404: "no such page", 405: "the dashboard is read-only: only GET is served"}.get(status, "error")
            response = self.error(request, status, detail)
            if status == 405:
                response.headers["Allow"] = "GET, HEAD"
            return response

        middleware = [Middleware(RootPath, root=self.root), Middleware(SecurityHeaders)]
        if allowed_hosts is not None:
            middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
        app = Starlette(routes=routes, middleware=middleware, lifespan=self.lifespan,
                        exception_handlers={HTTPException: http_error})
        app.state.dashboard = self  # the server ends the event streams first when it stops
        return app


def create_app(live: LiveLedger, *, store_label: str, log_dir: Path | None = None, log_archive: LogArchive | None = None,
               allowed_hosts: list[str] | None = None, service: Service | None = None, root: str = "") -> Starlette:
    """`log_archive`: where reconcilers collect job logs; `log_dir`: a reconciler's own log
    directory on this host. The job page reads both (reconciler.joblogs.LogView)."""
    sources = [*([log_archive] if log_archive is not None else []), *([DirArchive(log_dir)] if log_dir else [])]
    return Dashboard(live, store_label=store_label, logs=LogView(sources) if sources else None,
                     service=service, root=root_path(root)).app(allowed_hosts)


def hosts_for(host: str) -> list[str] | None:
    """The Host headers to accept: this machine's names on loopback (a web page elsewhere
    cannot then read the dashboard through a rebound DNS name); anything beyond loopback,
    where the lab's proxy decides."""
    return list(LOOPBACK_NAMES) if is_loopback(host) else None


def config(app: Starlette, host: str, port: int, **extra: Any) -> uvicorn.Config:
    # log_config=None: uvicorn's own records go through our handler (ledger.app.logsetup).
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on",
                          timeout_graceful_shutdown=5, log_config=None, **extra)


class Server(uvicorn.Server):
    """uvicorn's server, which first ends the event streams when asked to stop: they never
    end by themselves, and uvicorn waits for open responses before its lifespan shutdown."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        dashboard = getattr(self.config.app.state, "dashboard", None)
        log.info("stopping: ending the event streams, then the open requests (at most 5 s)")
        if dashboard is not None and dashboard.broadcast is not None:
            dashboard.broadcast.close()
        await super().shutdown(sockets)


class Background:
    """A dashboard served from a thread (`ledger demo --dashboard`, tests, the bench): its
    socket is bound at once (a busy port is a one-line error), `url` says where."""

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = bind(host, port)
        self.server = Server(config(app, host, port))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="dashboard",
                                       daemon=True)
        self.url = url_of(self.sock).rstrip("/")

    def start(self, timeout: float = 30.0) -> Background:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.sock.close()
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    def __enter__(self) -> Background:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else starts: a port in use is one line."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         hint="pick another --port (0 = any free port) or --host") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve on `sock` in this (main) thread until Ctrl-C or SIGTERM."""
    host, port = sock.getsockname()[:2]
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the signal after shutting down
        Server(config(app, host, port)).run(sockets=[sock])
