"""Chip-hours by week and owner, from the usage fold's intervals. Pure.

The live usage fold hands every interval it closes to `Weeks.add` (its `on_interval`), which
splits it at week boundaries (Monday 00:00 UTC) and adds it up per week and owner, keeping
nothing else: memory grows with weeks times owners, never with the ledger. Open intervals
(jobs still running, waiting or holding) are added when a table is asked for, up to `now`,
so the table always covers the same time as `ledger usage` at that moment.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC
from typing import Any

from ledger.usage import CATEGORIES, HELD, Interval, from_us

WEEK_US = 7 * 86_400 * 1_000_000
_MONDAY = 4 * 86_400 * 1_000_000  # 1970-01-05, the first Monday after the epoch
_RUNNING = CATEGORIES.index("running")
US_PER_HOUR = 3_600_000_000


def week_of(us: int) -> int:
    """The start (us) of the week holding `us`: the Monday before it, 00:00 UTC."""
    return us - (us - _MONDAY) % WEEK_US


class Weeks:
    """Chip-microseconds per (week start, owner), per usage category."""

    def __init__(self) -> None:
        self.cells: dict[tuple[int, str], list[int]] = {}

    def add(self, iv: Interval) -> None:
        _add(self.cells, iv)

    def table(self, open_intervals: Iterable[Interval] = (), last: int | None = None) -> list[dict[str, Any]]:
        """One entry per week (oldest first, the `last` weeks at most): chip-hours held and
        running per owner, the week's totals and goodput."""
        cells = {key: values[:] for key, values in self.cells.items()}
        for iv in open_intervals:
            _add(cells, iv)
        weeks: dict[int, dict[str, list[int]]] = {}
        for (week, owner), values in cells.items():
            weeks.setdefault(week, {})[owner] = values
        out = []
        for week in sorted(weeks)[-last if last else None:]:
            owners = {}
            for owner, values in sorted(weeks[week].items()):
                held = sum(values[c] for c in HELD)
                owners[owner] = {"held": round(held / US_PER_HOUR, 6), "running": round(values[_RUNNING] / US_PER_HOUR, 6)}
            held = sum(o["held"] for o in owners.values())
            running = sum(o["running"] for o in owners.values())
            out.append({"week": from_us(week).astimezone(UTC).strftime("%Y-%m-%d"), "owners": owners,
                        "held": round(held, 6), "running": round(running, 6),
                        "goodput": round(running / held, 6) if held else None})
        return out


def _add(cells: dict[tuple[int, str], list[int]], iv: Interval) -> None:
    start, owner = iv.start, iv.key.owner
    while start < iv.end:
        week = week_of(start)
        stop = min(iv.end, week + WEEK_US)
        values = cells.get((week, owner))
        if values is None:
            values = cells[week, owner] = [0] * len(CATEGORIES)
        values[iv.category] += (stop - start) * iv.chips
        start = stop
