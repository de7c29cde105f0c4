"""The notifier: tails the store from its own cursor and delivers what notify_plan decides.

Guarantee: at most one message per (event, channel), never a duplicate, even across
crashes. Before each delivery the notifier records a marker (cursor
`notify:<name>:attempt` = seq * 64 + index of the message within the event); after
delivery the event cursor `notify:<name>` advances. On restart a message whose marker is
already recorded is not sent again: a crash in the narrow window between marker and
delivery loses that one message rather than repeating it (it is reported as `uncertain`).
A delivery that fails for a reason proving it was not received (connection refused, HTTP
429/502/503/504, SMTP connection errors) is retried `attempts` times with backoff; then it
is reported `failed` and the notifier moves on, so a dead webhook never blocks the rest.
"""

from __future__ import annotations

import json
import logging
import smtplib
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from typing import Any

from ledger import logcontext
from ledger.errors import UsageError
from ledger.fanout.notify_plan import Delivery, plan
from ledger.spec.policy import NotifyPolicy
from ledger.store import Store

log = logging.getLogger("ledger.fanout")

SLOTS_PER_EVENT = 64  # markers are seq * 64 + message index; an event has at most 2 messages


class RetryableDelivery(Exception):
    """The message certainly did not arrive; trying again cannot duplicate it."""


@dataclass(slots=True)
class NotifyReport:
    sent: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    uncertain: list[dict[str, Any]] = field(default_factory=list)  # skipped after a crash
    position: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def post_webhook(url: str, payload: dict[str, Any], timeout: float = 10.0) -> None:
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (429, 502, 503, 504):
            raise RetryableDelivery(f"webhook answered {exc.code}") from exc
        raise
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            raise RetryableDelivery(f"webhook unreachable: {exc.reason}") from exc
        raise


def send_email(smtp: tuple[str, int], sender: str, delivery: Delivery, timeout: float = 10.0) -> None:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = sender, delivery.target, delivery.subject
    message.set_content(delivery.text)
    try:
        client = smtplib.SMTP(smtp[0], smtp[1], timeout=timeout)
    except (ConnectionRefusedError, smtplib.SMTPConnectError) as exc:
        raise RetryableDelivery(f"SMTP server unreachable: {exc}") from exc
    with client:
        client.send_message(message)


def parse_smtp(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--smtp {value!r} is not host:port", hint="e.g. --smtp smtp.example.org:25")
    return host, int(port)


class Notifier:
    def __init__(
        self,
        store: Store,
        policy: NotifyPolicy,
        *,
        webhook: str | None = None,
        smtp: tuple[str, int] | None = None,
        name: str = "default",
        from_start: bool = False,
        attempts: int = 3,
        backoff: float = 0.5,
    ) -> None:
        self.store = store
        self.policy = policy
        self.webhook = webhook or policy.webhook
        self.smtp = smtp
        self.cursor = f"notify:{name}"
        self.marker = f"notify:{name}:attempt"
        self.attempts = attempts
        self.backoff = backoff
        # A new notifier starts at the head, not at the beginning of history (unless asked).
        started = f"notify:{name}:started"
        if store.get_cursor(started) == 0:
            if not from_start:
                store.set_cursor(self.cursor, store.head())
            store.set_cursor(started, store.head() + 1)
        self.position = store.get_cursor(self.cursor)

    def run_once(self, report: NotifyReport | None = None) -> NotifyReport:
        """Deliver for every event after the cursor, up to the head now."""
        report = report or NotifyReport()
        attempted = self.store.get_cursor(self.marker)
        while True:
            events = list(self.store.read_all(after=self.position, limit=1000))
            if not events:
                break
            for event in events:
                deliveries = plan(event, self.policy, webhook=self.webhook, email=self.smtp is not None)
                for index, delivery in enumerate(deliveries):
                    slot = event.seq * SLOTS_PER_EVENT + index
                    entry = {"seq": event.seq, "id": event.id, "stream": event.stream, "type": event.type,
                             "channel": delivery.channel, "target": delivery.target}
                    if slot <= attempted:
                        report.uncertain.append(entry)
                        continue
                    self.store.set_cursor(self.marker, slot)
                    attempted = slot
                    with logcontext.about(event.stream if not event.stream.startswith("_") else None):
                        error = self._deliver(delivery)
                    (report.failed if error else report.sent).append({**entry, **({"error": error} if error else {})})
                self.position = event.seq
                if deliveries:
                    self.store.set_cursor(self.cursor, event.seq)
            self.store.set_cursor(self.cursor, self.position)
        report.position = self.position
        return report

    def run(self, stop: threading.Event, interval: float = 1.0) -> NotifyReport:
        report = NotifyReport()
        while not stop.is_set():
            self.run_once(report)
            self.store.wait_for_append(self.position, interval)
        return report

    def _deliver(self, delivery: Delivery) -> str | None:
        """None when delivered, else the reason it was not."""
        for attempt in range(1, self.attempts + 1):
            try:
                if delivery.channel == "webhook":
                    post_webhook(delivery.target, delivery.payload or {"text": delivery.text})
                else:
                    assert self.smtp is not None
                    send_email(self.smtp, self.policy.sender, delivery)
                return None
            except RetryableDelivery as exc:
                if attempt == self.attempts:
                    return str(exc)
                log.warning("notify: %s to %s: %s; retrying", delivery.channel, delivery.target, exc)
                time.sleep(self.backoff * 2 ** (attempt - 1))
            except Exception as exc:  # noqa: BLE001 - may have arrived: never resend
                return f"{type(exc).__name__}: {exc}"
        return "not delivered"
