"""The JSON Schemas in `schemas/`, loaded as data, and their errors turned into plain words.

A jsonschema error names a keyword (`required`, `enum`, ...); users need to hear which
field is wrong, what was expected and what to write instead.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from ledger.resources import load_schema
from ledger.spec.yamlsafe import escape

if TYPE_CHECKING:
    import jsonschema


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    import jsonschema  # start-up time: 0.1 s CPU paid only to explain a refused document

    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


@dataclass(frozen=True)
class Problem:
    pointer: str
    message: str
    hint: str
    at_key: bool = False  # position the key rather than the value


_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if value is None:
        return "null"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, list):
        return "a list"
    return "a mapping"


def _pointer(path: Any) -> str:
    return "".join(f"/{escape(str(p))}" for p in path)


def _field(pointer: str) -> str:
    return pointer.lstrip("/").replace("/", ".") or "the document"


def _resolve(schema: dict, root: dict) -> dict:
    while "$ref" in schema:
        ref = schema["$ref"]
        node: Any = root
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def close_match(word: str, options: list[str]) -> str | None:
    found = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return found[0] if found else None


# jsonschema explains *why* a document is invalid, at about 0.3 ms per job spec; a
# 10,000-file repository must validate in seconds (bench/spec_bench.py). So the yes/no comes
# from jsonschema-rs (the same 2020-12 schema, compiled in Rust, ~2 us per spec) and
# jsonschema runs only on the documents it refuses, to produce the messages.
@cache
def fast_validator(name: str) -> Any:
    import jsonschema_rs

    return jsonschema_rs.validator_for(load_schema(name))


def is_valid(name: str, instance: Any) -> bool:
    """The fast verdict; False also when jsonschema-rs cannot read the value (a YAML mapping
    with a non-string key), so jsonschema, the reference, has the last word."""
    try:
        return fast_validator(name).is_valid(instance)
    except ValueError:
        return False


def problems(name: str, instance: Any) -> Iterator[Problem]:
    """What is wrong with `instance`, in plain words; nothing when valid."""
    if is_valid(name, instance):
        return
    root = load_schema(name)
    for err in sorted(validator(name).iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        yield from _translate(err, root)


def _translate(err: jsonschema.ValidationError, root: dict) -> Iterator[Problem]:
    ptr = _pointer(err.absolute_path)
    where = _field(ptr)
    schema = err.schema if isinstance(err.schema, dict) else {}
    hint = schema.get("x-hint", "")
    kw = err.validator
    value = err.instance
    if kw == "required":
        missing = [r for r in err.validator_value if isinstance(value, dict) and r not in value]
        for field_ in missing:
            section = f"under `{where}`" if ptr else "at the top level"
            yield Problem(f"{ptr}/{escape(field_)}", f"missing required field `{field_}`", f"add `{field_}:` {section}")
        return
    if kw == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        patterns = schema.get("patternProperties", {})
        import re

        for key in value:
            if key in allowed or any(re.search(p, key) for p in patterns):
                continue
            guess = close_match(key, allowed)
            fix = f"did you mean `{guess}`?" if guess else (
                f"fields allowed here: {', '.join(allowed)}" if allowed else "remove it"
            )
            yield Problem(f"{ptr}/{escape(key)}", f"unknown field `{key}` in `{where}`", fix, at_key=True)
        return
    if kw == "propertyNames":
        key = value
        return_hint = hint or (_resolve(schema, root).get("x-hint", "") if isinstance(schema, dict) else "")
        yield Problem(ptr, f"`{key}` is not an allowed name in `{_field(ptr.rsplit('/', 1)[0])}`",
                      return_hint or "use letters, digits, underscores and dashes", at_key=True)
        return
    if kw == "type":
        types = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        expected = " or ".join(_TYPE_WORDS.get(t, t) for t in types)
        if not hint and "string" in types and isinstance(value, (bool, int, float)):
            hint = "put the value in quotes to make it a string (YAML reads yes/no/on/off as booleans and 3.10 as 3.1)"
        if not hint and "boolean" in types and isinstance(value, str):
            hint = "write true or false without quotes"
        if not hint and isinstance(value, str) and types and types[0] in ("integer", "number"):
            hint = "write the number without quotes"
        yield Problem(ptr, f"`{where}` must be {expected}, not {describe(value)}", hint or f"change `{where}` to {expected}")
        return
    if kw in ("enum", "const"):
        options = err.validator_value if kw == "enum" else [err.validator_value]
        shown = ", ".join(json.dumps(o) for o in options)
        guess = close_match(str(value), [str(o) for o in options])
        fix = f"did you mean {guess!r}?" if guess else f"use one of: {shown}"
        yield Problem(ptr, f"`{where}` is {describe(value)}; expected one of: {shown}", hint or fix)
        return
    if kw in ("anyOf", "oneOf"):
        expect = schema.get("x-expect") or "a value of another form"
        yield Problem(ptr, f"`{where}` is {describe(value)}; expected {expect}", hint or f"change `{where}` to {expect}")
        return
    if kw == "pattern":
        yield Problem(ptr, f"`{where}` is {describe(value)}, which is not in the expected form (pattern {err.validator_value})",
                      hint or "check the spelling against the examples in jobs/examples/")
        return
    if kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        word = "at least" if "inimum" in kw else "at most"
        yield Problem(ptr, f"`{where}` is {value}; it must be {word} {err.validator_value}", hint or f"use a value {word} {err.validator_value}")
        return
    if kw == "minLength":
        yield Problem(ptr, f"`{where}` is empty", hint or f"give `{where}` a value, or remove it")
        return
    if kw == "maxLength":
        yield Problem(ptr, f"`{where}` is longer than {err.validator_value} characters", hint or "shorten it")
        return
    if kw == "minItems":
        yield Problem(ptr, f"`{where}` needs at least {err.validator_value} item(s)", hint or "add an item, or remove the field")
        return
    if kw == "maxItems":
        yield Problem(ptr, f"`{where}` has more than {err.validator_value} items", hint or "remove some items")
        return
    if kw == "uniqueItems":
        yield Problem(ptr, f"`{where}` lists the same item twice", hint or "remove the duplicate")
        return
    yield Problem(ptr, f"`{where}`: {err.message}", hint)


def fill_defaults(name: str, instance: Any) -> Any:
    """A copy of a schema-valid `instance` with every `default` of object properties filled."""
    return _filler(name)(instance)


@cache
def _filler(name: str) -> Any:
    root = load_schema(name)
    return _compile_fill(root, root, {})


def _compile_fill(schema: Any, root: dict, memo: dict[int, Any]) -> Any:
    """A function copying an instance and filling defaults: the schema is walked once, here."""
    if not isinstance(schema, dict):
        return None
    schema = _resolve(schema, root)
    if id(schema) in memo:
        return memo[id(schema)]
    memo[id(schema)] = None  # cycles: no filling below a recursive reference
    props = {k: _resolve(s, root) for k, s in schema.get("properties", {}).items()}
    defaults = [(k, s["default"]) for k, s in props.items() if "default" in s]
    children = {k: f for k, s in props.items() if (f := _compile_fill(s, root, memo)) is not None}
    extra = schema.get("additionalProperties")
    extra_fill = _compile_fill(extra, root, memo) if isinstance(extra, dict) else None
    items = schema.get("items")
    item_fill = _compile_fill(items, root, memo) if isinstance(items, dict) else None
    if not defaults and not children and extra_fill is None and item_fill is None:
        return None

    def fill(v: Any) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                f = children.get(k, extra_fill if k not in props else None)
                out[k] = f(x) if f is not None else x
            for k, d in defaults:
                if k not in out:
                    # Fresh containers per document: callers may change what they get.
                    out[k] = copy.deepcopy(d) if isinstance(d, (dict, list)) and d else (type(d)() if isinstance(d, (dict, list)) else d)
            return out
        if isinstance(v, list) and item_fill is not None:
            return [item_fill(x) for x in v]
        return v

    memo[id(schema)] = fill
    return fill
