"""The usage page's two charts as geometry for server-rendered SVG. Pure.

- by owner: one horizontal bar per owner, as long as the chip-hours held, split into what
  the holding went to (running, setup, recovering, held after the end), goodput beside it;
- by week: one column per week, as tall as the chip-hours held, stacked by owner.

Every shape carries its text (title and aria label): the chart can be read without seeing it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ledger.app.figures import chip_hours, percent
from ledger.usage import UsageRow

WIDTH = 960
OWNER_PARTS = (("running", ("running",)), ("setup", ("setup", "provisioning")), ("recovering", ("recovering",)),
               ("after_end", ("after_end",)))
PART_NAMES = {"running": "running", "setup": "setup and provisioning", "recovering": "recovering",
              "after_end": "held after end"}
COLOURS = 8  # owner colour classes in the stylesheet (owner-0 .. owner-7); more owners share "others"


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value` (an axis' top)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def _tick(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.6g}"


def owner_bars(rows: Sequence[UsageRow], width: int = WIDTH) -> dict[str, Any]:
    label_w, value_w, bar_h, gap = 150, 190, 20, 10
    plot_w = width - label_w - value_w
    top = nice_max(max((r.chip_hours("held") for r in rows), default=0))
    bars = []
    for i, row in enumerate(rows):
        y = i * (bar_h + gap)
        x, parts = float(label_w), []
        for name, categories in OWNER_PARTS:
            hours = sum(row.chip_hours(c) for c in categories)
            w = hours / top * plot_w
            if hours > 0:
                parts.append({"x": round(x, 2), "w": round(max(w, 1.0), 2), "kind": name,
                              "text": f"{row.group}: {chip_hours(hours)} chip-h {PART_NAMES[name]}"})
            x += w
        bars.append({"y": y, "mid": y + bar_h / 2, "owner": row.group, "parts": parts,
                     "value": f"{chip_hours(row.chip_hours('held'))} chip-h, goodput {percent(row.goodput)}",
                     "text": (f"{row.group}: {chip_hours(row.chip_hours('held'))} chip-hours held, "
                              f"goodput {percent(row.goodput)}, {row.preemptions} preemption(s)")})
    return {"width": width, "height": max(len(rows), 1) * (bar_h + gap), "bar_h": bar_h, "label_w": label_w,
            "value_x": width - value_w + 8, "bars": bars, "top": chip_hours(top),
            "parts": [(name, PART_NAMES[name]) for name, _ in OWNER_PARTS]}


def week_columns(weeks: Sequence[dict[str, Any]], width: int = WIDTH, height: int = 240) -> dict[str, Any]:
    """`weeks` as `week_table` gives them. Owners are coloured by their share of the whole
    period (the first COLOURS - 1 owners each have a colour; the rest are `others`)."""
    left, bottom, top_pad = 60, 26, 10
    plot_h = height - bottom - top_pad
    totals: dict[str, float] = {}
    for week in weeks:
        for owner, figures in week["owners"].items():
            totals[owner] = totals.get(owner, 0.0) + figures["held"]
    ranked = sorted(totals, key=lambda o: (-totals[o], o))
    named = ranked if len(ranked) <= COLOURS else ranked[:COLOURS - 1]
    colour = {owner: i for i, owner in enumerate(named)}
    top = nice_max(max((w["held"] for w in weeks), default=0))
    slot = (width - left - 10) / max(len(weeks), 1)
    col_w = min(64.0, slot * 0.7)
    columns = []
    for i, week in enumerate(weeks):
        x = left + i * slot + (slot - col_w) / 2
        stacked: dict[str, float] = {}
        for owner, figures in week["owners"].items():
            name = owner if owner in colour else "others"
            stacked[name] = stacked.get(name, 0.0) + figures["held"]
        y = top_pad + plot_h
        parts = []
        for name in [*named, "others"]:
            hours = stacked.get(name, 0.0)
            if hours <= 0:
                continue
            h = hours / top * plot_h
            y -= h
            parts.append({"y": round(y, 2), "h": round(max(h, 1.0), 2),
                          "cls": f"owner-{colour[name]}" if name in colour else "owner-others",
                          "text": f"week of {week['week']}: {name} {chip_hours(hours)} chip-h held"})
        columns.append({"x": round(x, 2), "w": round(col_w, 2), "mid": round(x + col_w / 2, 2), "week": week["week"],
                        "label": week["week"][5:], "parts": parts,
                        "text": (f"week of {week['week']}: {chip_hours(week['held'])} chip-hours held, "
                                 f"goodput {percent(week['goodput'])}")})
    # Fifths of a 1-2-5 top are round numbers: 0.01 .. 0.05, 0.4 .. 2, 20 .. 100.
    grid = [{"y": round(top_pad + plot_h - f / 5 * plot_h, 2), "text": _tick(top * f / 5)} for f in range(6)]
    legend = [(f"owner-{i}", owner) for i, owner in enumerate(named)]
    if len(ranked) > len(named):
        legend.append(("owner-others", f"{len(ranked) - len(named)} others"))
    return {"width": width, "height": height, "left": left, "base": top_pad + plot_h, "columns": columns,
            "grid": grid, "legend": legend}
