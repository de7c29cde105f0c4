"""What to notify about an event, and the messages' contents (pure).

The policy is the `notify` section of the jobs repository's `.ledger/policy.yaml`:

    notify:
      webhook: https://hooks.slack.com/services/...   # optional; --webhook overrides
      from: tpu-ledger@example.org                     # optional sender address
      events: [rejected, preempted, failed, finished, cancelled]   # optional, the default
      owners:
        alice: {email: alice@example.org}
        bob: {email: bob@example.org, opt_out: true}          # no messages about bob's jobs
        carol: {email: carol@example.org, opt_out: [email]}   # webhook yes, email no

A job's owner is the first part of its id (`<owner>/<name>`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger.errors import UsageError
from ledger.events import Event

NOTIFY_TYPES: tuple[str, ...] = ("rejected", "preempted", "failed", "finished", "cancelled")
CHANNELS = ("webhook", "email")
DEFAULT_SENDER = "tpu-ledger@localhost"


@dataclass(frozen=True, slots=True)
class Owner:
    email: str | None = None
    opt_out: frozenset[str] = frozenset()  # channels this owner does not want


@dataclass(frozen=True, slots=True)
class NotifyPolicy:
    webhook: str | None = None
    sender: str = DEFAULT_SENDER
    events: frozenset[str] = frozenset(NOTIFY_TYPES)
    owners: Mapping[str, Owner] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Delivery:
    channel: str  # "webhook" | "email"
    target: str  # URL or address
    subject: str
    text: str
    payload: dict[str, Any] | None = None  # the webhook's JSON body


def parse_policy(doc: Mapping[str, Any] | None) -> NotifyPolicy:
    """The `notify` section of a parsed policy.yaml (the whole document, or None)."""
    section = (doc or {}).get("notify") or {}
    if not isinstance(section, Mapping):
        raise UsageError("policy: `notify` must be a mapping")
    owners: dict[str, Owner] = {}
    for name, prefs in (section.get("owners") or {}).items():
        prefs = prefs or {}
        if not isinstance(prefs, Mapping):
            raise UsageError(f"policy: notify.owners.{name} must be a mapping with email / opt_out")
        opt = prefs.get("opt_out", False)
        if opt is True:
            channels = frozenset(CHANNELS)
        elif opt in (False, None):
            channels = frozenset()
        elif isinstance(opt, list) and set(opt) <= set(CHANNELS):
            channels = frozenset(opt)
        else:
            raise UsageError(f"policy: notify.owners.{name}.opt_out must be true, false or a list of {list(CHANNELS)}")
        owners[str(name)] = Owner(email=prefs.get("email"), opt_out=channels)
    events = section.get("events") or NOTIFY_TYPES
    unknown = set(events) - set(NOTIFY_TYPES)
    if unknown:
        raise UsageError(f"policy: notify.events has {sorted(unknown)}; choose among {list(NOTIFY_TYPES)}")
    return NotifyPolicy(
        webhook=section.get("webhook"),
        sender=section.get("from") or DEFAULT_SENDER,
        events=frozenset(events),
        owners=owners,
    )


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
    owner_name = owner_of(event.stream)
    owner = policy.owners.get(owner_name or "", Owner())
    subject = f"[tpu-ledger] {event.stream} {event.type}"
    text = f"{summary(event)}\n\nseq {event.seq}, {event.time}, event {event.id}\n"
    out: list[Delivery] = []
    if webhook and "webhook" not in owner.opt_out:
        out.append(Delivery("webhook", webhook, subject, text, slack_payload(event)))
    if email and owner.email and "email" not in owner.opt_out:
        out.append(Delivery("email", owner.email, subject, text))
    return out
