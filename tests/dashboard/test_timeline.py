"""The timeline picture and the weekly sums, from the hand-built ledger whose every interval
tests/usage works out by hand: the picture is the usage fold's intervals, drawn."""

from __future__ import annotations

import json

from ledger.app.dashboard import charts, timeline
from ledger.app.dashboard.weeks import week_table
from ledger.events import Event
from ledger.usage import AccountKey, Interval, UsageFold, summarize, to_us
from ledger.usage.fold import WEEK_US, add_to_weeks, week_of
from tests.usage.ledger_by_hand import NOW, at, rows

MIN = 60_000_000


def events_of(job: str) -> list[Event]:
    """One job's events as `Store.read_stream` returns them."""
    return [Event(seq, stream, version, type_, time, {"kind": "reconciler", "name": "r"}, f"id-{seq}", None,
                  json.loads(data), "0" * 64, "0" * 64)
            for seq, stream, version, type_, time, data in rows() if stream == job]


def spans(row: timeline.Row) -> list[tuple[str, str, str]]:
    return [(s.kind, timeline.clock(s.start, 60), timeline.clock(s.end, 60)) for s in row.segments]


def test_one_row_per_attempt_with_the_preemption_drawn_as_such():
    line = timeline.build(events_of("alice/bert"), to_us(NOW))
    assert [r.label for r in line.rows] == ["attempt 1", "attempt 2"]
    first, second = line.rows
    # waiting, provisioning, setup, running; then the preempted TPU held until its release
    assert spans(first) == [("queued", "10:00", "10:10"), ("provisioning", "10:10", "10:15"),
                            ("setup", "10:15", "10:21"), ("running", "10:21", "11:00"), ("preempted", "11:00", "11:01")]
    # the new attempt waits for a TPU, recovers (provisioning, setup) until it runs again
    assert spans(second) == [("queued", "11:01", "11:05"), ("recovering", "11:05", "11:13"),
                             ("running", "11:13", "12:13"), ("after_end", "12:13", "12:15")]
    assert all(s.chips == 16 for r in line.rows for s in r.segments if s.kind != "queued")


def test_markers_sit_on_their_attempt_and_bookkeeping_is_not_drawn():
    line = timeline.build(events_of("alice/bert"), to_us(NOW))
    first, second = ([(m.type, m.glyph) for m in r.markers] for r in line.rows)
    assert ("checkpointed", "checkpoint") in first and ("preempted", "trouble") in first
    assert ("released", "end") in first  # the release of attempt 1's TPU names attempt 1
    assert ("resumed", "recovery") in second and ("finished", "end") in second
    assert not any(t.startswith("action_") for t, _ in first + second)


def test_the_picture_agrees_with_the_usage_fold():
    """Summed segment by segment, the picture gives `ledger usage --by attempt`'s figures."""
    job = "alice/bert"
    now = to_us(NOW)
    line = timeline.build(events_of(job), now)
    fold = UsageFold(per_attempt=True).apply_rows([r for r in rows() if r[1] == job])
    report = {r.group: r for r in summarize(fold.figures(now), "attempt").rows}
    for row in line.rows:
        held = sum((s.end - s.start) * s.chips for s in row.segments if s.kind != "queued")
        assert held == report[f"{job} {row.label}"].held_us


def test_a_failure_is_named_and_a_job_still_running_is_drawn_up_to_now():
    gpt = timeline.build(events_of("bob/gpt"), to_us(NOW))
    assert [s.kind for s in gpt.rows[0].segments][-1] == "failed"  # the GRPC error of attempt 1
    running = timeline.build(events_of("alice/eval"), to_us(NOW))
    last = running.rows[-1].segments[-1]
    assert last.kind == "running" and last.end == to_us(NOW) == running.end


def test_a_rejected_job_has_its_events_alone():
    line = timeline.build(events_of("carol/sneaky"), to_us(NOW))
    assert [r.label for r in line.rows] == ["events"] and [m.type for m in line.rows[0].markers] == ["rejected"]


