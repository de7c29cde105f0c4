"""Usage figures grouped for people: chip-hours by category, goodput, preemptions, lost work,
time to recover, cost. Pure: from `UsageFold.figures()` to rows.

The fold prices every interval at the prices in force when it happened (`ledger.usage.prices`);
a row adds its accounts' costs up. Nothing is assumed: a cost whose price is missing is None,
and the report says which prices it missed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from operator import add
from typing import Any

from ledger.usage.fold import (
    CATEGORIES,
    COST,
    HELD,
    LOST,
    MISSING,
    MISSING_ONDEMAND,
    ONDEMAND,
    PREEMPTIONS,
    RECOVER_US,
    RECOVERIES,
    RUNNING,
    US_PER_HOUR,
    AccountKey,
    Interval,
    UsageFold,
)
from ledger.usage.prices import Prices

GROUPINGS = ("owner", "job", "accelerator", "zone", "pricing", "attempt")


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


def summarize(figures: Mapping[AccountKey, Sequence[Any]], by: str = "owner") -> UsageReport:
    """Group the fold's accounts by owner, job, accelerator, zone, pricing or attempt."""
    return Rollup(by).report(figures)


class _Sums:
    """A group's accounts added up so far: the counters, the two costs (added in the
    accounts' order, as one would add them by hand, to the last bit) and the prices missed."""

    __slots__ = ("counts", "cost", "ondemand", "missing", "missing_ondemand")

    def __init__(self) -> None:
        self.counts = [0] * COST
        self.cost = self.ondemand = 0.0
        self.missing: set[str] = set()
        self.missing_ondemand: set[str] = set()

    def copy(self) -> _Sums:
        out = _Sums()
        out.counts, out.cost, out.ondemand = self.counts[:], self.cost, self.ondemand
        out.missing, out.missing_ondemand = set(self.missing), set(self.missing_ondemand)
        return out

    def add(self, accounts: list[Sequence[Any]]) -> None:
        """Add accounts column by column (20k accounts: 3x faster than one account after
        the other); a cost column goes on from the sum so far, so adding in parts gives
        the same bits as adding all at once."""
        if not accounts:
            return
        columns = list(zip(*accounts, strict=True))
        self.counts = [a + sum(c) for a, c in zip(self.counts, columns[:COST], strict=True)]
        self.cost = reduce(add, columns[COST], self.cost)
        self.ondemand = reduce(add, columns[ONDEMAND], self.ondemand)
        self.missing.update(*columns[MISSING])
        self.missing_ondemand.update(*columns[MISSING_ONDEMAND])

    def row(self, group: str) -> UsageRow:
        """A cost is None once a price it needs is missing."""
        v = self.counts
        return UsageRow(group, tuple(v[: len(CATEGORIES)]), v[PREEMPTIONS], v[LOST], v[RECOVERIES], v[RECOVER_US],
                        None if self.missing else self.cost, None if self.missing_ondemand else self.ondemand,
                        tuple(sorted(self.missing | self.missing_ondemand)))


class Rollup:
    """Accounts grouped by one grouping and added up, kept from one report to the next:
    `report(figures)` adds up accounts once; `report_of(fold, now)` keeps the sums of the
    fold's closed accounts (`UsageFold.closed`, which never change) and adds only those
    closed since the last report, then a copy of them and the open accounts. Both give
    what adding every account in the order `figures()` gives them would, to the last bit.
    A dashboard keeps one per grouping (at 118,956 jobs, 108,956 closed accounts were
    copied, priced and added up again for every visit of the usage page)."""

    def __init__(self, by: str = "owner") -> None:
        if by not in GROUPINGS:
            raise ValueError(f"cannot group usage by {by!r}; one of {', '.join(GROUPINGS)}")
        self.by = by
        self._groups: dict[str, _Sums] = {}
        self._total = _Sums()
        self._seen = 0  # how many of the fold's closed accounts are added up
        self._fold: UsageFold | None = None
        self._reopened = 0

    def _add(self, groups: dict[str, _Sums], total: _Sums, figures: Iterable[tuple[AccountKey, Sequence[Any]]]) -> None:
        by = self.by
        parts: dict[str, list[Sequence[Any]]] = {}
        counted = []
        for key, values in figures:
            if not any(values[:COST]):
                continue
            counted.append(values)
            parts.setdefault(group_of(key, by), []).append(values)
        for name, accounts in parts.items():
            sums = groups.get(name)
            if sums is None:
                sums = groups[name] = _Sums()
            sums.add(accounts)
        total.add(counted)

    def report(self, figures: Mapping[AccountKey, Sequence[Any]]) -> UsageReport:
        """These accounts added up on top of what is kept (nothing, unless `report_of`
        kept a fold's closed accounts); what is kept does not change."""
        groups = {name: sums.copy() for name, sums in self._groups.items()}
        total = self._total.copy()
        self._add(groups, total, figures.items())
        summed = total.row("total")
        return UsageReport(self.by, [groups[name].row(name) for name in sorted(groups)], summed, summed.missing)

    def report_of(self, fold: UsageFold, now: int | None = None, opened: list[Interval] | None = None) -> UsageReport:
        """`summarize(fold.figures(now, opened), by)`, adding up only the closed accounts
        not added before: `closed` only grows at its end, but when a revived job took one
        back (`UsageFold.reopened`), or for another fold, all of them again."""
        if fold is not self._fold or fold.reopened != self._reopened:
            self._groups, self._total, self._seen = {}, _Sums(), 0
            self._fold, self._reopened = fold, fold.reopened
        new = list(itertools.islice(fold.closed.items(), self._seen, None))
        self._seen += len(new)
        self._add(self._groups, self._total, new)
        return self.report(fold.figures(now, opened, closed=False))


def job_usage(events: Iterable[Any], now: int, prices: Prices | None = None, policy: Iterable[Any] = ()) -> UsageRow | None:
    """One job's usage up to `now` (us) from its own events (objects with stream, type, time,
    data and seq, as `Store.read_stream` returns them), priced by the `policy_changed` events
    in `policy` (the `_policy` stream); None when it never waited or held."""
    fold = UsageFold(prices=prices)
    for e in heapq.merge(events, policy, key=lambda e: e.seq):
        fold.apply(e.stream, e.type, e.time, e.data, seq=e.seq)
    rows = summarize(fold.figures(now), "job").rows
    return rows[0] if rows else None
