"""Checking a forge's webhook delivery before it wakes the watcher. Pure but for the clock
and the memory of delivery ids, both passed in.

GitHub signs each delivery: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body
with the shared secret>`, compared in constant time; `X-GitHub-Delivery` is unique per
delivery. GitLab sends the secret itself as `X-Gitlab-Token` (compared in constant time)
and `X-Gitlab-Event-UUID`. A delivery whose id was seen is a replay; one whose payload is
older than WEBHOOK_MAX_AGE_S (the push's `pushed_at`, the pull request's `updated_at`) is
stale. Ids are remembered as long as that window, which is enough: an older replay is stale.

A delivery only wakes the watcher, which reads git itself: a forged payload could at worst
cause an early fetch, never an event. The one fact taken from a payload is a merged pull
request's head commit (`Action.merged`), which saves the forge an API call, and it is taken
only from a delivery whose signature verified.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ledger import defaults


@dataclass(frozen=True, slots=True)
class Action:
    """What to do with a delivery: `ingest` (a push to the branch, a merged pull request),
    `ignore` (anything else), or `refuse` with an HTTP status and the reason."""

    kind: Literal["ingest", "ignore", "refuse"]
    status: int = 202
    reason: str = ""
    merged: tuple[int, str] | None = None  # (pull request number, merged head commit)


def github_signature_ok(secret: bytes, body: bytes, header: str | None) -> bool:
    if not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.strip().encode())


def _time(value: Any) -> float | None:
    """A payload's time (epoch seconds, or ISO 8601) as epoch seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00").replace(" UTC", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


class Deliveries:
    """The delivery ids seen within the staleness window (thread-safe, bounded by it)."""

    def __init__(self, max_age: float = defaults.WEBHOOK_MAX_AGE_S) -> None:
        self.max_age = max_age
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, delivery: str, now: float) -> bool:
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now - self.max_age:
                self._seen.popitem(last=False)
            if delivery in self._seen:
                return False
            self._seen[delivery] = now
            return True


def github(headers: dict[str, str], body: bytes, secret: bytes, branch: str, seen: Deliveries, now: float) -> Action:
    """A GitHub delivery -> Action. `headers` keys are lowercase."""
    if not github_signature_ok(secret, body, headers.get("x-hub-signature-256")):
        return Action("refuse", 401, "bad or missing X-Hub-Signature-256")
    delivery = headers.get("x-github-delivery", "")
    event = headers.get("x-github-event", "")
    payload = _payload(body, delivery)
    if isinstance(payload, Action):
        return payload
    if event == "ping":
        return Action("ignore", 200, "pong") if seen.first_time(delivery, now) else Action("refuse", 409, "replayed")
    if event == "push":
        at, wanted = _time((payload.get("repository") or {}).get("pushed_at")), payload.get("ref") == f"refs/heads/{branch}"
        merged = None
    elif event == "pull_request":
        pull = payload.get("pull_request") or {}
        at = _time(pull.get("updated_at"))
        wanted = payload.get("action") == "closed" and pull.get("merged") is True and \
            (pull.get("base") or {}).get("ref") == branch
        head = (pull.get("head") or {}).get("sha")
        merged = (int(payload["number"]), str(head)) if wanted and head and isinstance(payload.get("number"), int) else None
    else:
        return Action("ignore", 202, f"event {event!r} is not watched")
    return _fresh(delivery, at, now, seen, wanted, merged)


def gitlab(headers: dict[str, str], body: bytes, secret: bytes, branch: str, seen: Deliveries, now: float) -> Action:
    """A GitLab delivery -> Action (`X-Gitlab-Token`, `X-Gitlab-Event-UUID`)."""
    token = headers.get("x-gitlab-token", "")
    if not token or not hmac.compare_digest(token.encode(), secret):
        return Action("refuse", 401, "bad or missing X-Gitlab-Token")
    delivery = headers.get("x-gitlab-event-uuid", "")
    payload = _payload(body, delivery)
    if isinstance(payload, Action):
        return payload
    kind = payload.get("object_kind")
    if kind == "push":
        commits = payload.get("commits") or [{}]
        at, wanted, merged = _time(commits[-1].get("timestamp")), payload.get("ref") == f"refs/heads/{branch}", None
    elif kind == "merge_request":
        attrs = payload.get("object_attributes") or {}
        at = _time(attrs.get("updated_at"))
        wanted = attrs.get("action") == "merge" and attrs.get("target_branch") == branch
        head = (attrs.get("last_commit") or {}).get("id")
        merged = (int(attrs["iid"]), str(head)) if wanted and head and isinstance(attrs.get("iid"), int) else None
    else:
        return Action("ignore", 202, f"event {kind!r} is not watched")
    return _fresh(delivery, at, now, seen, wanted, merged)


def _payload(body: bytes, delivery: str) -> dict[str, Any] | Action:
    """The delivery's JSON object, or the refusal when it is none or has no id."""
    try:
        payload = json.loads(body)
    except ValueError:
        return Action("refuse", 400, "the body is not JSON")
    if not isinstance(payload, dict) or not delivery:
        return Action("refuse", 400, "not a delivery: no JSON object, or no delivery id")
    return payload


def _fresh(delivery: str, at: float | None, now: float, seen: Deliveries, wanted: bool,
           merged: tuple[int, str] | None) -> Action:
    if at is None or at < now - seen.max_age:
        return Action("refuse", 410, "stale delivery (older than the replay window)")
    if not seen.first_time(delivery, now):
        return Action("refuse", 409, "replayed delivery")
    return Action("ingest", 202, "", merged) if wanted else Action("ignore", 202, "not for the watched branch")