def test_drawing_gives_every_shape_a_text_and_keeps_short_segments_visible():
    line = timeline.build(events_of("alice/bert"), to_us(NOW))
    picture = timeline.draw(line)
    texts = [s["text"] for r in picture["rows"] for s in r["segments"]]
    assert "attempt 1: preempted from 11:00:00.000 to 11:01:00.000 UTC (60.0 s, 16 chips)" in texts
    assert all(s["w"] >= timeline.MIN_SEGMENT_W for r in picture["rows"] for s in r["segments"])
    assert all(s["x"] >= picture["label_w"] for r in picture["rows"] for s in r["segments"])
    assert [t["text"] for t in picture["ticks"]][:2] == ["10:00", "10:30"]
    assert line.to_dict()["rows"][0]["segments"][-1] == {
        "kind": "preempted", "start": at("11:00"), "end": at("11:01"), "chips": 16, "seconds": 60.0}


def test_many_markers_keep_the_ones_that_say_something():
    base = events_of("alice/bert")
    noise = [Event(1000 + i, "alice/bert", 100 + i, "note", at("10:30"), {}, f"n{i}", None, {"text": "x"}, "", "")
             for i in range(timeline.MAX_MARKERS)]
    line = timeline.build(sorted(base + noise, key=lambda e: e.seq), to_us(NOW))
    kept = [m.type for r in line.rows for m in r.markers]
    assert len(kept) == timeline.MAX_MARKERS and line.omitted > 0
    assert {"preempted", "resumed", "checkpointed", "finished"} <= set(kept)


def test_the_fold_hands_each_closed_interval_to_on_interval():
    seen: list[Interval] = []
    kept = UsageFold(per_attempt=True, keep_intervals=True, on_interval=seen.append).apply_rows(rows())
    assert seen == kept.intervals and seen


def test_weeks_split_intervals_at_monday_midnight_and_sum_to_the_fold():
    monday = week_of(to_us("2026-03-04T12:00:00+00:00"))
    assert monday == to_us("2026-03-02T00:00:00+00:00")  # 2026-03-02 is a Monday
    weeks: dict[tuple[int, str], list[int]] = {}
    add_to_weeks(weeks, "alice", 3, monday - 30 * MIN, monday + 90 * MIN, 4)  # running across the boundary
    table = week_table(weeks)
    assert [w["week"] for w in table] == ["2026-02-23", "2026-03-02"]
    assert [w["owners"]["alice"]["running"] for w in table] == [2.0, 6.0]  # 0.5 h and 1.5 h of 4 chips
    assert week_of(monday + WEEK_US - 1) == monday
    key = AccountKey("alice/x", 1, 0, "v4-8", "z", "spot")  # an open interval, added to a copy
    assert week_table(weeks, [Interval(key, 3, monday, monday + 60 * MIN, 4)])[-1]["owners"]["alice"]["running"] == 10.0
    assert week_table(weeks)[-1]["owners"]["alice"]["running"] == 6.0

    fold = UsageFold().apply_rows(rows())
    now = to_us(NOW)
    held = sum(w["held"] for w in week_table(fold.weeks or {}, fold.open_intervals(now)))
    assert abs(held - summarize(fold.figures(now)).total.chip_hours("held")) < 1e-5
    assert UsageFold(per_attempt=True).weeks is None and UsageFold(since=now).weeks is None  # whole ledger only


def test_charts_scale_to_a_round_top_and_label_every_bar():
    fold = UsageFold().apply_rows(rows())
    report = summarize(fold.figures(to_us(NOW)), "owner")
    bars = charts.owner_bars(report.rows)
    assert [b["owner"] for b in bars["bars"]] == ["alice", "bob", "carol"]
    assert "goodput" in bars["bars"][0]["text"]
    columns = charts.week_columns(week_table(fold.weeks or {}, fold.open_intervals(to_us(NOW))))
    assert [g["text"] for g in columns["grid"]][-1] in {"1", "2", "5", "10", "20", "50", "100"}
    assert charts.nice_max(0.046) == 0.05 and charts.nice_max(130) == 200
