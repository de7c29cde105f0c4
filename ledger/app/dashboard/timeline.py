"""A job's timeline as a picture: one row per attempt, a coloured segment for each stretch of
what the attempt did, a marker for each event, times on an axis. Pure: events in, geometry out.

The segments are the usage fold's intervals (`UsageFold(per_attempt=True,
keep_intervals=True)` over the job's events): the picture and `ledger usage` come from one
fold and never disagree. The only thing added here is a name for the start of a recovery:
the fold counts everything from an interruption until the job runs again as `recovering`;
the stretch that begins at a preemption (the TPU taken back, until it is released or the
next attempt begins) is drawn as `preempted`, one that begins at a failure as `failed`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from ledger.app.readmodels import placement_label, placements_of
from ledger.describe import summarize
from ledger.events import Event
from ledger.usage import CATEGORIES, Interval, UsageFold, from_us, to_us

# What each segment kind is called on the page, in the legend's order.
KINDS: dict[str, str] = {
    "queued": "queued",
    "provisioning": "provisioning",
    "setup": "setup",
    "running": "running",
    "preempted": "preempted",
    "failed": "failed",
    "recovering": "recovering",
    "after_end": "held after end",
}
_KIND_OF_CATEGORY = dict(zip(CATEGORIES, ("queued", "provisioning", "setup", "running", "recovering", "after_end"),
                             strict=True))
# Events that interrupt an attempt: the recovering stretch that begins with one is named by it.
_INTERRUPTIONS = {"preempted": "preempted", "failed": "failed", "setup_failed": "failed"}
# Reconciler bookkeeping: listed with the events, not drawn (a marker per intent would hide
# the events that matter).
UNDRAWN = frozenset({"action_intent", "action_outcome"})
_GLYPHS = {
    "preempted": "trouble", "failed": "trouble", "setup_failed": "trouble", "provision_failed": "trouble",
    "rejected": "trouble", "cancel_requested": "trouble", "cancelled": "trouble",
    "resumed": "recovery", "rerun": "recovery", "checkpointed": "checkpoint",
    "started": "start", "finished": "end", "released": "end", "submitted": "start",
}
MAX_MARKERS = 300  # beyond this, plain events are left out (the event list has them all)


@dataclass(frozen=True, slots=True)
class Segment:
    kind: str
    start: int  # us since the epoch
    end: int
    chips: int


@dataclass(frozen=True, slots=True)
class Marker:
    seq: int
    type: str
    time: int  # us
    summary: str
    glyph: str  # trouble, recovery, checkpoint, start, end or event


@dataclass(slots=True)
class Row:
    life: int  # which submission of the job (1 = the first)
    attempt: int
    segments: list[Segment] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    where: str = ""  # the placement the attempt got: "2 x v5litepod-16 spot us-west4-a (choice 1)"

    @property
    def label(self) -> str:
        attempt = f"attempt {self.attempt}" if self.attempt else "events"
        return f"submission {self.life}, {attempt}" if self.life > 1 else attempt


@dataclass(slots=True)
class Timeline:
    job: str
    start: int  # us: the picture's left edge
    end: int  # us: its right edge (now, for a job still holding or waiting)
    rows: list[Row]
    omitted: int = 0  # markers left out (MAX_MARKERS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job, "start": iso(self.start), "end": iso(self.end), "omitted_markers": self.omitted,
            "rows": [{
                "label": r.label, "life": r.life, "attempt": r.attempt, "where": r.where,
                "segments": [{"kind": s.kind, "start": iso(s.start), "end": iso(s.end), "chips": s.chips,
                              "seconds": round((s.end - s.start) / 1e6, 6)} for s in r.segments],
                "markers": [{"seq": m.seq, "type": m.type, "time": iso(m.time), "summary": m.summary}
                            for m in r.markers],
            } for r in self.rows],
        }


def iso(us: int) -> str:
    return from_us(us).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build(events: Sequence[Event], now: int) -> Timeline:
    """The timeline of one job from its own events (`Store.read_stream`), open stretches
    drawn up to `now` (us)."""
    job = events[0].stream if events else ""
    fold = UsageFold(per_attempt=True, keep_intervals=True)
    # Event times as the fold sees them: never earlier than the job's previous event.
    times: list[int] = []
    last = None
    for e in events:
        fold.apply(e.stream, e.type, e.time, e.data, seq=e.seq)
        t = to_us(e.time)
        last = t if last is None or t > last else last
        times.append(last)
    intervals: list[Interval] = [*(fold.intervals or ()), *fold.open_intervals(now)]
    interrupted = {t: _INTERRUPTIONS[e.type] for e, t in zip(events, times, strict=True) if e.type in _INTERRUPTIONS
                   and not e.data.get("final")}

    rows: dict[tuple[int, int], Row] = {}
    for iv in sorted(intervals, key=lambda iv: iv.start):
        key = (iv.key.life, iv.key.attempt)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(iv.key.life, iv.key.attempt)
        kind = _KIND_OF_CATEGORY[CATEGORIES[iv.category]]
        if kind == "recovering" and iv.start in interrupted:
            kind = interrupted[iv.start]
        row.segments.append(Segment(kind, iv.start, iv.end, iv.chips))
    ordered = sorted(rows.values(), key=lambda r: (r.life, r.attempt))
    if not ordered:
        ordered = [Row(1, 0)]  # nothing held or waited for (a rejected job): its events alone

    # Each marker goes on the row of the attempt its event names (a release names its TPU's
    # attempt), else on the row that was doing something when it happened (the latest
    # segment begun at or before it).
    starts = sorted((s.start, i) for i, r in enumerate(ordered) for s in r.segments)
    keys = [s for s, _ in starts]
    index = {(r.life, r.attempt): r for r in ordered}
    drawn = [(e, t) for e, t in zip(events, times, strict=True) if e.type not in UNDRAWN]
    kept = _keep(drawn)
    for e, t in drawn:
        if e.seq not in kept:
            continue
        at = bisect.bisect_right(keys, t) - 1
        row = ordered[starts[at][1]] if at >= 0 else ordered[0]
        row = index.get((row.life, _attempt_named(e.data)), row)
        glyph = "trouble" if e.type == "queued" and isinstance(e.data.get("api"), dict) else _GLYPHS.get(e.type, "event")
        row.markers.append(Marker(e.seq, e.type, t, summarize(e.type, e.data), glyph))

    for p in placements_of(events):  # where each attempt ran (its latest TPU, after a retry)
        row = index.get((ordered[-1].life, p["attempt"])) if isinstance(p["attempt"], int) else None
        if row is not None:
            row.where = placement_label(p).partition(": ")[2]
    edges = times + [s.start for r in ordered for s in r.segments] + [s.end for r in ordered for s in r.segments]
    start = min(edges) if edges else now
    end = max(edges) if edges else now
    return Timeline(job, start, max(end, start + 1_000_000), ordered, len(drawn) - len(kept))


def _attempt_named(data: dict[str, Any]) -> int | None:
    tpu = data.get("tpu")
    attempt = data.get("attempt", tpu.get("attempt") if isinstance(tpu, dict) else None)
    return attempt if type(attempt) is int else None


def _keep(drawn: list[tuple[Event, int]]) -> set[int]:
    """The seqs of the markers to draw: all of them up to MAX_MARKERS, else the ones that
    say something (trouble, recoveries, checkpoints, starts and ends) first."""
    if len(drawn) <= MAX_MARKERS:
        return {e.seq for e, _ in drawn}
    ranked = sorted(drawn, key=lambda et: (_GLYPHS.get(et[0].type, "event") == "event", et[0].seq))
    return {e.seq for e, _ in ranked[:MAX_MARKERS]}


# -- geometry --------------------------------------------------------------------------------
WIDTH = 960  # the SVG's user units; it scales to the page
LABEL_W = 150
ROW_H = 46
BAR_H = 20
TOP = 6
AXIS_H = 30
MIN_SEGMENT_W = 5.0  # a 30 ms preemption in a day-long job still shows
_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
          172800, 604800)
MAX_TICKS = 8


def span_text(us: int) -> str:
    s = us / 1e6
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def clock(us: int, step_s: int = 0) -> str:
    """A time of day for the axis or a label (UTC): seconds shown when the step needs them."""
    moment = from_us(us).astimezone(UTC)
    if step_s >= 86400:
        return moment.strftime("%m-%d")
    if step_s >= 60:
        return moment.strftime("%H:%M")
    if step_s >= 1:
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def ticks(start: int, end: int) -> tuple[int, list[int]]:
    """A step (s) that gives at most MAX_TICKS ticks over [start, end], and the ticks (us),
    at whole multiples of the step."""
    span_s = max((end - start) / 1e6, 1e-6)
    step = next((s for s in _STEPS if span_s / s <= MAX_TICKS), _STEPS[-1])
    unit = step * 1_000_000
    first = -(-start // unit) * unit
    return step, list(range(first, end + 1, unit))


def draw(t: Timeline, width: int = WIDTH) -> dict[str, Any]:
    """Everything the SVG template needs, in user units: rows with their segments and
    markers placed, axis ticks, and a text for every shape (titles and aria labels)."""
    plot_w = width - LABEL_W - 12
    span = max(t.end - t.start, 1)

    def x(us: int) -> float:
        return round(LABEL_W + (us - t.start) / span * plot_w, 2)

    rows = []
    for i, row in enumerate(t.rows):
        y = TOP + i * ROW_H
        segments = []
        for s in row.segments:
            x0, x1 = x(s.start), x(s.end)
            w = max(x1 - x0, MIN_SEGMENT_W)
            x0 = min(x0, LABEL_W + plot_w - w)
            text = (f"{row.label}: {KINDS[s.kind]} from {clock(s.start)} to {clock(s.end)} UTC "
                    f"({span_text(s.end - s.start)}, {s.chips} chips)")
            segments.append({"x": x0, "w": round(w, 2), "kind": s.kind, "text": text})
        markers = [{"x": x(m.time), "glyph": m.glyph, "type": m.type, "seq": m.seq,
                    "text": f"seq {m.seq} {m.type} at {clock(m.time)} UTC" + (f": {m.summary}" if m.summary else "")}
                   for m in row.markers]
        rows.append({"y": y, "bar_y": y + ROW_H - BAR_H - 6, "mid": y + ROW_H - 6 - BAR_H / 2, "label": row.label,
                     "where": row.where, "segments": segments, "markers": markers})
    axis_y = TOP + len(t.rows) * ROW_H + 4
    step, marks = ticks(t.start, t.end)
    return {
        "width": width, "height": axis_y + AXIS_H, "label_w": LABEL_W, "plot_right": LABEL_W + plot_w,
        "rows": rows, "axis_y": axis_y, "bar_h": BAR_H, "row_h": ROW_H,
        "ticks": [{"x": x(m), "text": clock(m, step)} for m in marks],
        "caption": (f"{from_us(t.start).astimezone(UTC):%Y-%m-%d %H:%M:%S} to {clock(t.end, 1)} UTC, "
                    f"{span_text(t.end - t.start)}"),
        "kinds": [(k, v) for k, v in KINDS.items() if any(s.kind == k for r in t.rows for s in r.segments)],
        "omitted": t.omitted,
    }
