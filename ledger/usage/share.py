"""Recent usage for fair sharing: decayed chip-hours per owner and chip-hours of the last week.

Fed the usage fold's closed intervals (`UsageFold(on_interval=meter.add)`) and asked with
its open ones at a moment `now`, it answers what admission needs (reconciler.admission):

- **decayed** chip-hours per owner: each chip-hour held counts 2^(-age / half-life), as
  Slurm's fair-share factor decays past usage. Kept as one number per owner, scaled to a
  reference time, so adding an interval and asking are O(1) per owner whatever the history.
- **week**: chip-hours held per (owner, family) over the rolling 7 days before `now`.

Pure and deterministic: the same intervals and `now` give the same figures.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from ledger.placement import family_of
from ledger.usage.fold import HELD, US_PER_HOUR, WEEK_US, Interval

_HELD = frozenset(HELD)


class ShareMeter:
    def __init__(self, half_life_hours: float) -> None:
        self.half_life_hours = half_life_hours
        self.rate = math.log(2) / (half_life_hours * US_PER_HOUR)  # decay per microsecond
        self.ref: int | None = None  # the reference time the accumulators are scaled to
        self.acc: dict[str, float] = {}  # owner -> sum of chip-us * e^(rate*(t-ref)) over held time
        self.recent: deque[tuple[int, int, str, str, int]] = deque()  # (end, start, owner, family, chips)

    def add(self, iv: Interval) -> None:
        """One closed interval of the usage fold (only held chips count)."""
        if iv.category not in _HELD or not iv.chips or iv.end <= iv.start:
            return
        owner = iv.key.owner
        amount = self._integral(iv.start, iv.end, iv.chips)  # first: it may rescale every account
        self.acc[owner] = self.acc.get(owner, 0.0) + amount
        family = family_of(iv.key.accelerator)
        if family:
            self.recent.append((iv.end, iv.start, owner, family, iv.chips))

    def _integral(self, start: int, end: int, chips: int) -> float:
        """chips * the integral of e^(rate*(t-ref)) over [start, end]; moves `ref` (and
        rescales every account) when the exponent would grow too large. Only `add` calls it."""
        if self.ref is None:
            self.ref = start
        elif end - self.ref > 400 / self.rate:
            shift = math.exp(-self.rate * (start - self.ref))
            self.acc = {k: v * shift for k, v in self.acc.items()}
            self.ref = start
        return _area(self.rate, self.ref, start, end, chips)

    def decayed(self, now: int, open_intervals: Iterable[Interval] = ()) -> dict[str, float]:
        """Owner -> decayed chip-hours at `now` (open intervals counted up to `now`). Reads only."""
        ref = self.ref if self.ref is not None else now
        extra: dict[str, float] = {}
        for iv in open_intervals:
            end = min(iv.end, now)
            if iv.category in _HELD and iv.chips and end > iv.start:
                extra[iv.key.owner] = extra.get(iv.key.owner, 0.0) + _area(self.rate, ref, iv.start, end, iv.chips)
        scale = math.exp(-self.rate * (now - ref)) / US_PER_HOUR
        owners = self.acc.keys() | extra.keys()
        return {o: (self.acc.get(o, 0.0) + extra.get(o, 0.0)) * scale for o in owners}

    def forget_before(self, now: int) -> None:
        """Let go of the intervals that ended a week or more before `now`: no week asked at
        `now` or later counts them. Before a snapshot is saved (`save_usage`), or the meter
        keeps every interval it was ever fed: 435,424 of them (~65 MB, and as many tuples in
        every load) in a fold of 118,956 finished jobs' history."""
        since = now - WEEK_US
        recent = self.recent
        while recent and recent[0][0] <= since:  # closed in order of their end, roughly
            recent.popleft()

    def week(self, now: int, open_intervals: Iterable[Interval] = ()) -> dict[tuple[str, str], float]:
        """(owner, family) -> chip-hours held in the 7 days before `now`."""
        since = now - WEEK_US
        self.forget_before(now)
        out: dict[tuple[str, str], float] = {}
        rows = [(iv.end, iv.start, iv.key.owner, iv.key.accelerator, iv.chips) for iv in open_intervals
                if iv.category in _HELD and iv.chips]
        for end, start, owner, family, chips in [*self.recent, *((e, s, o, family_of(a), c) for e, s, o, a, c in rows)]:
            lo, hi = max(start, since), min(end, now)
            if hi > lo and family:
                out[(owner, family)] = out.get((owner, family), 0.0) + chips * (hi - lo) / US_PER_HOUR
        return out


def _area(rate: float, ref: int, start: int, end: int, chips: int) -> float:
    return chips * (math.exp(rate * (end - ref)) - math.exp(rate * (start - ref))) / rate
