"""The accounting fold on a hand-built ledger (tests/usage/ledger_by_hand.py): every figure
below is worked out by hand from the event times, in chip-minutes, in the comments."""

from __future__ import annotations

import pytest

from ledger.usage import CATEGORIES, AccountKey, UsageFold, summarize, to_us
from ledger.usage.fold import (
    AFTER_END,
    LOST,
    PREEMPTIONS,
    PROVISIONING,
    RECOVER_US,
    RECOVERIES,
    RECOVERING,
    RUNNING,
    SETUP,
    WAITING,
)
from tests.usage.ledger_by_hand import EVENTS, NOW, at, rows

MIN = 60_000_000  # us


def chip_minutes(**by_category: int) -> tuple[int, ...]:
    return tuple(by_category.get(c, 0) * MIN for c in CATEGORIES)


def fold(*, since: str | None = None, until: str | None = None, per_attempt: bool = False, keep: bool = False,
         prices=None) -> UsageFold:
    f = UsageFold(to_us(since) if since else None, to_us(until) if until else None,
                  per_attempt=per_attempt, keep_intervals=keep, prices=prices)
    return f.apply_rows(rows())


def by_job(f: UsageFold, now: str = NOW):
    return {r.group: r for r in summarize(f.figures(to_us(now)), "job").rows}


def test_every_category_of_every_job_by_hand():
    jobs = by_job(fold())
    assert set(jobs) == {"alice/bert", "alice/eval", "bob/gpt", "carol/sweep"}  # carol/sneaky was only rejected

    bert = jobs["alice/bert"]  # v4-32: 16 chips
    assert bert.chip_us == chip_minutes(
        waiting=16 * (10 + 4),         # 10:00-10:10 before attempt 1; 11:01-11:05 between TPUs
        provisioning=16 * 5,           # 10:10-10:15
        setup=16 * 6,                  # 10:15-10:21
        running=16 * (39 + 60),        # 10:21-11:00, 11:13-12:13
        recovering=16 * (1 + 8),       # 11:00-11:01 on the preempted TPU, 11:05-11:13 on the new one
        after_end=16 * 2,              # 12:13-12:15: finished, not yet released
    )
    assert bert.held_us == 16 * (5 + 6 + 99 + 9 + 2) * MIN == 1936 * MIN
    assert bert.goodput == pytest.approx(1584 / 1936)
    assert (bert.preemptions, bert.lost_us) == (1, 16 * 9 * MIN)  # last checkpoint 10:51, preempted 11:00
    assert (bert.recoveries, bert.recover_us, bert.mttr_s) == (1, 13 * MIN, 780.0)  # 11:00 -> running at 11:13

    gpt = jobs["bob/gpt"]  # v4-8: 4 chips
    assert gpt.chip_us == chip_minutes(
        waiting=4 * (2 + 2),           # 10:00-10:02; 10:53-10:55 between TPUs
        provisioning=4 * 2,            # 10:02-10:04
        setup=4 * 4,                   # 10:04-10:08
        running=4 * (30 + 10 + 30),    # 10:08-10:38, 10:42-10:52, 11:00-11:30 (cancel requested)
        recovering=4 * (4 + 1 + 5),    # 10:38-10:42 (GRPC, same TPU), 10:52-10:53, 10:55-11:00 (new TPU)
        after_end=4 * 1,               # 11:30-11:31: cancel requested, TPU not yet released
    )
    # The lost host turned out to be the preemption: counted as one, with no checkpoint
    # reported the whole run of attempt 2 is lost (10:42-10:52).
    assert (gpt.preemptions, gpt.lost_us) == (1, 4 * 10 * MIN)
    assert (gpt.recoveries, gpt.recover_us, gpt.mttr_s) == (2, (4 + 8) * MIN, 360.0)

    ev = jobs["alice/eval"]  # v5litepod-4: 4 chips, a queued resource
    assert ev.chip_us == chip_minutes(
        waiting=4 * (1 + 28),          # 10:00-10:01; 10:02-10:30 while the queued resource waits
        provisioning=4 * 1,            # 10:01-10:02
        setup=4 * 3,                   # 10:30-10:33
        running=4 * 120,               # 10:33-12:33 (still running at the report's moment)
    )
    assert (ev.preemptions, ev.lost_us, ev.recoveries, ev.mttr_s) == (0, 0, 0, None)

    sweep = jobs["carol/sweep"]  # waited 11:00-11:20, then was cancelled without ever holding a TPU
    assert sweep.chip_us == chip_minutes(waiting=4 * 20)
    assert sweep.held_us == 0 and sweep.goodput is None


