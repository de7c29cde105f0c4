"""How figures read for people, the same in the terminal and in the dashboard: chip-hours,
durations, money, shares. Pure."""

from __future__ import annotations


def chip_hours(value: float) -> str:
    if value == 0:
        return "0"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}" if value >= 0.001 else "<0.001"  # a demo's seconds on a TPU


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def money(usd: float | None) -> str:
    return "?" if usd is None else f"${usd:,.2f}"


def percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"
