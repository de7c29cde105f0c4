"""`${tpu.accelerator}`-style references between fields, as in JOBMAN's (OmegaConf) configs.

Only dotted references whose first part is a spec section are replaced, so shell
variables in scripts (`${HOME}`, `$TPU_NAME`) pass through untouched. A string that is
exactly one reference takes the referenced value with its type.
"""

from __future__ import annotations

import re
from typing import Any

REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)+)\}")
MAX_ROUNDS = 10


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


def interpolate(spec: dict, sections: frozenset[str]) -> dict:
    """A copy of `spec` with every reference resolved; raises InterpolationError."""

    def expand(value: str, pointer: str, seen: tuple[str, ...]) -> Any:
        whole = REF.fullmatch(value)

        def resolve(dotted: str) -> Any:
            if dotted in seen or len(seen) > MAX_ROUNDS:
                chain = " -> ".join((*seen, dotted))
                raise InterpolationError(pointer, f"circular reference: {chain}", "break the cycle: one of the fields must hold a plain value")
            found, target = _lookup(spec, dotted)
            if not found or target is None:
                raise InterpolationError(
                    pointer, f"reference ${{{dotted}}} points at nothing",
                    "reference a field that has a value, e.g. ${tpu.accelerator}",
                )
            if isinstance(target, str):
                return expand(target, pointer, (*seen, dotted))
            return target

        if whole and whole.group(1).split(".", 1)[0] in sections:
            return resolve(whole.group(1))

        def sub(m: re.Match[str]) -> str:
            dotted = m.group(1)
            if dotted.split(".", 1)[0] not in sections:
                return m.group(0)
            target = resolve(dotted)
            if isinstance(target, (dict, list)):
                raise InterpolationError(pointer, f"${{{dotted}}} is a {'mapping' if isinstance(target, dict) else 'list'} and cannot be put inside text",
                                         "reference a single value")
            if isinstance(target, bool):
                return "true" if target else "false"
            return str(target)

        return REF.sub(sub, value)

    def walk(node: Any, pointer: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{pointer}/{k}") for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{pointer}/{i}") for i, v in enumerate(node)]
        if isinstance(node, str) and "${" in node:
            return expand(node, pointer, ())
        return node

    return walk(spec, "")