def test_costs_and_missing_prices():
    prices = {("v4", "spot"): 1.2, ("v4", "on-demand"): 4.0}  # no v5litepod prices at all
    report = summarize(fold(prices=prices).figures(to_us(NOW)), "owner")
    owners = {r.group: r for r in report.rows}
    bert_h, gpt_h = 1936 / 60, 348 / 60  # chip-hours held
    assert owners["bob"].cost == pytest.approx(gpt_h * 4.0) and owners["bob"].ondemand_cost == pytest.approx(gpt_h * 4.0)
    assert owners["bob"].missing == ()
    # alice's eval runs on v5litepod, reserved: no price, so alice's cost is unknown, not low
    assert owners["alice"].cost is None and owners["alice"].ondemand_cost is None
    assert owners["alice"].missing == ("v5litepod/ondemand", "v5litepod/reserved")
    assert owners["carol"].cost == 0.0 and owners["carol"].missing == ()  # held nothing: needs no price
    assert report.missing == ("v5litepod/ondemand", "v5litepod/reserved") and report.total.cost is None
    jobs = by_job(fold(prices=prices))
    assert jobs["alice/bert"].cost == pytest.approx(bert_h * 1.2)
    assert jobs["alice/bert"].ondemand_cost == pytest.approx(bert_h * 4.0)  # what on demand would have cost


def test_by_owner_accelerator_zone_pricing():
    figures = fold().figures(to_us(NOW))
    owners = {r.group: r for r in summarize(figures, "owner").rows}
    assert owners["alice"].chip_us == chip_minutes(
        waiting=224 + 116, provisioning=80 + 4, setup=96 + 12, running=1584 + 480, recovering=144, after_end=32)
    assert owners["bob"].held_us == 348 * MIN and owners["carol"].held_us == 0
    zones = {r.group: r.held_us for r in summarize(figures, "zone").rows}
    assert zones == {"us-central2-b": (1936 + 348) * MIN, "us-west4-a": 496 * MIN}
    pricing = {r.group: r.held_us for r in summarize(figures, "pricing").rows}
    assert pricing == {"spot": 1936 * MIN, "ondemand": 348 * MIN, "reserved": 496 * MIN}
    accelerators = {r.group: r.held_us for r in summarize(figures, "accelerator").rows}
    assert accelerators == {"v4-32": 1936 * MIN, "v4-8": 348 * MIN, "v5litepod-4": 496 * MIN}
    total = summarize(figures, "owner").total
    assert total.held_us == (1936 + 348 + 496) * MIN
    assert (total.preemptions, total.lost_us, total.recoveries) == (2, (144 + 40) * MIN, 3)


def test_window_since_until():
    # 10:30 .. 11:00, the moment bert is preempted: what a report --since 10:30 --until 11:00 says
    jobs = by_job(fold(since=at("10:30"), until=at("11:00")), now=at("11:00"))
    bert = jobs["alice/bert"]
    assert bert.chip_us == chip_minutes(running=16 * 30)  # 10:30-11:00
    assert (bert.preemptions, bert.lost_us, bert.recoveries) == (1, 16 * 9 * MIN, 0)  # its recovery ends at 11:13
    gpt = jobs["bob/gpt"]
    assert gpt.chip_us == chip_minutes(running=4 * (8 + 10), recovering=4 * (4 + 1 + 5), waiting=4 * 2)
    assert (gpt.preemptions, gpt.lost_us, gpt.recoveries, gpt.recover_us) == (1, 4 * 10 * MIN, 2, 12 * MIN)
    ev = jobs["alice/eval"]
    assert ev.chip_us == chip_minutes(setup=4 * 3, running=4 * 27)
    assert "carol/sweep" not in jobs  # it only waited after 11:00


def test_lost_work_is_clipped_to_the_window():
    # from 10:55: only 5 of the 9 lost minutes since bert's checkpoint lie inside
    bert = by_job(fold(since=at("10:55"), until=at("11:00")), now=at("11:00"))["alice/bert"]
    assert bert.lost_us == 16 * 5 * MIN and bert.chip_us[RUNNING] == 16 * 5 * MIN


