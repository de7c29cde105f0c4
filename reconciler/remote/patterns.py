"""Output patterns that tell a failing job apart, and a pure scanner for them.

Defaults come from the tools we replace (NOTES.md): the `tpu` script's GRPC detection,
JOBMAN's preemption and failure patterns. A spec's own `recovery.error_patterns` count as
kind "grpc": they name errors the job's recovery rule for errors handles.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ledger import defaults

DEFAULT_PATTERNS: dict[str, list[str]] = {
    # Checked in this order: a preemption notice wins over the GRPC error it causes.
    "preempted": [
        r"TPU is being preempted",
        r"going through a maintenance event",
        r"TPU .* PREEMPTED",
    ],
    # The TPU is held by another process, or libtpu could not take its lock: the host checks
    # before the next start clean it (ledger/spec/recovery.py: on_tpu_busy).
    "tpu_busy": [
        r"TPU is already in use",
        r"[Cc]ouldn't open (TPU )?device",
        r"[Cc]ouldn't open iommu group",
        r"libtpu_lockfile.*(in use|[Ff]ailed|held)",
        r"[Ff]ailed to (acquire|open|lock)\b.*libtpu",
    ],
    "grpc": [
        r"GRPC error",
        r"DEADLINE_EXCEEDED",
    ],
    "failure": [
        r"Barrier timed out",
        r"RESOURCE_EXHAUSTED",
        r"oom-kill",
        r"client_loop: send disconnect: Broken pipe",
    ],
}

MAX_MATCH_CHARS = 500


def compile_patterns(extra: Iterable[str] = (), base: Mapping[str, list[str]] = DEFAULT_PATTERNS) -> list[tuple[str, re.Pattern[str]]]:
    """(kind, regex) in precedence order; a pattern that is not a valid regex is a literal."""
    out: list[tuple[str, re.Pattern[str]]] = []
    for kind, pats in base.items():
        out.extend((kind, _compile(p)) for p in pats)
    out.extend(("grpc", _compile(p)) for p in extra)
    return out


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error:
        return re.compile(re.escape(pattern))


_DEFAULT = compile_patterns()


def classify(line: str, patterns: list[tuple[str, re.Pattern[str]]] | None = None) -> str | None:
    """The kind of the first pattern that matches `line` ("preempted", "tpu_busy", "grpc", "failure"), or None."""
    for kind, rx in patterns if patterns is not None else _DEFAULT:
        if rx.search(line):
            return kind
    return None


def checkpoint_rx(pattern: str | None) -> re.Pattern[str]:
    """A job's checkpoint pattern (its one group is the step), or the default one. The spec
    validator checked it; a pattern that still does not compile is matched as a literal."""
    return _compile(pattern or defaults.CHECKPOINT_PATTERN)


def newest_step(text: str, rx: re.Pattern[str]) -> int | None:
    """The step of the last line of `text` that matches the checkpoint pattern (lines are
    cut to MAX_MATCH_CHARS before matching: the pattern runs on bounded input)."""
    for line in reversed(text.splitlines()):
        m = rx.search(line[:MAX_MATCH_CHARS])
        if m is not None and m.groups():
            digits = (m.group(1) or "").strip()
            if digits.isdigit() and len(digits) <= 18:
                return int(digits)
    return None


def scan(text: str, patterns: list[tuple[str, re.Pattern[str]]] | None = None) -> list[tuple[str, str]]:
    """(kind, line) for every line of `text` that matches, in order."""
    found = []
    for line in text.splitlines():
        kind = classify(line, patterns)
        if kind is not None:
            found.append((kind, line.strip()[:MAX_MATCH_CHARS]))
    return found
