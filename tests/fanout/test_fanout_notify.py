"""The notifier against a local HTTP server (webhook) and a local SMTP server (aiosmtpd)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from emulator.pubsub import free_port
from ledger.events import NewEvent
from ledger.fanout.notifier import Notifier
from ledger.spec.policy import NotifyPolicy, Policy, parse_policy
from ledger.store import open_store
from tests.fanout.conftest import REPO
from tests.processes import service, stop_with_sigterm


class Webhook:
    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.status = 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if hook.status == 200:
                    hook.posts.append(json.loads(body))
                self.send_response(hook.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    hook.thread.start()
    try:
        yield hook
    finally:
        hook.server.shutdown()
        hook.server.server_close()


class Mailbox:
    def __init__(self) -> None:
        self.messages: list = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's naming
        message = message_from_bytes(envelope.content)
        self.messages.append((envelope.rcpt_tos, message))
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[Mailbox, tuple[str, int]]]:
    from aiosmtpd.controller import Controller

    box = Mailbox()
    controller = Controller(box, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield box, ("127.0.0.1", controller.port)
    finally:
        controller.stop()


POLICY = """\
notify:
  from: ledger@lab.example
  owners:
    alice: {email: alice@lab.example}
    bob: {email: bob@lab.example, opt_out: true}
    carol: {email: carol@lab.example, opt_out: [email]}
