"""How figures read for people, the same in the terminal and in the dashboard: chip-hours,
durations, money, shares. Pure."""

from __future__ import annotations

from ledger.usage import UsageRow


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


def usage_cells(row: UsageRow) -> list[str]:
    """A usage row as `ledger usage` prints it (and the dashboard's usage table shows it):
    the group, then one cell per USAGE_HEADERS; setup includes provisioning."""
    h = row.chip_hours
    return [
        row.group, chip_hours(h("held")), chip_hours(h("running")), chip_hours(h("setup") + h("provisioning")),
        chip_hours(h("recovering")), chip_hours(h("after_end")), chip_hours(h("waiting")), percent(row.goodput),
        str(row.preemptions), chip_hours(row.lost_chip_hours), duration(row.mttr_s), money(row.cost),
        money(row.ondemand_cost),
    ]


USAGE_HEADERS = ("held", "running", "setup", "recovering", "after end", "waiting", "goodput", "preempted", "lost",
                  "MTTR", "cost", "on demand")
