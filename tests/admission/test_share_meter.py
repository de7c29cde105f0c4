"""Decayed usage for fair share and the rolling week, from the usage fold's intervals (pure)."""

from __future__ import annotations

import math

import pytest

from ledger.usage import AccountKey, Interval
from ledger.usage.fold import RUNNING, WAITING
from ledger.usage.share import US_PER_HOUR, WEEK_US, ShareMeter

H = US_PER_HOUR


def iv(owner: str, start_h: float, end_h: float, chips: int = 2, category: int = RUNNING, accelerator: str = "v4-8") -> Interval:
    return Interval(AccountKey(f"{owner}/j", 1, 1, accelerator, "z", "spot"), category, int(start_h * H), int(end_h * H), chips)


def test_usage_halves_every_half_life():
    meter = ShareMeter(half_life_hours=1)
    meter.add(iv("alice", 0, 1))
    now = meter.decayed(int(1 * H))["alice"]
    assert now == pytest.approx(2 / math.log(2) * 0.5)  # 2 chips * the integral of 2^-(1-t) over an hour
    assert meter.decayed(int(2 * H))["alice"] == pytest.approx(now / 2)
    assert meter.decayed(int(11 * H))["alice"] == pytest.approx(now / 1024)


def test_only_held_chips_count_and_open_intervals_count_up_to_now():
    meter = ShareMeter(half_life_hours=1000)
    meter.add(iv("bob", 0, 5, category=WAITING))
    assert meter.decayed(int(5 * H)) == {}
    usage = meter.decayed(int(5 * H), [iv("bob", 4, 10)])  # still running: counted up to now
    assert usage["bob"] == pytest.approx(2.0, rel=1e-2)


def test_the_week_rolls():
    meter = ShareMeter(half_life_hours=168)
    meter.add(iv("alice", 0, 10, chips=4))
    meter.add(iv("alice", 100, 110, chips=4, accelerator="v6e-4"))
    week = meter.week(int(10 * H))
    assert week == {("alice", "v4"): pytest.approx(40.0)}
    later = meter.week(WEEK_US + int(5 * H))  # the first 5 hours have left the window
    assert later[("alice", "v4")] == pytest.approx(20.0) and later[("alice", "v6e")] == pytest.approx(40.0)


def test_a_long_history_stays_finite():
    meter = ShareMeter(half_life_hours=1)
    for day in range(0, 24 * 400, 24):
        meter.add(iv("alice", day, day + 1))
    value = meter.decayed(int((24 * 400 - 23) * H))["alice"]
    assert math.isfinite(value) and value == pytest.approx(2 / math.log(2) * 0.5)
