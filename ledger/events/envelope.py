"""The event envelope: canonical encoding, hash chain, deterministic ids, NewEvent and Event.

Pure data and pure functions. Every event is stored with the hash of its canonical
encoding chained to the event before it, so any edit anywhere is detectable. `body_text`
is the one encoder of the hashed bytes: both stores, `seal`, `Event.expected_hash`, export
and `ledger verify` use it (PostgreSQL's recorder cuts its output where the server splices seq, version and
prev_hash back in, and checks at import that the splice gives these exact bytes).

The envelope's fields are typed here once (`Envelope`, with the patterns of time, id, hash
and stream): the published schema is generated from it, and verify checks stored columns
with the same patterns.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct

from ledger.events.data import EVENT_TYPES, EventData, EventDataError, Opt, check, encode

GENESIS_HASH = "0" * 64

# -- the envelope's fields, typed once ----------------------------------------------------
Position = Annotated[int, Meta(ge=1)]
StreamName = Annotated[str, Meta(
    min_length=1, max_length=300, pattern="^(_[^/]+|[^_/][^/]*/[^/]+)$",
    description="job id owner/name, or a system stream starting with _",
)]
TIME_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$"
Time = Annotated[str, Meta(pattern=TIME_PATTERN, description="UTC, microseconds, Z")]
EventId = Annotated[str, Meta(pattern="^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")]
Hash = Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]


def pattern_search(pattern: str) -> Callable[[str], re.Match[str] | None]:
    """`re.compile(pattern).search` as JSON Schema reads a pattern: a final `$` is the end of
    the string (Python's `$` also matches before a final newline: "...Z\\n" would pass as a
    time). Verify's schema check and NewEvent's time read the patterns with this."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern).search


_time_ok = pattern_search(TIME_PATTERN)


def _canonical_time(value: Any) -> str:
    """A time given to NewEvent in the one spelling verify accepts (`format_time`): an aware
    ISO 8601 time or datetime, in any offset; anything else is refused, nothing written."""
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(value.replace("Z", "+00:00"))
        if moment.tzinfo is not None:
            return format_time(moment)
    except (TypeError, ValueError, AttributeError):
        pass
    raise EventDataError(f"invalid time: {value!r} is not an ISO 8601 time with its offset",
                         hint="a bug in the writer; nothing was recorded")

EventType = Literal[EVENT_TYPES]  # type: ignore[valid-type] - built from the data classes
ActorKind = Literal["git", "cli", "reconciler", "watcher", "system"]


class Actor(Struct, kw_only=True, frozen=True):
    """Who caused an event. Extra fields are allowed: a git actor names approvers, a commit."""

    kind: ActorKind
    name: Annotated[str, Meta(min_length=1)]
    email: Opt[str] = UNSET
    approvers: Opt[list[str]] = UNSET
    commit: Opt[str] = UNSET
    pr: Opt[int] = UNSET
    branch: Opt[str] = UNSET
    manual: Opt[bool] = UNSET


class Envelope(Struct, forbid_unknown_fields=True):
    """One stored event. hash = sha256(prev_hash + canonical(envelope without hash));
    canonical = JSON with sorted keys, no spaces, UTF-8. `data` carries the type's fields."""

    seq: Annotated[Position, Meta(description="global position, gap-free")]
    stream: StreamName
    version: Annotated[Position, Meta(description="position within the stream, gap-free")]
    type: EventType
    time: Time
    actor: Actor
    id: EventId
    causation: Annotated[str | None, Meta(description="the event id or commit that caused this event")]
    data: dict[str, Any]
    prev_hash: Hash
    hash: Hash


# The one canonical encoder (form 2, ledger format 4): msgspec's JSON with keys sorted, no
# spaces, UTF-8, strings escaped as json.dumps(ensure_ascii=False) does, numbers in the
# shortest spelling that reads back to the same value. It is ~10x faster than the standard
# library's encoder, which appends paid per event. Form 1 (json.dumps, sort_keys) wrote the
# same bytes for every value but a float needing an exponent (1e-05 there, 0.00001 here;
# 1e+16 there, 1e16 here); stored rows keep the text they were hashed with, so a ledger
# written in form 1 verifies and replays unchanged (nothing re-encodes a stored event).
CANONICAL_FORM = 2
_ENCODE = msgspec.json.Encoder(order="sorted").encode


