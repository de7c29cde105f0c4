"""Usage accounting: who used how many chip-hours, how much of it was useful, what
preemptions cost, and what it would have cost on demand. Pure: `fold` turns events into
per-attempt accounts, incrementally; `report` groups them and prices them."""

from ledger.usage.fold import (
    CATEGORIES,
    HELD,
    AccountKey,
    Interval,
    UsageFold,
    chips_of,
    from_us,
    to_us,
)
from ledger.usage.report import (
    GROUPINGS,
    Prices,
    UsageReport,
    UsageRow,
    family_of,
    job_usage,
    pricing_name,
    summarize,
)

__all__ = [
    "CATEGORIES", "GROUPINGS", "HELD", "AccountKey", "Interval", "Prices", "UsageFold", "UsageReport", "UsageRow",
    "chips_of", "family_of", "from_us", "job_usage", "pricing_name", "summarize", "to_us",
]