def test_per_attempt_accounts_and_intervals():
    f = fold(per_attempt=True, keep=True)
    figures = f.figures(to_us(NOW))
    key = AccountKey("alice/bert", 1, 1, "v4-32", "us-central2-b", "spot")
    first, second = figures[key], figures[key._replace(attempt=2)]
    assert first[:6] == [16 * m * MIN for m in (10, 5, 6, 39, 1, 0)]
    assert (first[PREEMPTIONS], first[LOST], first[RECOVERIES]) == (1, 16 * 9 * MIN, 0)
    assert second[:6] == [16 * m * MIN for m in (4, 0, 0, 60, 8, 2)]
    assert (second[PREEMPTIONS], second[RECOVERIES], second[RECOVER_US]) == (0, 1, 13 * MIN)
    gpt = {k.attempt: v for k, v in figures.items() if k.job == "bob/gpt"}
    assert [gpt[a][RECOVERING] // (4 * MIN) for a in (1, 2, 3)] == [1, 3 + 1, 5]  # resumed at 10:39 starts attempt 2
    assert gpt[2][PREEMPTIONS] == 1 and gpt[2][LOST] == 4 * 10 * MIN  # charged to the attempt that lost it
    bert = [(iv.key.attempt, iv.category, iv.start, iv.end, iv.chips) for iv in f.intervals if iv.key.job == "alice/bert"]
    assert bert == [
        (1, WAITING, to_us(at("10:00")), to_us(at("10:10")), 16),
        (1, PROVISIONING, to_us(at("10:10")), to_us(at("10:15")), 16),
        (1, SETUP, to_us(at("10:15")), to_us(at("10:21")), 16),
        (1, RUNNING, to_us(at("10:21")), to_us(at("11:00")), 16),
        (1, RECOVERING, to_us(at("11:00")), to_us(at("11:01")), 16),
        (2, WAITING, to_us(at("11:01")), to_us(at("11:05")), 16),
        (2, RECOVERING, to_us(at("11:05")), to_us(at("11:13")), 16),  # provisioning, setup: one stretch
        (2, RUNNING, to_us(at("11:13")), to_us(at("12:13")), 16),
        (2, AFTER_END, to_us(at("12:13")), to_us(at("12:15")), 16),
    ]
    # eval is still running: its open interval closes at whatever moment is asked
    assert [(iv.key.job, iv.category) for iv in f.open_intervals(to_us(NOW))] == [("alice/eval", RUNNING)]


def test_incremental_equals_one_pass_and_asking_changes_nothing():
    whole = fold().figures(to_us(NOW))
    f = UsageFold()
    all_rows = rows()
    for i in range(0, len(all_rows), 7):
        f.apply_rows(all_rows[i:i + 7])
        f.figures(to_us(NOW))  # a dashboard asks between batches
    assert f.figures(to_us(NOW)) == whole and f.position == len(all_rows)
    # one decoded event at a time (Event objects' fields) folds the same
    g = UsageFold()
    for seq, (stream, type_, time, data) in enumerate(EVENTS, 1):
        g.apply(stream, type_, time, data, seq=seq)
    assert g.figures(to_us(NOW)) == whole


def test_a_running_job_accrues_until_the_moment_asked():
    f = fold()
    ev = lambda now: by_job(f, now)["alice/eval"].chip_us[RUNNING]  # noqa: E731
    assert ev(at("11:33")) == 4 * 60 * MIN and ev(at("12:33")) == 4 * 120 * MIN


def test_checkpoints_of_another_attempt_or_outside_running_do_not_count():
    events = [
        ("a/x", "submitted", at("09:00"), {"spec": {"tpu": {"accelerator": "v4-8", "pricing": "spot"}}}),
        ("a/x", "provisioning", at("09:00"), {"attempt": 1, "tpu": {"name": "t1", "accelerator": "v4-8"}}),
        ("a/x", "checkpointed", at("09:01"), {"attempt": 1, "step": 1}),  # not running yet: ignored
        ("a/x", "started", at("09:02"), {"attempt": 1}),
        ("a/x", "checkpointed", at("09:03"), {"attempt": 0, "step": 9}),  # another attempt's: ignored
        ("a/x", "preempted", at("09:10"), {"attempt": 1}),
    ]
    x = by_job(UsageFold().apply_rows(rows(events)), at("09:10"))["a/x"]
    assert (x.preemptions, x.lost_us) == (1, 4 * 8 * MIN)  # since the start, 09:02
    assert UsageFold().apply_rows(rows(events[:3])).checkpoint_of("a/x") is None


def test_times_that_run_backwards_count_as_the_previous_event():
    events = [
        ("a/x", "submitted", at("09:00"), {"spec": {"tpu": {"accelerator": "v4-8"}}}),
        ("a/x", "provisioning", at("09:10"), {"attempt": 1, "tpu": {"name": "t1"}}),
        ("a/x", "provisioned", at("09:05"), {"tpu": {"name": "t1"}}),  # another writer's clock
        ("a/x", "started", at("09:20"), {"attempt": 1}),
    ]
    x = by_job(UsageFold().apply_rows(rows(events)), at("09:20"))["a/x"]
    assert x.chip_us == chip_minutes(waiting=4 * 10, setup=4 * 10)  # provisioning 09:10-09:10 is empty
    assert x.group == "a/x" and x.to_dict()["chip_hours"]["setup"] == pytest.approx(40 / 60)


def test_unknown_grouping_is_refused():
    with pytest.raises(ValueError, match="one of owner"):
        summarize({}, "team")


@pytest.mark.parametrize("released", [
    {"reason": "the create failed", "existed": False},
    {"reason": "vanished while provisioning"},  # as ledgers written before `existed` say it
])
def test_a_tpu_whose_create_failed_is_not_billed(released: dict) -> None:
    """The create was accepted, its operation failed (a permission, a stockout): Google never
    gave the TPU, so the 10 minutes it was asked for are waiting, not held chips."""
    from tests.usage.ledger_by_hand import GPT_TPU1, submitted

    f = UsageFold()
    f.apply("bob/x", "submitted", at("10:00"), submitted("v4-8", "us-central2-b", "ondemand"), 1)
    f.apply("bob/x", "provisioning", at("10:05"), {"attempt": 1, "tpu": GPT_TPU1}, 2)
    f.apply("bob/x", "released", at("10:15"), {"tpu": GPT_TPU1, **released}, 3)
    f.apply("bob/x", "queued", at("10:15"), {"reason": "retrying"}, 4)
    (row,) = summarize(f.figures(to_us(at("10:20"))), "job").rows
    assert row.held_us == 0
    assert row.chip_us == chip_minutes(waiting=4 * 20)
