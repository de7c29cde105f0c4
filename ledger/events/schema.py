"""The event JSON Schema, generated from the classes, and the one check of stored events.

`event_schema()` builds `schemas/event.schema.json` from `Envelope`, `Actor` and the data
classes (`make schemas` writes it; a test fails when the committed file differs), so the
published schema says exactly what the code accepts.

`RowChecker` is how `ledger verify` (and import) checks each stored row: the scalar columns
against the constraints `Envelope` declares (read from the class, not restated), `actor`
and `data` decoded and validated by msgspec against `Actor` and the type's class, with the
verdict cached per distinct stored text (most repeat).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import inspect as mi

from ledger.events.data import DATA_TYPES, EVENT_TYPES, READ_TYPES
from ledger.events.envelope import ENVELOPE_FIELDS, Actor, Envelope, dumps, pattern_search

SCHEMA_ID = "https://tpu-ledger.dev/schemas/event.schema.json"
_REF = "#/$defs/"


def _def_name(cls: type) -> str:
    """Names in `$defs`: `data_<type>` for each type's data (as the first hand-written
    schema named them), snake_case for the parts (`actor`, `tpu`, `failure_record`)."""
    for type_, read in READ_TYPES.items():
        if cls is read:
            return f"data_{type_}"
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


def _renamed(node: Any, names: dict[str, str]) -> Any:
    if isinstance(node, dict):
        out = {k: _renamed(v, names) for k, v in node.items() if k != "title"}
        if isinstance(out.get("description"), str):  # docstrings: one line in the schema
            out["description"] = " ".join(out["description"].split())
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF):
            out["$ref"] = _REF + names[ref.removeprefix(_REF)]
        return out
    if isinstance(node, list):
        return [_renamed(v, names) for v in node]
    return node


def event_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of one stored event, from the classes."""
    data_classes = [READ_TYPES[t] for t in EVENT_TYPES]
    _, components = msgspec.json.schema_components([Envelope, *data_classes], ref_template=_REF + "{name}")
    classes = {c.__name__: c for c in _struct_classes([Envelope, *data_classes])}
    names = {name: _def_name(cls) for name, cls in classes.items()}
    defs = {names[name]: _renamed(body, names) for name, body in components.items()}
    envelope = defs.pop(_def_name(Envelope))
    for type_ in EVENT_TYPES:
        body = defs[f"data_{type_}"]
        writer = DATA_TYPES[type_]
        body["description"] = f"`data` of a `{type_}` event: {' '.join((writer.__doc__ or '').split())}"
        body.update(getattr(writer, "schema_extra", {}))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "tpu-ledger event envelope",
        "$comment": "Generated from ledger/events (make schemas); edit the classes, not this file.",
        **envelope,
        "allOf": [
            {"if": {"properties": {"type": {"const": t}}},
             "then": {"properties": {"data": {"$ref": f"{_REF}data_{t}"}}}}
            for t in EVENT_TYPES
        ],
        "$defs": dict(sorted(defs.items())),
    }


def _struct_classes(roots: list[type]) -> list[type]:
    """Every Struct class reachable from `roots` (what msgspec puts in the components)."""
    seen: dict[type, None] = {}

    def walk(t: mi.Type) -> None:
        if isinstance(t, mi.StructType):
            if t.cls in seen:
                return
            seen[t.cls] = None
            for f in t.fields:
                walk(f.type)
        elif isinstance(t, mi.UnionType):
            for sub in t.types:
                walk(sub)
        elif isinstance(t, mi.ListType | mi.DictType):
            walk(t.item_type if isinstance(t, mi.ListType) else t.value_type)

    for root in roots:
        walk(mi.type_info(root))
    return list(seen)


def schema_text() -> str:
    """The file `ledger/resources/schemas/event.schema.json` must hold."""
    return json.dumps(event_schema(), indent=2, ensure_ascii=False) + "\n"


# -- checking stored events ------------------------------------------------------------------
def _constraints(name: str) -> Any:
    """The msgspec type info of one `Envelope` field, with its Meta constraints."""
    for f in mi.type_info(Envelope).fields:
        if f.name == name:
            t = f.type
            while isinstance(t, mi.Metadata):  # a description around the constrained type
                t = t.type
            return t
    raise KeyError(name)


class _StrCheck:
    """A string column against the pattern and lengths its `Envelope` field declares."""

    def __init__(self, name: str) -> None:
        t = _constraints(name)
        self.name = name
        self.search = pattern_search(t.pattern) if t.pattern else None
        self.min, self.max = t.min_length or 0, t.max_length if t.max_length is not None else float("inf")
        # `ok(text)`: whether a string passes, truthy or not; the pattern's own search when it
        # is the only constraint (the fixed-width columns: one call a row instead of three).
        self.ok: Callable[[str], object] = self.search if self.search is not None and not self.min and self.max == float("inf") else self._ok

    def _ok(self, value: str) -> bool:
        return self.min <= len(value) <= self.max and (self.search is None or self.search(value) is not None)

    def __call__(self, value: Any) -> str | None:
        if isinstance(value, str) and self.ok(value):
            return None
        return f"{self.name}: {value!r} does not match the schema"


