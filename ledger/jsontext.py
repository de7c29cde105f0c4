"""Indented JSON with sorted keys, as every `--json` of a read model prints it, and the same
text made piece by piece: an item rendered once (a job's state in a snapshot) is joined
into a list later without being decoded and encoded again."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, BinaryIO

import msgspec

_INDENT = 2
SEPARATOR = b",\n" + b" " * _INDENT  # between the items of a list `pretty` prints


def pretty(value: Any) -> bytes:
    """`value` (JSON's own types only) indented by 2, keys sorted: the bytes json.dumps(value,
    indent=2, sort_keys=True, ensure_ascii=False) gives, encoded as UTF-8."""
    return msgspec.json.format(msgspec.json.encode(value, order="sorted"), indent=_INDENT)


def item(value: Any) -> bytes:
    """`value` as an element of a list `pretty` prints: indented one level deeper (a newline
    inside a JSON string is written escaped, so every raw newline is layout)."""
    return pretty(value).replace(b"\n", b"\n" + b" " * _INDENT)


def pretty_list(items: Iterable[bytes | memoryview]) -> bytes:
    """pretty([v1, v2, ...]) from item(v1), item(v2), ... (or runs of items already
    joined by SEPARATOR)."""
    body = SEPARATOR.join(items)
    return b"[\n" + b" " * _INDENT + body + b"\n]" if body else b"[]"


def write_list(out: BinaryIO, items: Iterable[bytes | memoryview]) -> None:
    """pretty_list(items) written to `out` as it comes, never joined in memory (20k jobs'
    states are 49 MB of text)."""
    first = True
    for it in items:
        out.write(b"[\n" + b" " * _INDENT if first else SEPARATOR)
        out.write(it)
        first = False
    out.write(b"[]" if first else b"\n]")
