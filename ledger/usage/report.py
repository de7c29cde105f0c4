"""Usage figures grouped for people: chip-hours by category, goodput, preemptions, lost work,
time to recover, cost. Pure: from `UsageFold.figures()` and a price table to rows.

Prices are a plain mapping `{(family, pricing): USD per chip-hour}` (family as in
`ledger.tpu_types`: v4, v5p, v5litepod, v6e, ...; pricing as in a job spec: spot, ondemand,
preemptible, reserved). Nothing is assumed: a cost whose price is missing is None, and the
report says which prices it missed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledger import tpu_types
from ledger.usage.fold import (
    CATEGORIES,
    HELD,
    LOST,
    PREEMPTIONS,
    RECOVER_US,
    RECOVERIES,
    RUNNING,
    SLOTS,
    AccountKey,
    UsageFold,
)

GROUPINGS = ("owner", "job", "accelerator", "zone", "pricing", "attempt")
US_PER_HOUR = 3_600_000_000
Prices = Mapping[tuple[str, str], float]


@functools.lru_cache(maxsize=256)
def pricing_name(text: str) -> str:
    """One spelling per pricing model: 'on-demand', 'On_Demand' and 'ondemand' are one."""
    return "".join(c for c in text.lower() if c.isalnum())


@functools.lru_cache(maxsize=256)
def family_of(accelerator: str) -> str:
    kind = tpu_types.lookup(accelerator)
    if kind is not None:
        return kind.family
    return accelerator.rsplit("-", 1)[0] if accelerator else "?"


def group_of(key: AccountKey, by: str) -> str:
    if by == "owner":
        return key.owner
    if by == "job":
        return key.job
    if by == "attempt":
        life = f" submission {key.life}" if key.life > 1 else ""
        return f"{key.job}{life} attempt {key.attempt}"
    return getattr(key, by) or "?"


@dataclass(frozen=True, slots=True)
class UsageRow:
    group: str
    chip_us: tuple[int, ...]  # chip-microseconds per category, in CATEGORIES order
    preemptions: int
    lost_us: int  # chip-microseconds of work lost to preemptions
    recoveries: int  # recoveries that ended (the job ran again)
    recover_us: int  # their total wall time
    cost: float | None  # USD; None when a price it needs is missing
    ondemand_cost: float | None  # what the same chip-hours would have cost on demand
    missing: tuple[str, ...]  # "family/pricing" of the prices it needed and did not find

    @property
    def held_us(self) -> int:
        return sum(self.chip_us[c] for c in HELD)

    def chip_hours(self, category: str) -> float:
        if category == "held":
            return self.held_us / US_PER_HOUR
        return self.chip_us[CATEGORIES.index(category)] / US_PER_HOUR

    @property
    def goodput(self) -> float | None:
        """Running chip-time over chip-time held (None when nothing was held)."""
        held = self.held_us
        return self.chip_us[RUNNING] / held if held else None

    @property
    def lost_chip_hours(self) -> float:
        return self.lost_us / US_PER_HOUR

    @property
    def mttr_s(self) -> float | None:
        return self.recover_us / self.recoveries / 1e6 if self.recoveries else None

    def to_dict(self) -> dict:
        return {
            "group": self.group,
            "chip_hours": {"held": round(self.chip_hours("held"), 6),
                           **{c: round(self.chip_hours(c), 6) for c in CATEGORIES}},
            "goodput": None if self.goodput is None else round(self.goodput, 6),
            "preemptions": self.preemptions,
            "lost_chip_hours": round(self.lost_chip_hours, 6),
            "recoveries": self.recoveries,
            "mttr_s": None if self.mttr_s is None else round(self.mttr_s, 3),
            "cost_usd": None if self.cost is None else round(self.cost, 6),
            "ondemand_usd": None if self.ondemand_cost is None else round(self.ondemand_cost, 6),
            "missing_prices": list(self.missing),
        }


@dataclass(frozen=True, slots=True)
class UsageReport:
    by: str
    rows: list[UsageRow]
    total: UsageRow
    missing: tuple[str, ...]  # every price the report needed and did not find


def summarize(figures: Mapping[AccountKey, Sequence[int]], by: str = "owner", prices: Prices | None = None) -> UsageReport:
    """Group the fold's accounts by owner, job, accelerator, zone, pricing or attempt."""
    if by not in GROUPINGS:
        raise ValueError(f"cannot group usage by {by!r}; one of {', '.join(GROUPINGS)}")
    table = {(family, pricing_name(pricing)): float(usd) for (family, pricing), usd in (prices or {}).items()}
    groups: dict[str, _Costed] = {}
    total = _Costed()
    for key, values in figures.items():
        if not any(values):
            continue
        held = sum(values[c] for c in HELD) / US_PER_HOUR
        family, pricing = family_of(key.accelerator), pricing_name(key.pricing or "ondemand")
        rate, ondemand_rate = table.get((family, pricing)), table.get((family, "ondemand"))
        for target in (groups.setdefault(group_of(key, by), _Costed()), total):
            target.add(values, held, family, pricing, rate, ondemand_rate)
    rows = [groups[name].row(name) for name in sorted(groups)]
    summed = total.row("total")
    return UsageReport(by, rows, summed, summed.missing)


class _Costed:
    """A row being added up, with its costs: a cost stays None once a price it needs is missing."""

    __slots__ = ("values", "cost", "ondemand", "missing")

    def __init__(self) -> None:
        self.values = [0] * SLOTS
        self.cost: float | None = 0.0
        self.ondemand: float | None = 0.0
        self.missing: set[str] = set()

    def add(self, values: Sequence[int], held: float, family: str, pricing: str,
            rate: float | None, ondemand_rate: float | None) -> None:
        for i, v in enumerate(values):
            self.values[i] += v
        if not held:
            return  # nothing held: no price needed
        if rate is None:
            self.cost = None
            self.missing.add(f"{family}/{pricing}")
        elif self.cost is not None:
            self.cost += held * rate
        if ondemand_rate is None:
            self.ondemand = None
            self.missing.add(f"{family}/ondemand")
        elif self.ondemand is not None:
            self.ondemand += held * ondemand_rate

    def row(self, group: str) -> UsageRow:
        v = self.values
        return UsageRow(group, tuple(v[: len(CATEGORIES)]), v[PREEMPTIONS], v[LOST], v[RECOVERIES], v[RECOVER_US],
                        self.cost, self.ondemand, tuple(sorted(self.missing)))


def job_usage(events: Iterable[Any], now: int, prices: Prices | None = None) -> UsageRow | None:
    """One job's usage up to `now` (us) from its own events (objects with stream, type, time,
    data and seq, as `Store.read_stream` returns them); None when it never waited or held."""
    fold = UsageFold()
    for e in events:
        fold.apply(e.stream, e.type, e.time, e.data, seq=e.seq)
    rows = summarize(fold.figures(now), "job", prices).rows
    return rows[0] if rows else None
