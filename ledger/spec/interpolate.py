"""`${tpu.accelerator}`-style references between fields, as in JOBMAN's (OmegaConf) configs.

Only dotted references whose first part is a spec section are replaced, so shell
variables in scripts (`${HOME}`, `$TPU_NAME`) pass through untouched. A string that is
exactly one reference takes the referenced value with its type.

A spec is untrusted input, and references multiply: ten fields that each hold ten copies of
the previous one make 10^10 characters from a one-kilobyte file (the "billion laughs" of
YAML aliases). So the work is bounded, the way YAML parsers bound alias expansion: each
reference is resolved once (memoised), a chain may be at most MAX_DEPTH references deep, a
spec may make at most MAX_EXPANSIONS substitutions, and no value nor the sum of every
expanded value may grow past MAX_VALUE_CHARS / MAX_OUTPUT_CHARS. The check runs before the
text is built, so refusing a bomb costs about as much as reading it.
"""

from __future__ import annotations

import json
import re
from typing import Any

REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)+)\}")
MAX_DEPTH = 10  # references followed in one chain (a -> b -> c ...)
MAX_EXPANSIONS = 1_000  # substitutions made in one spec
MAX_VALUE_CHARS = 64 * 1024  # one field after expansion
MAX_OUTPUT_CHARS = 256 * 1024  # every expanded field together
MAX_ROUNDS = MAX_DEPTH  # the old name, kept for callers


class InterpolationError(Exception):
    def __init__(self, pointer: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.pointer = pointer
        self.message = message
        self.hint = hint


def _lookup(spec: dict, dotted: str) -> tuple[bool, Any]:
    node: Any = spec
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _field(pointer: str) -> str:
    return pointer.lstrip("/").replace("/", ".") or "the document"


class _Budget:
    """What one spec may still spend: substitutions and characters of output."""

    def __init__(self) -> None:
        self.expansions = 0
        self.output = 0

    def substitution(self, pointer: str) -> None:
        self.expansions += 1
        if self.expansions > MAX_EXPANSIONS:
            raise InterpolationError(
                pointer, f"`{_field(pointer)}`: more than {MAX_EXPANSIONS:,} references expanded in one spec",
                "references are for naming a few values once; write the text out instead",
            )

    def text(self, pointer: str, size: int) -> None:
        if size > MAX_VALUE_CHARS:
            raise InterpolationError(
                pointer, f"`{_field(pointer)}` expands to more than {MAX_VALUE_CHARS:,} characters (the limit)",
                "a reference repeated inside references multiplies; reference each value once",
            )


def interpolate(spec: dict, sections: frozenset[str]) -> dict:
    """A copy of `spec` with every reference resolved; raises InterpolationError."""
    budget = _Budget()
    resolved: dict[str, Any] = {}  # dotted -> its expanded value: each reference costs once
    depth: dict[str, int] = {}  # dotted -> the longest chain of references it starts
    frames: list[int] = [0]  # per expansion under way: the deepest reference it met

    def too_deep(chain: str) -> None:
        raise InterpolationError(pointer_now[0], f"`{_field(pointer_now[0])}`: references nested more than {MAX_DEPTH} deep ({chain})",
                                 "reference the value itself, not a reference to a reference")

    pointer_now = [""]

    def expand(value: str, pointer: str, seen: tuple[str, ...]) -> Any:
        whole = REF.fullmatch(value)

        def resolve(dotted: str) -> Any:
            budget.substitution(pointer)
            if dotted not in resolved:
                if dotted in seen:
                    chain = " -> ".join((*seen, dotted))
                    raise InterpolationError(pointer, f"circular reference: {chain}", "break the cycle: one of the fields must hold a plain value")
                if len(seen) >= MAX_DEPTH:  # before recursing further: the stack stays short
                    too_deep(" -> ".join((*seen, dotted)))
                found, target = _lookup(spec, dotted)
                if not found or target is None:
                    raise InterpolationError(
                        pointer, f"reference ${{{dotted}}} points at nothing",
                        "reference a field that has a value, e.g. ${tpu.accelerator}",
                    )
                inner = 0
                if isinstance(target, str) and "${" in target:
                    frames.append(0)
                    try:
                        target = expand(target, pointer, (*seen, dotted))
                    finally:
                        inner = frames.pop()
                resolved[dotted] = target
                depth[dotted] = inner + 1
            # The chain's length is remembered with the value, so the verdict does not depend
            # on which field happened to be expanded first.
            if depth[dotted] > MAX_DEPTH:
                too_deep(dotted)
            frames[-1] = max(frames[-1], depth[dotted])
            return resolved[dotted]

        if whole and whole.group(1).split(".", 1)[0] in sections:
            return resolve(whole.group(1))

        pieces: list[str] = []
        size = 0
        last = 0
        for m in REF.finditer(value):
            dotted = m.group(1)
            if dotted.split(".", 1)[0] not in sections:
                continue
            target = resolve(dotted)
            if isinstance(target, (dict, list)):
                raise InterpolationError(pointer, f"${{{dotted}}} is a {'mapping' if isinstance(target, dict) else 'list'} and cannot be put inside text",
                                         "reference a single value")
            text = ("true" if target else "false") if isinstance(target, bool) else str(target)
            literal = value[last:m.start()]
            size += len(literal) + len(text)
            budget.text(pointer, size + len(value) - m.end())  # checked before the text is built
            pieces += [literal, text]
            last = m.end()
        if not pieces:
            return value
        pieces.append(value[last:])
        return "".join(pieces)

    def walk(node: Any, pointer: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{pointer}/{k}") for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{pointer}/{i}") for i, v in enumerate(node)]
        if isinstance(node, str) and "${" in node:
            pointer_now[0] = pointer
            out = expand(node, pointer, ())
            # a whole reference to a mapping or list copies it: that counts as output too
            budget.output += len(out) if isinstance(out, str) else len(json.dumps(out, default=str))
            if budget.output > MAX_OUTPUT_CHARS:
                raise InterpolationError(
                    pointer, f"the spec's references expand to over {MAX_OUTPUT_CHARS:,} characters (reached at `{_field(pointer)}`)",
                    "reference each value once; long text belongs in a script in your code repository",
                )
            return out
        return node

    return walk(spec, "")