def canonical(value: Any) -> bytes:
    """Stable bytes for a JSON value: sorted keys, no spaces, UTF-8.

    Floats are written in their shortest round-trip spelling, so a value read back from
    storage encodes to the same bytes again. NaN and infinity have no JSON spelling (msgspec
    writes null): the spec parser refuses them before they reach an event.
    """
    return _ENCODE(value)


def format_time(moment: datetime) -> str:
    """UTC, microsecond precision, 'Z' suffix: one spelling per instant."""
    if moment.tzinfo is None:
        raise ValueError("event times must be timezone-aware")
    # isoformat spells "%Y-%m-%dT%H:%M:%S.%f+00:00" for a UTC instant at a third less cost than
    # strftime (now() is on every append's path); years below 1000 get their four digits too.
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# RFC 4122 variant: the top two bits of byte 8 are 10 (its hex digit becomes 8, 9, a or b)
_VARIANT = dict(zip("0123456789abcdef", "89ab89ab89ab89ab", strict=True))
_sha256 = hashlib.sha256


def _uuid_text(prefix: str, h: str, version: str) -> str:
    """RFC 4122 spelling of the stream prefix ("xxxxxxxx-", from _stream_prefix) and 24 more
    hex digits with the given version; what str(uuid.UUID(bytes=, version=)) gives, without
    its cost (an id is made for every appended event)."""
    return f"{prefix}{h[:4]}-{version}{h[5:8]}-{_VARIANT[h[8]]}{h[9:12]}-{h[12:24]}"


@functools.lru_cache(maxsize=65536)
def _stream_prefix(stream: str) -> str:
    return _sha256(stream.encode()).hexdigest()[:8] + "-"


# Ids start with 4 bytes of the stream's hash, then 12 of the key's (or random) bytes: the
# events of one stream sit together in the id index, so a batch touches a few index pages
# instead of one per event (a 1M-event ledger's id index no longer thrashes on appends).
def event_id(stream: str, key: str) -> str:
    """A deterministic id from an idempotency key: retrying an append stores nothing twice."""
    return _uuid_text(_stream_prefix(stream), _sha256(f"{stream}\x00{key}".encode()).hexdigest(), "5")


def random_id(stream: str | None = None) -> str:
    raw = os.urandom(16).hex()
    if stream is None:
        return _uuid_text(raw[:8] + "-", raw[8:], "4")
    return _uuid_text(_stream_prefix(stream), raw, "4")


def dumps(value: Any) -> str:
    """canonical() as text: how actor and data are stored, so the stored text hashes as is."""
    return _ENCODE(value).decode()


class _Body(Struct):
    """An envelope without `hash` in canonical order (fields declared sorted): encoded by the
    one encoder with actor and data spliced in as the canonical text already stored (Raw),
    the same bytes as canonical(dict) without decoding anything, which is what makes append
    and verify cheap."""

    actor: msgspec.Raw
    causation: str | None
    data: msgspec.Raw
    id: str
    prev_hash: str
    seq: int
    stream: str
    time: str
    type: str
    version: int


_Raw = msgspec.Raw


def body_bytes(
    seq: int, stream: str, version: int, type_: str, time: str, actor_json: str,
    id_: str, causation: str | None, data_json: str, prev_hash: str,
) -> bytes:
    """canonical(envelope without hash), from the columns as stored."""
    return _ENCODE(_Body(_Raw(actor_json), causation, _Raw(data_json), id_, prev_hash, seq, stream, time, type_, version))


def body_text(
    seq: int, stream: str, version: int, type_: str, time: str, actor_json: str,
    id_: str, causation: str | None, data_json: str, prev_hash: str,
) -> str:
    """canonical(envelope without hash) as text, from the columns as stored."""
    return body_bytes(seq, stream, version, type_, time, actor_json, id_, causation, data_json, prev_hash).decode()


