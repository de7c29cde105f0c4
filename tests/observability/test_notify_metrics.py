"""A real `ledger notify --follow` process scraped over HTTP: its lag gauges say how far its
cursor is behind the head while a webhook hangs, and fall back to 0 once it answers."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ledger.events import NewEvent
from ledger.store.sqlite import SQLiteStore
from tests.observability.conftest import free_port
from tests.observability.test_service import get, samples, wait_for
from tests.processes import stop
from tests.usage.ledger_by_hand import submitted


class HangingWebhook:
    """A webhook that holds every request until `release` is set, then answers 200."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.received = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.received.set()
                hook.release.wait(60)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[HangingWebhook]:
    hook = HangingWebhook()
    try:
        yield hook
    finally:
        hook.close()


def lag(base: str) -> tuple[float | None, float | None]:
    """(events, seconds) as scraped; (None, None) while nothing listens yet."""
    try:
        found = samples(base)
    except OSError:
        return None, None
    return (found.get(("tpu_ledger_notify_lag_events", (("notifier", "lab"),))),
            found.get(("tpu_ledger_notify_lag_seconds", (("notifier", "lab"),))))


def test_the_notifiers_lag_is_scraped_while_a_webhook_hangs(tmp_path: Path, ledger_cmd: list[str], repo_root: Path,
                                                             webhook: HangingWebhook) -> None:
    ledger = tmp_path / "ledger.db"
    store = SQLiteStore(ledger)
    store.append("alice/bert", [NewEvent("submitted", submitted("v4-8", "us-central2-b", "spot"))])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    out = (tmp_path / "notify.log").open("w")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    proc = subprocess.Popen(
        [*ledger_cmd, "--store", f"sqlite:///{ledger}", "notify", "--follow", "--name", "lab",
         "--webhook", webhook.url, "--metrics-address", f"127.0.0.1:{port}"],
        cwd=repo_root, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: proc.poll() is not None or lag(base)[0] is not None, "the notifier's metrics")
        assert proc.poll() is None, (tmp_path / "notify.log").read_text()
        assert lag(base) == (0, 0)  # a new notifier starts at the head: nothing behind it

        store.append("alice/bert", [NewEvent("cancelled", {"reason": "by hand"})], expected_version=1)
        assert webhook.received.wait(60), (tmp_path / "notify.log").read_text()
        events, seconds = wait_for(lambda: (v := lag(base))[0] and v, "the lag of the hanging delivery")
        assert events == 1 and seconds is not None and seconds >= 0

        webhook.release.set()
        wait_for(lambda: lag(base) == (0, 0), "the lag to fall back to 0 once delivered")
        assert get(f"{base}/readyz")[0] == 200
    finally:
        stop(proc)
        out.close()
        store.close()
