"""The small threaded HTTP server under the emulator's JSON services (control API, REST API).

`stop()` also closes the connections clients keep alive, then joins every handler thread,
so nothing of a stopped emulator lingers however its clients behave.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real clients expect of Google's front end
    # headers and body leave in two writes; with Nagle on, a kept-alive connection then waits
    # for the client's delayed ACK (~40 ms) on every answer
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:  # quiet: the emulator logs what matters itself
        pass

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True  # server_close() joins the handler threads

    def __init__(self, *args: Any) -> None:
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        super().__init__(*args)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conn_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.conn_lock:
            self.connections.discard(request)
        super().shutdown_request(request)


class JsonServer:
    """`handler` served on host:port (0 = any free port) from one thread; `url` once built."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str, port: int, name: str) -> None:
        self._httpd = _Server((host, port), handler)
        self.port = self._httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() would wait forever for a loop never started
            self._httpd.shutdown()
        with self._httpd.conn_lock:
            idle = list(self._httpd.connections)
        for conn in idle:  # a handler waiting for the next request on a kept-alive connection
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._httpd.server_close()
        if self._thread.is_alive():
            self._thread.join(10)
