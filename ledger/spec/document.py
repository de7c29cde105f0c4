"""A settings file of the jobs repository (`.ledger/aliases.yaml`, `.ledger/policy.yaml`), read
the one way: the hardened YAML loader, then the file's JSON Schema, every problem a `Message`
with file, line and column, as `ledger validate` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.spec.model import Message
from ledger.spec.schema import Problem, problems
from ledger.spec.yamlsafe import MAX_BYTES, Loaded, LoadError, load


@dataclass(frozen=True, slots=True)
class Checked:
    """The document as loaded (a mapping; {} when empty or unreadable) and what is wrong with it.

    A problem's `pointer` names the field; "" means the whole document (it could not be
    loaded, or is not a mapping).
    """

    data: dict[str, Any]
    errors: tuple[Message, ...]
    loaded: Loaded | None = None  # positions of every node, for checks made after the schema's

    def message(self, file: str, problem: Problem) -> Message:
        """A later check's problem at its field's line and column."""
        line, column = self.loaded.position(problem.pointer, key=problem.at_key) if self.loaded else (0, 0)
        return Message(file, line, column, problem.pointer, problem.message, problem.hint, "error")


def check_document(text: str | bytes | None, file: str, schema: str) -> Checked:
    """Load `text` safely and check it against the schema `schema` (aliases | policy)."""
    if text is None:
        return Checked({}, ())
    try:
        loaded = load(text)
    except LoadError as exc:
        if exc.message == "file is empty":
            return Checked({}, ())  # an empty or all-comments file means "no settings": the defaults
        return Checked({}, (Message(file, exc.line, exc.column, "", exc.message, exc.hint, "error"),))
    if not isinstance(loaded.data, dict):
        return Checked({}, (Message(file, 1, 1, "", "the file must be a mapping",
                                    "see jobs-repo-template/.ledger/", "error"),))
    checked = Checked(loaded.data, (), loaded)
    errors = [checked.message(file, p) for p in problems(schema, loaded.data)]
    return Checked(loaded.data, tuple(sorted(errors, key=lambda m: (m.line, m.column))), loaded)


def read_bounded(path: Path) -> bytes | None:
    """The file's first MAX_BYTES + 1 bytes (enough for the loader to refuse a huge file);
    None when there is no such file."""
    if not path.is_file():
        return None
    with path.open("rb") as fh:
        return fh.read(MAX_BYTES + 1)
