"""`ledger dashboard --root-path /tpu` behind a reverse proxy that serves it under /tpu/ (as
nginx's `location /tpu/ { proxy_pass http://127.0.0.1:8900/; }` does: the prefix stripped):
every link, asset and API URL of the pages works through the proxy, and the dashboard also
answers when the proxy passes the prefix on."""

from __future__ import annotations

import http.client
import http.server
import json
import re
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.events import NewEvent, actor
from ledger.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "/tpu"


class StrippingProxy(http.server.ThreadingHTTPServer):
    """A reverse proxy for GET: /tpu/X -> http://upstream/X; anything else 404 (never reaches it)."""

    daemon_threads = True

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        super().__init__(("127.0.0.1", 0), Forward)


class Forward(http.server.BaseHTTPRequestHandler):
    server: StrippingProxy

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if not self.path.startswith(PREFIX + "/"):
            self.send_error(404, "outside the proxied prefix")
            return
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=30)
        conn.request("GET", self.path[len(PREFIX):], headers={"Host": f"127.0.0.1:{self.server.upstream[1]}",
                                                            "X-Forwarded-Prefix": PREFIX})
        response = conn.getresponse()
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        if "text/event-stream" in (response.getheader("content-type") or ""):
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(response.read1(4096))  # the stream's first message, then hang up
            conn.close()
            return
        body = response.read()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        conn.close()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[str, int]]:
    store = SQLiteStore(tmp_path / "ledger.db")
    store.append("alice/bert", [NewEvent("submitted", {"spec": {"job": {"name": "bert"}}, "spec_hash": "ab12ab12",
                                                        "commit": "c0ffee", "path": "jobs/alice/bert.yaml"},
                                         actor("git", "alice"))])
    store.close()
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "--store", f"sqlite:///{tmp_path / 'ledger.db'}",
                             "--log-format", "json", "dashboard", "--port", "0", "--root-path", PREFIX + "/",
                             "--log-dir", str(tmp_path / "logs")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stderr.readline())
        url = urllib.parse.urlsplit(re.search(r"http://\S+", started["message"]).group(0))
        assert url.path == PREFIX + "/", started  # the start line names the served root
        yield "127.0.0.1", url.port
    finally:
        proc.terminate()
        proc.wait(30)


def fetch(host: str, port: int, path: str) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read().decode() if response.getheader("content-type", "").find("event-stream") < 0 \
        else response.read1(4096).decode()
    headers = {k.lower(): v for k, v in response.getheaders()}
    conn.close()
    return response.status, headers, body


def test_every_link_asset_and_api_url_works_under_the_prefix(dashboard):
    proxy = StrippingProxy(dashboard)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    host, port = proxy.server_address[:2]
    try:
        status, headers, _ = fetch(host, port, f"{PREFIX}/")
        assert status == 302 and headers["location"] == f"{PREFIX}/jobs"
        seen: set[str] = set()
        for page in (f"{PREFIX}/jobs", f"{PREFIX}/jobs/alice/bert", f"{PREFIX}/usage", f"{PREFIX}/health"):
            status, _, html = fetch(host, port, page)
            assert status == 200, (page, html[:300])
            assert f'data-root="{PREFIX}"' in html
            urls = set(re.findall(r'(?:href|src|action)="([^"#]*)"', html))
            outside = [u for u in urls if u.startswith("/") and not u.startswith(PREFIX + "/")]
            assert not outside, (page, outside)
            seen |= {u for u in urls if u.startswith(PREFIX + "/")}
        assert {f"{PREFIX}/static/dashboard.js", f"{PREFIX}/static/dashboard.css", f"{PREFIX}/jobs/alice/bert",
                f"{PREFIX}/api"} <= seen
        for link in sorted(seen):
            status, _, body = fetch(host, port, link.replace("&amp;", "&"))
            assert status == 200, (link, body[:200])
        api = json.loads(fetch(host, port, f"{PREFIX}/api")[2])
        assert all(e.startswith(f"{PREFIX}/api/") for e in api["endpoints"])
        assert json.loads(fetch(host, port, f"{PREFIX}/api/jobs")[2])["jobs"][0]["id"] == "alice/bert"
        status, headers, first = fetch(host, port, f"{PREFIX}/api/stream?after=0")
        assert status == 200 and "event: hello" in first
        # The script builds the stream's URL from the page's data-root.
        assert '(body.dataset.root || "") + "/api/stream' in fetch(host, port, f"{PREFIX}/static/dashboard.js")[2]
    finally:
        proxy.shutdown()
        proxy.server_close()
    # A proxy that passes the prefix on reaches the same pages.
    status, _, html = fetch(*dashboard, f"{PREFIX}/jobs/alice/bert")
    assert status == 200 and f'href="{PREFIX}/jobs"' in html
    assert fetch(*dashboard, f"{PREFIX}")[0] == 302
