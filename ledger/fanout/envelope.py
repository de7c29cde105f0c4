"""Pure helpers: an event as a Pub/Sub message and back, and duplicate detection.

The message body is the full envelope (`Event.to_dict()` as canonical JSON), so a subscriber
can check the hash chain link and needs no store. Attributes repeat the fields a
subscriber filters on without decoding the body.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from ledger.events import Event, canonical

# Other messages share the events' topic: signed checkpoints of the ledger's head
# (ledger.checkpoints). They carry this attribute; events carry none.
KIND_ATTRIBUTE = "kind"
CHECKPOINT_KIND = "checkpoint"


@dataclass(frozen=True, slots=True)
class Message:
    data: bytes
    attributes: dict[str, str]
    ordering_key: str


def encode(event: Event) -> Message:
    attributes = {"type": event.type, "stream": event.stream, "seq": str(event.seq), "id": event.id}
    return Message(canonical(event.to_dict()), attributes, ordering_key=event.stream)


def decode(data: bytes, attributes: Mapping[str, str] | None = None) -> Event:
    """The envelope in a message body; ValueError when it is not one of ours."""
    try:
        event = Event.from_dict(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a ledger event envelope: {exc}") from exc
    if attributes and attributes.get("id", event.id) != event.id:
        raise ValueError("message attribute id does not match the envelope id")
    return event


class Deduper:
    """Drops events already delivered, in bounded memory.

    Two rules, both by event identity: an id among the last `max_ids` delivered ids is a
    duplicate; and since each stream arrives in version order (ordering key = stream),
    a version at or below the highest delivered for its stream is a re-delivery (a
    publisher that restarted from its cursor republishes a suffix). Memory: one int per
    stream plus `max_ids` ids.
    """

    def __init__(self, max_ids: int = 65536) -> None:
        self.max_ids = max_ids
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._high: dict[str, int] = {}
        self.dropped = 0

    def is_new(self, event: Event) -> bool:
        """True the first time an event is seen; records it."""
        if event.id in self._ids or event.version <= self._high.get(event.stream, 0):
            self.dropped += 1
            return False
        self._ids[event.id] = None
        if len(self._ids) > self.max_ids:
            self._ids.popitem(last=False)
        self._high[event.stream] = event.version
        return True


def matches(event: Event, types: frozenset[str] | None, streams: frozenset[str] | None) -> bool:
    """The `--type` / `--job` filter of tail and subscribers (None = everything)."""
    return (types is None or event.type in types) and (streams is None or event.stream in streams)