_MISS = object()


class RowChecker:
    """Schema verdicts for stored rows (`Store.raw_rows` layout), fast enough for a million."""

    _CACHE_LIMIT = 200_000

    def __init__(self) -> None:
        self.types = frozenset(_constraints("type").values)
        self._min_seq, self._min_version = _constraints("seq").ge, _constraints("version").ge
        self._stream, self._time, self._id = _StrCheck("stream"), _StrCheck("time"), _StrCheck("id")
        self._hashes = (_StrCheck("prev_hash"), _StrCheck("hash"))
        self._actors: dict[str, str | None] = {}
        self._data: dict[str, dict[str, str | None]] = {}  # type -> data text -> verdict
        self._size = 0
        self._streams: set[str] = set()
        self.last_decoded: tuple[str, Any] = ("", None)

    def check(self, row: tuple, *, hashes_checked: bool = False) -> str | None:
        """The first schema violation of a stored row, or None. With `hashes_checked` (the
        caller recomputed `hash` and compared `prev_hash` with the previous row's hash, so
        both are sha256 hex digests) their patterns are not matched again."""
        seq, stream, version, type_, time_, actor_json, id_, causation, data_json, prev_hash, hash_ = row
        if type_ not in self.types:
            return f"type: {type_!r} is not a known event type"
        if not (type(seq) is int and seq >= self._min_seq and type(version) is int and version >= self._min_version):
            return f"seq must be an integer >= {self._min_seq}, version an integer >= {self._min_version}"
        if not isinstance(causation, str | None):
            return "causation: must be a string or null"
        if stream not in self._streams:
            if (error := self._stream(stream)) is not None:
                return error
            self._streams.add(stream)
        if not (type(time_) is str and self._time.ok(time_) and type(id_) is str and self._id.ok(id_)):
            return self._time(time_) or self._id(id_)
        if not hashes_checked and (error := self._hashes[0](prev_hash) or self._hashes[1](hash_)) is not None:
            return error
        # Verdicts are cached per distinct stored text (per type for data): most repeat.
        verdict = self._actors.get(actor_json, _MISS)
        if verdict is _MISS:
            verdict = self._cached("actor", actor_json)
        if verdict is not None:
            return verdict
        seen = self._data.get(type_)
        verdict = _MISS if seen is None else seen.get(data_json, _MISS)
        if verdict is _MISS:
            verdict = self._cached(type_, data_json)
        return verdict

    def _cached(self, part: str, text: str) -> str | None:
        """Check one actor or data text (part = "actor" or the event type) and cache the verdict."""
        label = "actor" if part == "actor" else "data"
        try:
            # msgspec, as replay decodes: it refuses what json.loads would let through and no
            # writer of ours makes (NaN, 1e999, a lone surrogate), at a third of the cost.
            value = msgspec.json.decode(text)
            self.last_decoded = (text, value)  # verify's fold reuses it instead of decoding again
        except msgspec.DecodeError as exc:
            verdict: str | None = f"{label}: not JSON ({exc})"
        else:
            try:
                msgspec.convert(value, Actor if part == "actor" else READ_TYPES[part])
                verdict = None
            except msgspec.ValidationError as exc:
                verdict = f"{label}: {exc}"
        if self._size >= self._CACHE_LIMIT:
            self._actors.clear()
            self._data.clear()
            self._size = 0
        self._size += 1
        if part == "actor":
            self._actors[text] = verdict
        else:
            self._data.setdefault(part, {})[text] = verdict
        return verdict


def validate_event(envelope: dict[str, Any]) -> list[str]:
    """What is wrong with one full envelope (as exported, or `Event.to_dict()`), as
    'field: message' lines; empty when valid. The same check verify makes, on a dict."""
    fields = set(envelope) if isinstance(envelope, dict) else set()
    if fields != set(ENVELOPE_FIELDS):
        missing, extra = set(ENVELOPE_FIELDS) - fields, fields - set(ENVELOPE_FIELDS)
        return [f"(envelope): missing {sorted(missing)}" if missing else f"(envelope): unknown fields {sorted(extra)}"]
    try:
        row = tuple(dumps(envelope[f]) if f in ("actor", "data") else envelope[f] for f in ENVELOPE_FIELDS)
    except (TypeError, ValueError) as exc:
        return [f"(envelope): not JSON ({exc})"]
    error = RowChecker().check(row)
    return [] if error is None else [error]
