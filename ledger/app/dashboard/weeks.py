"""Chip-hours by week and owner, as the usage page and /api/usage/weeks show them. Pure.

The usage fold keeps the sums of the intervals it closed, per week (Monday 00:00 UTC) and
owner (`UsageFold.weeks`; a usage snapshot holds them, so the dashboard does not fold from
the first event to have them). Open intervals (jobs still running, waiting or holding) are
added when a table is asked for, up to `now`, so the table always covers the same time as
`ledger usage` at that moment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC
from typing import Any

from ledger.usage import CATEGORIES, HELD, Interval, from_us
from ledger.usage.fold import US_PER_HOUR, add_to_weeks

_RUNNING = CATEGORIES.index("running")


def week_table(closed: Mapping[tuple[int, str], list[int]], open_intervals: Iterable[Interval] = (),
               last: int | None = None) -> list[dict[str, Any]]:
    """One entry per week (oldest first, the `last` weeks at most): chip-hours held and
    running per owner, the week's totals and goodput, from the fold's `weeks` and its open
    intervals (neither is changed)."""
    cells = {key: values[:] for key, values in closed.items()}
    for iv in open_intervals:
        add_to_weeks(cells, iv.key.owner, iv.category, iv.start, iv.end, iv.chips)
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
