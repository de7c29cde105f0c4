"""Usage accounting: who used how many chip-hours, how much of it was useful, what
preemptions cost, and what it would have cost on demand. Pure: `fold` turns events into
per-attempt accounts, incrementally; `report` groups them and prices them."""

from ledger.usage.fold import (
    CATEGORIES,
    HELD,
    AccountKey,
    Interval,
    UsageFold,
    from_us,
    to_us,
)
from ledger.usage.prices import POLICY_STREAM, PriceBook, Prices, pricing_name
from ledger.usage.report import (
    GROUPINGS,
    Rollup,
    UsageReport,
    UsageRow,
    job_usage,
    summarize,
)

__all__ = [
    "CATEGORIES", "GROUPINGS", "HELD", "POLICY_STREAM", "AccountKey", "Interval", "PriceBook", "Prices", "Rollup", "UsageFold", "UsageReport", "UsageRow",
    "from_us", "job_usage", "pricing_name", "summarize", "to_us",
]
