"""The values the spec package hands out: messages and results."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ledger.events import canonical


def spec_hash(spec: dict) -> str:
    """SHA-256 of the canonical JSON of a normalized spec: equal specs, equal hashes."""
    return hashlib.sha256(canonical(spec)).hexdigest()


@dataclass(frozen=True)
class Message:
    """One finding about one file. line/column are 1-based; 0 when the file could not be read."""

    file: str
    line: int
    column: int
    pointer: str  # JSON pointer of the field, "" for the whole document
    message: str
    hint: str
    severity: str  # "error" | "warning"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "pointer": self.pointer,
            "message": self.message,
            "hint": self.hint,
            "severity": self.severity,
        }

    def format(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        field_ = f" [{self.pointer}]" if self.pointer else ""
        text = f"{where}: {self.severity}: {self.message}{field_}"
        return f"{text}\n    hint: {self.hint}" if self.hint else text


@dataclass(frozen=True)
class SpecResult:
    path: str  # repo-relative, e.g. "jobs/alice/bert.yaml"
    job_id: str | None  # "alice/bert" when the path is well-formed
    spec: dict | None  # normalized spec; None when invalid
    errors: list[Message] = field(default_factory=list)
    warnings: list[Message] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "job_id": self.job_id,
            "ok": self.ok,
            "spec_hash": spec_hash(self.spec) if self.spec is not None else None,
            "errors": [m.to_dict() for m in self.errors],
            "warnings": [m.to_dict() for m in self.warnings],
        }

