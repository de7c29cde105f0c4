"""The event envelope: canonical encoding, hash chain and deterministic ids.

Pure data and pure functions. Every event is stored with the hash of its canonical
encoding chained to the event before it, so any edit anywhere is detectable.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring as _json_str  # the C encoder json.dumps uses
from typing import Any

GENESIS_HASH = "0" * 64

# Every type the domain knows; schemas/event.schema.json describes each one's `data`.
EVENT_TYPES: tuple[str, ...] = (
    "submitted",
    "rejected",
    "spec_updated",
    "cancel_requested",
    "queued",
    "provisioning",
    "provisioned",
    "provision_failed",
    "setup_started",
    "setup_done",
    "setup_failed",
    "started",
    "preempted",
    "failed",
    "resumed",
    "rerun",
    "finished",
    "cancelled",
    "released",
    "history_rewritten",
    "rewrite_accepted",
    "action_intent",
    "action_outcome",
    "note",
)

# Fields covered by the hash, in the envelope; `hash` itself is not.
HASHED_FIELDS = ("seq", "stream", "version", "type", "time", "actor", "id", "causation", "data", "prev_hash")


# Built once: json.dumps with non-default options builds an encoder per call, which cost
# more than the encoding itself for the small dicts events carry.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical(value: Any) -> bytes:
    """Stable bytes for a JSON value: sorted keys, no spaces, UTF-8, no NaN/Infinity.

    Floats are written as Python's shortest round-trip repr, so a value read back from
    storage encodes to the same bytes again.
    """
    return _CANONICAL.encode(value).encode("utf-8")


def format_time(moment: datetime) -> str:
    """UTC, microsecond precision, 'Z' suffix: one spelling per instant."""
    if moment.tzinfo is None:
        raise ValueError("event times must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def now() -> str:
    return format_time(datetime.now(UTC))


_VARIANT = "89ab89ab89ab89ab"  # RFC 4122 variant: the top two bits of byte 8 are 10


def _uuid_text(h: str, version: str) -> str:
    """RFC 4122 spelling of 32 hex digits with the given version; what str(uuid.UUID(bytes=,
    version=)) gives, without its cost (an id is made for every appended event)."""
    return f"{h[:8]}-{h[8:12]}-{version}{h[13:16]}-{_VARIANT[int(h[16], 16)]}{h[17:20]}-{h[20:32]}"


@functools.lru_cache(maxsize=65536)
def _stream_prefix(stream: str) -> str:
    return hashlib.sha256(stream.encode()).hexdigest()[:8]


# Ids start with 4 bytes of the stream's hash, then 12 of the key's (or random) bytes: the
# events of one stream sit together in the id index, so a batch touches a few index pages
# instead of one per event (a 1M-event ledger's id index no longer thrashes on appends).
def event_id(stream: str, key: str) -> str:
    """A deterministic id from an idempotency key: retrying an append stores nothing twice."""
    digest = hashlib.sha256(f"{stream}\x00{key}".encode()).hexdigest()
    return _uuid_text(_stream_prefix(stream) + digest[:24], "5")


def random_id(stream: str | None = None) -> str:
    raw = os.urandom(16).hex()
    return _uuid_text((_stream_prefix(stream) + raw[:24]) if stream is not None else raw, "4")


def dumps(value: Any) -> str:
    """canonical() as text: how actor and data are stored, so the stored text hashes as is."""
    return _CANONICAL.encode(value)


# canonical() of an envelope without `hash`, keys in sorted order. Built from the stored
# columns (actor and data already canonical text), it gives the same bytes as canonical(dict)
# without decoding anything: this is what makes append and verify cheap.
_BODY = (
    '{"actor":%s,"causation":%s,"data":%s,"id":%s,"prev_hash":%s,"seq":%d,'
    '"stream":%s,"time":%s,"type":%s,"version":%d}'
)


def body_text(
    seq: int, stream: str, version: int, type_: str, time: str, actor_json: str,
    id_: str, causation: str | None, data_json: str, prev_hash: str,
) -> str:
    """canonical(envelope without hash) as text, from the columns as stored."""
    return _BODY % (
        actor_json, "null" if causation is None else _json_str(causation), data_json, _json_str(id_),
        _json_str(prev_hash), seq, _json_str(stream), _json_str(time), _json_str(type_), version,
    )


def row_hash(prev_hash: str, body: str) -> str:
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


def chain_hash(prev_hash: str, envelope_without_hash: dict[str, Any]) -> str:
    h = hashlib.sha256(prev_hash.encode("ascii"))
    h.update(canonical(envelope_without_hash))
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class NewEvent:
    """What a writer asks to append; the store assigns seq, version, prev_hash and hash."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    actor: dict[str, Any] = field(default_factory=lambda: {"kind": "system", "name": "ledger"})
    key: str | None = None  # idempotency key; None = a fresh random id
    causation: str | None = None
    time: str | None = None  # ISO UTC; None = now

    def resolve_id(self, stream: str) -> str:
        return event_id(stream, self.key) if self.key is not None else random_id(stream)


@dataclass(frozen=True, slots=True)
class Event:
    """A stored event: the full envelope."""

    seq: int
    stream: str
    version: int
    type: str
    time: str
    actor: dict[str, Any]
    id: str
    causation: str | None
    data: dict[str, Any]
    prev_hash: str
    hash: str

    def unhashed(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "stream": self.stream,
            "version": self.version,
            "type": self.type,
            "time": self.time,
            "actor": self.actor,
            "id": self.id,
            "causation": self.causation,
            "data": self.data,
            "prev_hash": self.prev_hash,
        }

    def to_dict(self) -> dict[str, Any]:
        envelope = self.unhashed()
        envelope["hash"] = self.hash
        return envelope

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        return cls(**{name: d[name] for name in (*HASHED_FIELDS, "hash")})

    def expected_hash(self) -> str:
        return chain_hash(self.prev_hash, self.unhashed())


def seal(
    new: NewEvent, *, seq: int, stream: str, version: int, prev_hash: str, event_id_: str
) -> Event:
    """Turn a request into a stored envelope at the given position."""
    time_ = new.time or now()
    body = body_text(seq, stream, version, new.type, time_, dumps(new.actor), event_id_,
                     new.causation, dumps(new.data), prev_hash)
    return Event(seq, stream, version, new.type, time_, new.actor, event_id_, new.causation,
                 new.data, prev_hash, row_hash(prev_hash, body))


def actor(kind: str, name: str, **extra: Any) -> dict[str, Any]:
    """Who caused an event: kind is git | cli | reconciler | watcher | system."""
    return {"kind": kind, "name": name, **extra}