"""


def notify_policy(text: str | None = POLICY) -> NotifyPolicy:
    policy, errors = parse_policy(text)
    assert errors == ()
    return policy.notify


def submitted(job_id: str) -> NewEvent:
    return NewEvent("submitted", {"spec": {}, "spec_hash": "ab" * 32, "commit": "c0ffee", "path": f"jobs/{job_id}.yaml"})


def seed(store) -> None:
    store.append("alice/train", [submitted("alice/train"), NewEvent("started"), NewEvent("preempted", {"reason": "n1"}),
                                 NewEvent("finished")])
    store.append("bob/eval", [submitted("bob/eval"), NewEvent("failed", {"kind": "exit", "exit_code": 2})])
    store.append("carol/sweep", [NewEvent("rejected", {"reason": "missing approval"})])


def test_notifies_once_per_event_with_opt_outs(tmp_path: Path, webhook: Webhook, smtp) -> None:
    box, smtp_addr = smtp
    store = open_store(f"sqlite:///{tmp_path / 'l.db'}")
    seed(store)
    notifier = Notifier(store, notify_policy(), webhook=webhook.url, smtp=smtp_addr, from_start=True)
    report = notifier.run_once()
    assert [p["text"] for p in webhook.posts] == [
        "[tpu-ledger] alice/train: preempted (reason: n1)",
        "[tpu-ledger] alice/train: finished",
        "[tpu-ledger] carol/sweep: rejected (reason: missing approval)",
    ]
    assert [(to, m["Subject"], m["From"]) for to, m in box.messages] == [
        (["alice@lab.example"], "[tpu-ledger] alice/train preempted", "ledger@lab.example"),
        (["alice@lab.example"], "[tpu-ledger] alice/train finished", "ledger@lab.example"),
    ]
    assert len(report.sent) == 5 and not report.failed and report.position == store.head()
    # run again, and as a new process would: nothing is sent twice
    assert Notifier(store, notify_policy(), webhook=webhook.url, smtp=smtp_addr).run_once().sent == []
    store.append("alice/train", [NewEvent("cancelled")])
    again = Notifier(store, notify_policy(), webhook=webhook.url, smtp=smtp_addr).run_once()
    assert [(e["type"], e["channel"]) for e in again.sent] == [("cancelled", "webhook"), ("cancelled", "email")]
    assert len(webhook.posts) == 4 and len(box.messages) == 3
    store.close()


def test_a_new_notifier_starts_at_the_head(tmp_path: Path, webhook: Webhook) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'l.db'}")
    seed(store)
    assert Notifier(store, Policy().notify, webhook=webhook.url).run_once().sent == []
    store.append("dave/x", [NewEvent("failed", {"kind": "exit"})])
    assert [e["stream"] for e in Notifier(store, Policy().notify, webhook=webhook.url).run_once().sent] == ["dave/x"]
    store.close()


def test_crash_after_the_marker_never_sends_twice(tmp_path: Path, webhook: Webhook, smtp) -> None:
    """A notifier killed after recording its marker but before advancing its cursor."""
    box, smtp_addr = smtp
    store = open_store(f"sqlite:///{tmp_path / 'l.db'}")
    store.append("alice/train", [submitted("alice/train")])
    notifier = Notifier(store, notify_policy(), webhook=webhook.url, smtp=smtp_addr)
    (seq,) = store.append("alice/train", [NewEvent("failed", {"kind": "exit"})]).positions
    store.append("alice/train", [NewEvent("finished")])
    # the state a crash leaves: webhook of `failed` (slot 0) marked, maybe sent; cursor not moved
    store.set_cursor(notifier.marker, seq * 64 + 0)
    report = Notifier(store, notify_policy(), webhook=webhook.url, smtp=smtp_addr).run_once()
    assert [(e["type"], e["channel"]) for e in report.uncertain] == [("failed", "webhook")]
    assert [(e["type"], e["channel"]) for e in report.sent] == [
        ("failed", "email"), ("finished", "webhook"), ("finished", "email")]
    assert len(webhook.posts) == 1 and len(box.messages) == 2
    store.close()


def test_unreachable_peers_are_retried_then_reported(tmp_path: Path, webhook: Webhook) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'l.db'}")
    notifier = Notifier(store, notify_policy(), webhook=webhook.url, smtp=("127.0.0.1", free_port()),
                        attempts=2, backoff=0.05)
    store.append("alice/train", [NewEvent("failed", {"kind": "exit"})])
    webhook.status = 503
    report = notifier.run_once()
    assert [(e["channel"], e["error"]) for e in report.failed] == [
        ("webhook", "webhook answered 503"),
        ("email", report.failed[1]["error"]),
    ]
    assert report.failed[1]["error"].startswith("SMTP server unreachable")
    webhook.status = 200
    assert notifier.run_once().sent == []  # failed deliveries are reported, not replayed forever
    store.close()


def test_cli_notify_and_tail(tmp_path: Path, webhook: Webhook, smtp) -> None:
    box, (host, port) = smtp
    url = f"sqlite:///{tmp_path / 'l.db'}"
    store = open_store(url)
    seed(store)
    store.close()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = [sys.executable, "-m", "ledger", "--store", url]
    notify = subprocess.run([*run, "notify", "--webhook", webhook.url, "--smtp", f"{host}:{port}",
                             "--policy", str(policy), "--from-start", "--json"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert notify.returncode == 0, notify.stderr
    assert len(json.loads(notify.stdout)["sent"]) == 5 and len(webhook.posts) == 3 and len(box.messages) == 2
    tail = subprocess.run([*run, "tail", "--json", "--type", "failed", "--type", "rejected"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert tail.returncode == 0, tail.stderr
    lines = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [(e["stream"], e["type"]) for e in lines] == [("bob/eval", "failed"), ("carol/sweep", "rejected")]
    bad = subprocess.run([*run, "notify"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: nothing to notify with")
    # a policy file with a problem is refused whole, with its line, as `ledger validate` says it
    policy.write_text(POLICY.replace("opt_out: [email]", "opt_out: [sms]"))
    refused = subprocess.run([*run, "notify", "--webhook", webhook.url, "--policy", str(policy)],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and refused.stderr.startswith(f"error: {policy}:6:")
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr


def test_notify_follow_logs_json_and_stops_on_sigterm(tmp_path: Path, webhook: Webhook) -> None:
    """The notifier as a service: JSON log lines on stderr, SIGTERM ends it after the delivery
    under way, with its shutdown logged and the cursor kept."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    store = open_store(url)
    seed(store)
    store.close()
    with service([sys.executable, "-m", "ledger", "--store", url, "--log-format", "json", "notify", "--webhook",
                  webhook.url, "--from-start", "--follow"], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO) as proc:
        started = json.loads(proc.stderr.readline())
        assert started["component"] == "notify" and started["message"].startswith("notifying from sqlite:///")
        deadline = time.monotonic() + 60
        while len(webhook.posts) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        out, err = stop_with_sigterm(proc, timeout=60)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines()]
    assert [r["message"] for r in records][-2] == "stopping on SIGTERM: the delivery under way was finished"
    assert records[-1]["message"].startswith(f"stopped: sent {len(webhook.posts)}, failed 0")
    assert records[-1]["position"] > 0 and out == ""