def export_lines(rows: Iterable[tuple]) -> Iterator[str]:
    """`ledger export`'s JSON Lines from stored rows (`Store.raw_rows`' layout): each the
    canonical envelope without its hash, then `hash` added."""
    for row in rows:
        yield body_text(*row[:10])[:-1] + ',"hash":"' + row[10] + '"}\n'


def row_hash(prev_hash: str, body: str) -> str:
    return _sha256((prev_hash + body).encode("utf-8")).hexdigest()


def sealed_hash(
    seq: int, stream: str, version: int, type_: str, time: str, actor_json: str,
    id_: str, causation: str | None, data_json: str, prev_hash: str,
) -> str:
    """row_hash(prev_hash, body_text(...)) in one step, from the columns as stored."""
    return _sha256(prev_hash.encode() + _ENCODE(_Body(
        _Raw(actor_json), causation, _Raw(data_json), id_, prev_hash, seq, stream, time, type_, version))).hexdigest()


def _default_actor() -> dict[str, Any]:
    return {"kind": "system", "name": "ledger"}


@dataclass(frozen=True, slots=True)
class NewEvent:
    """What a writer asks to append; the store assigns seq, version, prev_hash and hash.

    `data` is an instance of the type's class in `ledger.events.data` (or a mapping held
    to that class); it is checked here and kept as the plain JSON value that is stored, so
    a malformed event is refused when it is made, before anything is written."""

    type: str
    data: EventData | Mapping[str, Any] = field(default_factory=dict)
    actor: dict[str, Any] = field(default_factory=_default_actor)
    key: str | None = None  # idempotency key; None = a fresh random id
    causation: str | None = None
    time: str | None = None  # ISO UTC; None = now

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", encode(self.type, self.data))
        check(self.actor, Actor, "actor")
        if self.time is not None and not (type(self.time) is str and _time_ok(self.time)):
            object.__setattr__(self, "time", _canonical_time(self.time))

    def resolve_id(self, stream: str) -> str:
        return event_id(stream, self.key) if self.key is not None else random_id(stream)


@dataclass(frozen=True, slots=True)
class Event:
    """A stored event: the full envelope (`data` and `actor` as plain JSON values).

    `actor_text` and `data_text` are the JSON texts as stored, when the event was read from
    a store or an export: `row()` gives them back verbatim, so the hash is checked over the
    very bytes it was made of (an event hashed in canonical form 1 re-encodes differently).
    """

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
    actor_text: str | None = field(default=None, compare=False, repr=False)
    data_text: str | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ENVELOPE_FIELDS}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        return cls(**{name: d[name] for name in ENVELOPE_FIELDS})

    def row(self) -> tuple:
        """The columns as stored (`Store.raw_rows` layout): actor and data as their stored
        text, or as canonical text for an event sealed here."""
        actor_text = self.actor_text if self.actor_text is not None else dumps(self.actor)
        data_text = self.data_text if self.data_text is not None else dumps(self.data)
        return (self.seq, self.stream, self.version, self.type, self.time, actor_text, self.id,
                self.causation, data_text, self.prev_hash, self.hash)

    def expected_hash(self) -> str:
        return sealed_hash(*self.row()[:10])


ENVELOPE_FIELDS: tuple[str, ...] = tuple(Envelope.__struct_fields__)


def seal(
    new: NewEvent, *, seq: int, stream: str, version: int, prev_hash: str, event_id_: str
) -> Event:
    """Turn a request into a stored envelope at the given position."""
    unsealed = Event(seq, stream, version, new.type, new.time or now(), new.actor, event_id_, new.causation,
                     new.data, prev_hash, "")  # type: ignore[arg-type] - NewEvent holds the encoded dict
    return dataclasses.replace(unsealed, hash=unsealed.expected_hash())


def actor(kind: str, name: str, **extra: Any) -> dict[str, Any]:
    """Who caused an event: kind is git | cli | reconciler | watcher | system."""
    return {"kind": kind, "name": name, **extra}
