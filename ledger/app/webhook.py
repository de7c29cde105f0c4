"""The webhook receiver of `ledger watch --webhook-listen`: a forge's delivery of a push or a
merged pull request wakes the watcher at once (the poll stays the backstop).

A small threaded HTTP server (stdlib): POST only, bodies up to MAX_BODY, each delivery
checked by `ledger.forge.webhook` (signature or token in constant time, replays, staleness)
before anything happens; the secret never appears in a log or an answer.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ledger.forge import webhook
from ledger.forge.webhook import Action, Deliveries

MAX_BODY = 5 << 20  # GitHub caps payloads at 25 MB; a push of jobs is a few KB
CHECKS = {"github": webhook.github, "gitlab": webhook.gitlab}


class WebhookServer:
    """Serves `POST /` (any path) on (host, port); `on_ingest(action)` runs for each
    delivery that asks for an ingest, in the request's thread, before the answer."""

    def __init__(self, host: str, port: int, *, secret: bytes, branch: str, forge: str = "github",
                 on_ingest: Callable[[Action], None], clock: Callable[[], float] = time.time) -> None:
        if not secret:
            raise ValueError("a webhook needs a secret")
        check, seen = CHECKS[forge], Deliveries()
        self.received = 0

        outer = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "tpu-ledger"
            sys_version = ""

            def log_message(self, *args: Any) -> None:
                pass  # deliveries are counted, not logged: a header could carry a token

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                length = int(self.headers.get("Content-Length") or -1)
                if length < 0 or length > MAX_BODY:
                    return self._answer(413 if length > MAX_BODY else 411, "a body of known size up to 5 MiB")
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                action = check(headers, body, secret, branch, seen, clock())
                outer.received += 1
                if action.kind == "ingest":
                    on_ingest(action)
                return self._answer(action.status, action.reason or action.kind)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(405, "POST deliveries only")

            def _answer(self, status: int, text: str) -> None:
                data = json.dumps({"status": text}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> WebhookServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
