"""What to notify about an event, and the messages' contents (pure).

Who hears about what is the policy's `notify` section (`ledger.spec.policy.NotifyPolicy`,
documented there with an example); a job's owner is the first part of its id
(`<owner>/<name>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.events import Event
from ledger.spec.policy import NotifyPolicy


@dataclass(frozen=True, slots=True)
class Delivery:
    channel: str  # "webhook" | "email"
    target: str  # URL or address
    subject: str
    text: str
    payload: dict[str, Any] | None = None  # the webhook's JSON body


def owner_of(stream: str) -> str | None:
    return stream.split("/", 1)[0] if "/" in stream else None


_DETAIL_KEYS = ("reason", "message", "error", "exit_code", "grpc_error", "attempt", "tpu", "node")


def summary(event: Event) -> str:
    """One line a person understands: `alice/train: preempted (tpu: node-1, attempt: 2)`."""
    details = [f"{k}: {event.data[k]}" for k in _DETAIL_KEYS if event.data.get(k) not in (None, "")]
    suffix = f" ({', '.join(details)})" if details else ""
    return f"{event.stream}: {event.type}{suffix}"


def slack_payload(event: Event) -> dict[str, Any]:
    """Slack-compatible incoming-webhook JSON (`text` is what every compatible tool reads)."""
    line = summary(event)
    return {
        "text": f"[tpu-ledger] {line}",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{event.stream}* {event.type}\n{line}"}},
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": f"seq {event.seq} · {event.time} · event {event.id}"}],
            },
        ],
    }


def plan(event: Event, policy: NotifyPolicy, *, webhook: str | None, email: bool) -> list[Delivery]:
    """The messages an event calls for, in a fixed order (webhook, then email).

    `webhook`: the URL in use (option or policy), None = no webhook; `email`: SMTP configured.
    """
    if event.type not in policy.events:
        return []
    owner = policy.owner(owner_of(event.stream))
    subject = f"[tpu-ledger] {event.stream} {event.type}"
    text = f"{summary(event)}\n\nseq {event.seq}, {event.time}, event {event.id}\n"
    out: list[Delivery] = []
    if webhook and "webhook" not in owner.opt_out:
        out.append(Delivery("webhook", webhook, subject, text, slack_payload(event)))
    if email and owner.email and "email" not in owner.opt_out:
        out.append(Delivery("email", owner.email, subject, text))
    return out
