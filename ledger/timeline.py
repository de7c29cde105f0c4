"""A job's timeline as plain lines that fit a width: `ledger inspect`'s compact view. Pure.

Each event is a head line, `seq time type actor`, followed by its summary: on the same line
when it fits, else below it, wrapped at spaces under a hanging indent. A date line comes
before the first event of each day, so the head lines carry only the time of day.

Words are never cut: ids, hashes, paths and e-mail addresses stay whole, so they can be
copied and searched for. A word too long for the indented space starts its own line at
column 2 (or 0); only a word longer than the whole width makes a line longer than the width.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

MIN_WIDTH = 20  # narrower than this, wrapping helps no one: lines are laid out as if this wide


@dataclass(frozen=True, slots=True)
class Row:
    seq: int
    time: str  # ISO 8601 UTC, as events carry it
    type: str
    actor: str
    summary: str


def cells(text: str) -> int:
    """Terminal columns `text` takes (East Asian wide and full-width characters take two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 0 if unicodedata.combining(ch) else 1
               for ch in text)


def wrap(words: Iterable[str], width: int, first: str, indent: int) -> list[str]:
    """Greedy word wrap: the first line starts with `first`, the others with `indent` spaces.

    A word that does not fit on the current line starts the next one; one longer than the
    space after the indent starts at column 2, or 0, and is never cut.
    """
    lines: list[str] = []
    line, used, fresh = first, cells(first), True  # fresh: nothing but the prefix yet
    for word in words:
        size = cells(word)
        if used + (0 if fresh else 1) + size > width:
            if not fresh or line.strip():  # words, or a prefix like "12 10:00:05", come first
                lines.append(line.rstrip())
            pad = indent if indent + size <= width else 2 if 2 + size <= width else 0
            line, used, fresh = " " * pad, pad, True
        if fresh:
            line, used, fresh = line + word, used + size, False
        else:
            line, used = f"{line} {word}", used + 1 + size
    if not fresh or line.strip():
        lines.append(line)
    return lines


def _clock(iso: str) -> tuple[str, str]:
    """(date, time of day to the second) of an event time; an odd time is kept whole."""
    if len(iso) >= 19 and iso[10] == "T":
        return iso[:10], iso[11:19]
    return "", iso


def compact(title: str, rows: Iterable[Row], width: int) -> list[str]:
    """The timeline, every line at most `width` columns (but a single word wider than that)."""
    width = max(width, MIN_WIDTH)
    rows = list(rows)
    seq_width = max((len(str(r.seq)) for r in rows), default=1)
    indent = seq_width + 1 + 9  # under the event type: past "seq HH:MM:SS "
    out = wrap(title.split(), width, "", 2)
    day = None
    for r in rows:
        date, clock = _clock(r.time)
        if date and date != day:
            out.append(date)
            day = date
        head = wrap([r.type, *r.actor.split()], width, f"{r.seq:>{seq_width}} {clock} ", indent)
        summary = r.summary.split()
        if summary and len(head) == 1 and cells(head[0]) + 2 + cells(" ".join(summary)) <= width:
            head[0] = f"{head[0]}  {' '.join(summary)}"
        elif summary:
            head += wrap(summary, width, " " * indent, indent)
        out += head
    return out
