"""A fast yes/no check for the JSON Schema keywords our schemas use.

jsonschema explains *why* a document is invalid, at about a millisecond per job spec; a
10,000-file repository must validate in seconds. So each schema is compiled once into
nested closures that answer only "valid or not"; jsonschema runs only on documents this
check refuses, to produce the messages. The schema files stay the one source of truth,
and tests compare both answers on every fixture. An unsupported keyword makes `compile_`
return None, and callers fall back to jsonschema for everything.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

_ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description", "default", "examples", "$comment"}
_SUPPORTED = _ANNOTATIONS | {
    "$ref", "type", "properties", "additionalProperties", "patternProperties", "required", "enum", "const",
    "pattern", "minimum", "maximum", "minLength", "maxLength", "items", "minItems", "maxItems",
    "uniqueItems", "anyOf", "propertyNames", "if", "then",
}


class Unsupported(Exception):
    pass


def _is_type(value: Any, name: str) -> bool:
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    raise Unsupported(name)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def compile_(schema: dict) -> Check | None:
    try:
        return _compile(schema, schema, {})
    except Unsupported:
        return None


def _compile(schema: Any, root: dict, memo: dict[int, Check]) -> Check:
    if schema is True or schema == {}:
        return lambda v: True
    if schema is False:
        return lambda v: False
    if not isinstance(schema, dict):
        raise Unsupported(repr(schema))
    unknown = set(schema) - _SUPPORTED - {k for k in schema if k.startswith("x-")}
    if unknown:
        raise Unsupported(", ".join(sorted(unknown)))
    if id(schema) in memo:
        return memo[id(schema)]
    checks: list[Check] = []

    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        checks.append(_compile(target, root, memo))
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        for n in names:
            _is_type(None, n)  # raises on unknown names
        if len(names) == 1:
            n0 = names[0]
            checks.append(lambda v, n0=n0: _is_type(v, n0))
        else:
            checks.append(lambda v, names=tuple(names): any(_is_type(v, n) for n in names))
    if "enum" in schema:
        options = schema["enum"]
        checks.append(lambda v, options=options: any(_same(v, o) for o in options))
    if "const" in schema:
        c = schema["const"]
        checks.append(lambda v, c=c: _same(v, c))
    if "pattern" in schema:
        rx = re.compile(schema["pattern"])
        checks.append(lambda v, rx=rx: not isinstance(v, str) or rx.search(v) is not None)
    for key, op in (("minLength", "ge"), ("maxLength", "le")):
        if key in schema:
            n = schema[key]
            checks.append((lambda v, n=n: not isinstance(v, str) or len(v) >= n) if op == "ge" else (lambda v, n=n: not isinstance(v, str) or len(v) <= n))
    for key, op in (("minimum", "ge"), ("maximum", "le")):
        if key in schema:
            n = schema[key]

            def num(v: Any) -> bool:
                return isinstance(v, (int, float)) and not isinstance(v, bool)

            checks.append((lambda v, n=n: not num(v) or v >= n) if op == "ge" else (lambda v, n=n: not num(v) or v <= n))
    if "required" in schema:
        req = tuple(schema["required"])
        checks.append(lambda v, req=req: not isinstance(v, dict) or all(r in v for r in req))
    if any(k in schema for k in ("properties", "additionalProperties", "patternProperties")):
        props = {k: _compile(s, root, memo) for k, s in schema.get("properties", {}).items()}
        pats = [(re.compile(p), _compile(s, root, memo)) for p, s in schema.get("patternProperties", {}).items()]
        extra_schema = schema.get("additionalProperties", True)
        extra = _compile(extra_schema, root, memo) if extra_schema is not True else None

        def obj(v: Any, props=props, pats=pats, extra=extra) -> bool:
            if not isinstance(v, dict):
                return True
            for k, item in v.items():
                matched = False
                if k in props:
                    matched = True
                    if not props[k](item):
                        return False
                for rx, check in pats:
                    if rx.search(k):
                        matched = True
                        if not check(item):
                            return False
                if not matched and extra is not None and not extra(item):
                    return False
            return True

        checks.append(obj)
    if "propertyNames" in schema:
        names = _compile(schema["propertyNames"], root, memo)
        checks.append(lambda v, names=names: not isinstance(v, dict) or all(names(k) for k in v))
    if "items" in schema:
        item = _compile(schema["items"], root, memo)
        checks.append(lambda v, item=item: not isinstance(v, list) or all(item(x) for x in v))
    if "minItems" in schema:
        n = schema["minItems"]
        checks.append(lambda v, n=n: not isinstance(v, list) or len(v) >= n)
    if "maxItems" in schema:
        n = schema["maxItems"]
        checks.append(lambda v, n=n: not isinstance(v, list) or len(v) <= n)
    if schema.get("uniqueItems"):
        def unique(v: Any) -> bool:
            if not isinstance(v, list):
                return True
            seen: list[Any] = []
            for x in v:
                if any(_same(x, s) for s in seen):
                    return False
                seen.append(x)
            return True

        checks.append(unique)
    if "anyOf" in schema:
        subs = [_compile(s, root, memo) for s in schema["anyOf"]]
        checks.append(lambda v, subs=subs: any(s(v) for s in subs))
    if "if" in schema:
        cond = _compile(schema["if"], root, memo)
        then = _compile(schema.get("then", True), root, memo)
        checks.append(lambda v, cond=cond, then=then: not cond(v) or then(v))

    if len(checks) == 1:
        memo[id(schema)] = checks[0]
        return checks[0]

    def check(v: Any, checks=tuple(checks)) -> bool:
        for c in checks:  # noqa: SIM110 - a plain loop is measurably faster than all() here
            if not c(v):
                return False
        return True

    memo[id(schema)] = check
    return check
