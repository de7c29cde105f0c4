"""Events: the envelope (encoding, hash chain, ids), each type's typed data, their schema.

- `envelope`: `NewEvent` (what writers append), `Event` (what is stored), `body_text` (the
  one encoding of the hashed bytes), ids, times, `Envelope`/`Actor` (the typed envelope).
- `data`: one class per event type for `data` (`Failed`, `Provisioning`, ...); the source
  of truth for what an event may carry.
- `schema`: the JSON Schema generated from those classes, and `RowChecker`, the check
  `ledger verify` makes of every stored row.
"""

from ledger.events.data import (
    DATA_TYPES,
    EVENT_TYPES,
    READ_TYPES,
    EventData,
    EventDataError,
)
from ledger.events.envelope import (
    ENVELOPE_FIELDS,
    GENESIS_HASH,
    Actor,
    Envelope,
    Event,
    NewEvent,
    actor,
    body_text,
    canonical,
    dumps,
    event_id,
    export_lines,
    format_time,
    now,
    parse_time,
    random_id,
    row_hash,
    seal,
    sealed_hash,
)

__all__ = [
    "DATA_TYPES", "ENVELOPE_FIELDS", "EVENT_TYPES", "GENESIS_HASH", "READ_TYPES", "Actor", "Envelope",
    "Event", "EventData", "EventDataError", "NewEvent", "actor", "body_text", "canonical",
    "dumps", "event_id", "export_lines", "format_time", "now", "parse_time", "random_id", "row_hash", "seal",
    "sealed_hash",
]
