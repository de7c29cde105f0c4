"""SQL lives in `.sql` files beside each backend, shipped in the wheel as package data.

A script file is run whole (schema, triggers). A queries file holds named statements, each
introduced by a line `-- name: NAME` and running to the next such line; comments above a
statement stay with it. Files are read once per process.
"""

from __future__ import annotations

import functools
import importlib.resources
import re

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def script(package: str, filename: str) -> str:
    return importlib.resources.files(package).joinpath(filename).read_text(encoding="utf-8")


@functools.cache
def queries(package: str, filename: str) -> dict[str, str]:
    parts = _NAME.split(script(package, filename))
    # parts = [preamble, name1, body1, name2, body2, ...]
    named = {name: body.strip().removesuffix(";").strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}
    if len(named) != len(parts) // 2:
        raise ValueError(f"{package}/{filename} names a statement twice")
    return named
