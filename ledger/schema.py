"""The JSON Schemas in schemas/*.json, loaded as data, and event envelope validation.

`validate_event` is the full check (jsonschema, 2020-12). `RowChecker` gives the same verdict
for stored rows at the speed `ledger verify` needs: the per-event scalar fields are checked
with the schema's own patterns, and the full validation of actor and data (which repeat a
lot) is cached per distinct stored text.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ledger.resources import load_schema


@functools.cache
def _validator(schema_json: str):
    from jsonschema import Draft202012Validator

    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


@functools.cache
def event_validator():
    return _validator(json.dumps(load_schema("event")))


def _message(error) -> str:
    where = "/".join(str(p) for p in error.absolute_path) or "(envelope)"
    return f"{where}: {error.message}"


def validate_event(envelope: dict[str, Any]) -> list[str]:
    """Every schema violation of one full envelope, as 'path: message' lines (empty = valid)."""
    errors = sorted(event_validator().iter_errors(envelope), key=lambda e: list(e.absolute_path))
    return [_message(e) for e in errors]


@functools.cache
def _part_validator(envelope_part: str, type_: str | None = None):
    """A validator for one part of the envelope (actor, or the data of one type), resolving
    $refs against the whole event schema."""
    schema = load_schema("event")
    if envelope_part == "data":
        sub = {"$ref": f"#/$defs/data_{type_}"}
    else:
        sub = schema["properties"][envelope_part]
    return _validator(json.dumps({**{k: v for k, v in schema.items() if k in ("$schema", "$defs")}, **sub}))


# -- a compiled checker for the keywords our schemas use -----------------------------------
# jsonschema takes ~100 us per event here; verify needs a few. This compiles the subset of
# 2020-12 that schemas/event.schema.json uses into closures, refuses any other keyword (so a
# schema edit cannot be silently ignored: it falls back to jsonschema), and the tests check
# it agrees with jsonschema.
_ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "$comment", "$defs", "examples", "default"})
_TYPES: dict[str, Any] = {
    "object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
    "integer": int, "number": (int, float),
}


class Unsupported(Exception):
    pass


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def compile_schema(schema: Any, root: dict[str, Any], _refs: dict[str, Any] | None = None):
    """A function value -> first error message or None, for the supported keyword subset."""
    refs = {} if _refs is None else _refs
    if schema is True or schema == {}:
        return lambda v: None
    checks = []
    unknown = set(schema) - _ANNOTATIONS - {
        "type", "properties", "required", "enum", "const", "pattern", "minimum", "minLength",
        "maxLength", "items", "$ref", "if", "then", "allOf", "additionalProperties",
    }
    if unknown or "then" in schema and "if" not in schema:
        raise Unsupported(sorted(unknown))
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise Unsupported(ref)
        if ref not in refs:
            refs[ref] = None
            refs[ref] = compile_schema(root["$defs"][ref.removeprefix("#/$defs/")], root, refs)
        checks.append(lambda v, ref=ref: refs[ref](v))
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if {"integer", "number"}.isdisjoint(names):  # no bool/float subtleties: one isinstance
            classes = tuple(_TYPES[n] for n in names)
            checks.append(lambda v, names=names, classes=classes: None if isinstance(v, classes) else f"{v!r} is not of type {', '.join(map(repr, names))}")
        else:
            checks.append(lambda v, names=names: None if any(_is_type(v, n) for n in names) else f"{v!r} is not of type {', '.join(map(repr, names))}")
    if "enum" in schema:
        options = schema["enum"]
        if all(type(o) is str for o in options):  # the usual case: a set lookup
            strings = frozenset(options)
            checks.append(lambda v: None if type(v) is str and v in strings else f"{v!r} is not one of {options}")
        else:
            checks.append(lambda v: None if any(v == o and type(v) is type(o) for o in options) else f"{v!r} is not one of {options}")
    if "const" in schema:
        const = schema["const"]
        checks.append(lambda v: None if v == const and type(v) is type(const) else f"{const!r} was expected")
    if "pattern" in schema:
        rx = re.compile(schema["pattern"])
        checks.append(lambda v: None if not isinstance(v, str) or rx.search(v) else f"{v!r} does not match {rx.pattern!r}")
    if "minimum" in schema:
        low = schema["minimum"]
        checks.append(lambda v: None if not _is_type(v, "number") or v >= low else f"{v} is less than the minimum of {low}")
    if "minLength" in schema:
        n = schema["minLength"]
        checks.append(lambda v: None if not isinstance(v, str) or len(v) >= n else f"{v!r} is too short")
    if "maxLength" in schema:
        n = schema["maxLength"]
        checks.append(lambda v: None if not isinstance(v, str) or len(v) <= n else f"{v!r} is too long")
    if "required" in schema:
        req = schema["required"]
        checks.append(lambda v: None if not isinstance(v, dict) else next((f"{k!r} is a required property" for k in req if k not in v), None))
    if "properties" in schema:
        props = {k: compile_schema(sub, root, refs) for k, sub in schema["properties"].items()}

        def check_props(v: Any) -> str | None:
            if not isinstance(v, dict):
                return None
            for k, check in props.items():
                if k in v and (err := check(v[k])) is not None:
                    return f"{k}: {err}" if not err.startswith(("'", "/")) or ": " not in err else f"{k}/{err}"
            return None

        checks.append(check_props)
    if schema.get("additionalProperties") is False:
        allowed = set(schema.get("properties", {}))
        checks.append(lambda v: None if not isinstance(v, dict) or set(v) <= allowed else f"additional properties {sorted(set(v) - allowed)} are not allowed")
    elif "additionalProperties" in schema:
        raise Unsupported("additionalProperties")
    if "items" in schema:
        item = compile_schema(schema["items"], root, refs)
        checks.append(lambda v: None if not isinstance(v, list) else next((f"{i}: {e}" for i, x in enumerate(v) if (e := item(x))), None))
    if "if" in schema:
        cond = compile_schema(schema["if"], root, refs)
        then = compile_schema(schema.get("then", True), root, refs)
        checks.append(lambda v: then(v) if cond(v) is None else None)
    for sub in schema.get("allOf", ()):
        checks.append(compile_schema(sub, root, refs))

    if len(checks) == 1:
        return checks[0]

    def check(v: Any) -> str | None:
        for c in checks:
            if (err := c(v)) is not None:
                return err
        return None

    return check


@functools.cache
def _fast_part(part: str, type_: str | None):
    schema = load_schema("event")
    sub = schema["properties"]["actor"] if part == "actor" else {"$ref": f"#/$defs/data_{type_}"}
    try:
        return compile_schema(sub, schema)
    except Unsupported:
        validator = _part_validator(part, type_)

        def slow(value: Any) -> str | None:
            error = next(iter(sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))), None)
            return None if error is None else _message(error)

        return slow


_MISS = object()


class RowChecker:
    """Schema verdicts for stored rows (`Store.raw_rows` layout), fast enough for a million."""

    _CACHE_LIMIT = 200_000

    def __init__(self) -> None:
        props = load_schema("event")["properties"]
        self.types = frozenset(props["type"]["enum"])
        self._patterns = {
            name: re.compile(props[name]["pattern"]) for name in ("stream", "time", "id", "prev_hash", "hash")
        }
        self._max_stream = props["stream"].get("maxLength", 10**9)
        self._time_search = self._patterns["time"].search
        self._id_search = self._patterns["id"].search
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
        if not (isinstance(seq, int) and seq >= 1 and isinstance(version, int) and version >= 1):
            return "seq and version must be integers >= 1"
        if not isinstance(causation, str | None):
            return "causation: must be a string or null"
        if stream not in self._streams:
            if not isinstance(stream, str) or self._patterns["stream"].search(stream) is None or len(stream) > self._max_stream:
                return f"stream: {stream!r} does not match the schema"
            self._streams.add(stream)
        if not isinstance(time_, str) or self._time_search(time_) is None:
            return f"time: {time_!r} does not match the schema"
        if not isinstance(id_, str) or self._id_search(id_) is None:
            return f"id: {id_!r} does not match the schema"
        if not hashes_checked:
            for name, value in (("prev_hash", prev_hash), ("hash", hash_)):
                if not isinstance(value, str) or self._patterns[name].search(value) is None:
                    return f"{name}: {value!r} does not match the schema"
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
        try:
            value = json.loads(text)
            self.last_decoded = (text, value)  # verify's fold reuses it instead of decoding again
        except ValueError as exc:
            verdict: str | None = f"{'actor' if part == 'actor' else 'data'}: not JSON ({exc})"
        else:
            check = _fast_part("actor", None) if part == "actor" else _fast_part("data", part)
            error = check(value)
            verdict = None if error is None else f"{'actor' if part == 'actor' else 'data'}: {error}"
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
