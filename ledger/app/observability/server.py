"""The metrics listener of a service: `/metrics` (Prometheus's text format), `/healthz` and
`/readyz`, on `--metrics-address HOST:PORT`, from a thread beside the service's own work."""

from __future__ import annotations

import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ledger.app.observability.health import Readiness
from ledger.errors import UsageError


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT ([::1]:PORT for IPv6); port 0 = any free port."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--metrics-address {text!r} is not HOST:PORT",
                         hint="e.g. --metrics-address 127.0.0.1:9464 (0.0.0.0:9464 for every interface)")
    return host.strip("[]"), int(port)


def health_body(component: str) -> dict[str, Any]:
    return {"alive": True, "component": component, "pid": os.getpid()}


class MetricsServer:
    """Serves a registry and a service's readiness until `close()`."""

    def __init__(self, address: str, registry: CollectorRegistry, readiness: Readiness, component: str) -> None:
        host, port = parse_address(address)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                    self._send(200, content_type, encoder(outer.registry))
                elif path == "/healthz":
                    self._json(200, health_body(component))
                elif path == "/readyz":
                    ready, body = outer.readiness.run()
                    self._json(200 if ready else 503, body)
                else:
                    self._json(404, {"error": "not found", "paths": ["/metrics", "/healthz", "/readyz"]})

            def _json(self, status: int, body: dict[str, Any]) -> None:
                self._send(status, "application/json", json.dumps(body, sort_keys=True).encode() + b"\n")

            def _send(self, status: int, content_type: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - scrapes are not news
                pass

        self.registry = registry
        self.readiness = readiness
        server_class = type("Server", (ThreadingHTTPServer,),
                            {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        try:
            self.httpd = server_class((host, port), Handler)
        except OSError as exc:
            raise UsageError(f"cannot listen on {address} for metrics: {exc.strerror or exc}",
                             hint="pick another --metrics-address (port 0 = any free port)") from None
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{'[' + str(host) + ']' if ':' in str(host) else host}:{port}"

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
