"""Data files that ship inside the package: the JSON Schemas and the jobs-repo template.

They live here, not at the repository's root, so that a wheel installed anywhere has them
(`pip install tpu-ledger` then `ledger init` / `ledger validate`). The root's `schemas/` and
`jobs-repo-template/` are symbolic links to these folders, for editors and readers of the
source tree.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

SCHEMA_NAMES = ("job", "aliases", "policy", "event")


def _root() -> Traversable:
    return resources.files(__name__)


def schema_file(name: str) -> Traversable:
    """`name` is job | aliases | policy | event."""
    return _root() / "schemas" / f"{name}.schema.json"


@functools.cache
def load_schema(name: str) -> dict[str, Any]:
    """The JSON Schema `name` (job | aliases | policy | event) as a dict; cached."""
    return json.loads(schema_file(name).read_text(encoding="utf-8"))


def template_dir() -> Traversable:
    """What `ledger init` lays into a new jobs repository."""
    return _root() / "jobs-repo-template"
