"""The usage snapshot (ledger/usage/snapshot.py): snapshot + tail gives exactly the figures of
a fold of every event (hypothesis, over the random ledgers of test_usage_properties), on a
real SQLite ledger as on the pure fold; a forged, altered or stale snapshot is refused and
a fresh one saved; `ledger usage` reports the same with and without one."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.app.cli import cli
from ledger.events import NewEvent
from ledger.replay import tied_snapshot
from ledger.store.base import Snapshot
from ledger.store.sqlite import SQLiteStore
from ledger.usage import UsageFold
from ledger.usage import snapshot as usage_snapshot
from ledger.usage.fold import _Job
from ledger.usage.share import WEEK_US, ShareMeter
from ledger.usage.snapshot import (
    code_version,
    decode,
    decode_admission,
    encode,
    load_for_admission,
    load_usage,
    maybe_save_usage,
    save_usage,
    snapshot_name,
    usable,
)
from ledger.verify import verify_snapshots
from tests.usage.ledger_by_hand import EVENTS
from tests.usage.test_usage_properties import MIN, T0, ledgers

HALF_LIFE = 24.0


def fresh() -> tuple[ShareMeter, UsageFold]:
    meter = ShareMeter(HALF_LIFE)
    return meter, UsageFold(on_interval=meter.add)


def figures(kept: tuple[ShareMeter, UsageFold], now: int) -> tuple:
    meter, fold = kept
    open_now = fold.open_intervals(now)
    return (fold.figures(now), meter.decayed(now, open_now), meter.week(now, open_now), fold.position,
            fold.prices.table, fold.checkpoint_of("alice/a"), fold.weeks)


@settings(max_examples=150, deadline=None)
@given(ledgers(), st.floats(0, 1), st.floats(0, 1), st.integers(0, 2000))
def test_snapshot_plus_tail_is_the_full_fold(rows, cut_at, second_at, later):
    """Cut anywhere (twice: a snapshot made from a snapshot + tail), go on from the decoded
    state: the same accounts, costs, fair-share and weekly figures, as exactly as a full fold."""
    now = T0 + later * MIN
    full = fresh()
    full[1].apply_rows(rows)
    cut = int(cut_at * len(rows))
    second = cut + int(second_at * (len(rows) - cut))
    part = fresh()
    part[1].apply_rows(rows[:cut])
    kept = decode(encode(*part))
    assert kept is not None
    kept[1].apply_rows(rows[cut:second])
    kept = decode(encode(*kept))
    assert kept is not None
    kept[1].apply_rows(rows[second:])
    assert figures(kept, now) == figures(full, now)


def cut_folds(rows: list[tuple], cut_at: float) -> tuple[tuple[ShareMeter, UsageFold], tuple[ShareMeter, UsageFold], int]:
    """A fold of every row, one of the rows before the cut (`cut_at` of the way), and the cut."""
    full = fresh()
    full[1].apply_rows(rows)
    cut = int(cut_at * len(rows))
    part = fresh()
    part[1].apply_rows(rows[:cut])
    return full, part, cut


def fair(meter: ShareMeter, fold: UsageFold, now: int) -> tuple:
    """What fair share reads (reconciler.admission.usage_at): the meter's figures with the
    intervals that hold chips now, and those intervals."""
    held = fold.open_intervals(now, held=True)
    return meter.decayed(now, held), meter.week(now, held), sorted(held)


@settings(max_examples=150, deadline=None)
@given(ledgers(), st.floats(0, 1), st.integers(0, 2000))
def test_the_admission_part_plus_tail_gives_fair_shares_figures(rows, cut_at, later):
    """A snapshot's admission part (only the jobs with something open) plus the tail gives
    the meter and the chip-holding intervals of a full fold, as long as the tail touches
    no job it left out (load_for_admission then folds the whole: tested below)."""
    now = T0 + later * MIN
    full, part, cut = cut_folds(rows, cut_at)
    found = decode_admission(encode(*part))
    assert found is not None
    meter, fold, left = found
    assert left == {job for job in part[1].jobs if job not in fold.jobs}
    if any(row[1] in left for row in rows[cut:]):
        return
    fold.apply_rows(rows[cut:])
    assert fair(meter, fold, now) == fair(*full, now)


@settings(max_examples=150, deadline=None)
@given(ledgers(), st.floats(0, 1), st.integers(0, 3000), st.integers(0, 3000))
def test_a_meter_saved_at_its_clock_forgets_only_what_no_later_week_counts(rows, cut_at, saved_at, later):
    """Saved at the saver's `now` (`save_usage`), a meter lets go of the intervals that ended
    a week before it: from that snapshot plus the tail, fair share at `now` or later is the
    full fold's, to the chip-microsecond."""
    saved = T0 + saved_at * 5 * MIN  # up to ~10 days after the first event: a week past some intervals' end
    now = saved + later * MIN
    full, part, cut = cut_folds(rows, cut_at)
    part[0].forget_before(saved)
    assert all(end > saved - WEEK_US for end, *_ in part[0].recent)
    kept = decode(encode(*part))
    assert kept is not None
    kept[1].apply_rows(rows[cut:])
    assert fair(*kept, now) == fair(*full, now)


def test_load_for_admission_at_every_cut_of_a_real_ledger(store):
    """From a snapshot at each position: the same fair-share figures as the whole fold,
    with the ended jobs left out where the events after the snapshot do not touch them,
    and the whole fold where they do (a finished job submitted again)."""
    head = store.head()
    now = T0 + 10**6 * MIN
    whole = load_usage(store, HALF_LIFE, use_snapshot=False)
    paths = set()
    for position in range(1, head + 1):
        save_usage(store, *load_usage(store, HALF_LIFE, until=position, use_snapshot=False), now=None)
        meter, fold = load_for_admission(store, HALF_LIFE)
        assert fold.position == head
        assert fair(meter, fold, now) == fair(*load_usage(store, HALF_LIFE, use_snapshot=False), now)
        paths.add(len(fold.jobs) < len(whole[1].jobs))
    assert paths == {True, False}  # both ways were taken


def test_a_job_is_made_from_its_row_field_by_field():
    """`_Job.of_row` unpacks a row in `__slots__` order: every field lands where its name says."""
    row = tuple(f"value of {name}" for name in _Job.__slots__)
    job = _Job.of_row(row)
    assert [getattr(job, name) for name in _Job.__slots__] == list(row)


@pytest.fixture
def store(tmp_path: Path):
    store = SQLiteStore(tmp_path / "ledger.db")
    for stream, type_, time, data in EVENTS:
        store.append(stream, [NewEvent(type_, data, time=time)])
    yield store
    store.close()


def test_every_cut_of_a_real_ledger_gives_the_full_fold(store):
    head = store.head()
    now = T0 + 10**6 * MIN
    whole = figures(load_usage(store, HALF_LIFE, use_snapshot=False), now)
    for position in range(head + 1):
        meter, fold = load_usage(store, HALF_LIFE, until=position, use_snapshot=False)
        save_usage(store, meter, fold, now=None)
        assert usable(store, HALF_LIFE, head)[1].position == position
        assert figures(load_usage(store, HALF_LIFE), now) == whole


def test_a_forged_or_altered_snapshot_is_refused_and_rebuilt(store, caplog):
    head = store.head()
    now = T0 + 10**6 * MIN
    whole = figures(load_usage(store, HALF_LIFE, use_snapshot=False), now)
    name, code = snapshot_name(HALF_LIFE), code_version()
    # A snapshot of an empty fold claiming to stand at the head, sealed with consistent
    # hashes but tied to another event: the chain check refuses it.
    empty = encode(*fresh())
    meter, fold = fresh()
    fold.position = head
    forged = Snapshot.seal(name, code, head, "0" * 64, encode(meter, fold))
    store.save_snapshot(forged)
    assert usable(store, HALF_LIFE, head) is None
    assert "made from another event" in caplog.text
    assert figures(load_usage(store, HALF_LIFE), now) == whole
    # Altered after it was saved: its own hash refuses it.
    good = tied_snapshot(store, name, code, head, encode(meter, fold))
    store.save_snapshot(Snapshot(name, code, head, good.event_hash, empty, good.hash))
    assert usable(store, HALF_LIFE, head) is None
    assert "does not match its hash" in caplog.text
    # The rule saves a fresh one in its place, which is then used.
    assert maybe_save_usage(store, *load_usage(store, HALF_LIFE), now=None)
    assert usable(store, HALF_LIFE, head) is not None
    assert figures(load_usage(store, HALF_LIFE), now) == whole


def test_a_snapshot_of_other_code_or_half_life_is_not_used(store):
    head = store.head()
    meter, fold = load_usage(store, HALF_LIFE)
    store.save_snapshot(tied_snapshot(store, snapshot_name(HALF_LIFE), "old-code", head, encode(meter, fold)))
    assert usable(store, HALF_LIFE, head) is None
    save_usage(store, meter, fold, now=None)
    assert usable(store, HALF_LIFE, head) is not None
    assert usable(store, HALF_LIFE * 2, head) is None


def test_stale_snapshot_is_renewed_when_due(store):
    meter, fold = load_usage(store, HALF_LIFE, until=2, use_snapshot=False)
    save_usage(store, meter, fold, now=None)
    meter, fold = load_usage(store, HALF_LIFE)  # from the snapshot at 2, plus the tail
    assert not maybe_save_usage(store, meter, fold, now=None)  # fewer than SNAPSHOT_EVERY events since
    assert maybe_save_usage(store, meter, fold, every=1, now=None)
    assert usable(store, HALF_LIFE, store.head())[1].position == store.head()


def _usage(path: Path, *args: str) -> dict:
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "usage", "--json", "--by", "job", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("until", ["7", "2026-03-02T12:00:00Z", None])
def test_ledger_usage_is_the_same_with_a_snapshot(store, tmp_path, until):
    args = ("--until", until) if until else ("--until", str(store.head()))
    before = _usage(tmp_path / "ledger.db", *args)
    save_usage(store, *load_usage(store, 168.0), now=None)  # the half-life `ledger usage` looks for without a policy
    assert [s.name for s in store.list_snapshots()] == [snapshot_name(168.0)]
    assert _usage(tmp_path / "ledger.db", *args) == before


def test_verify_rebuilds_usage_snapshots(store):
    """`ledger verify` compares each usage snapshot with the usage fold of the events, which
    catches one forged with consistent hashes; a meter that was asked for a week is sound."""
    head = store.head()
    meter, fold = load_usage(store, HALF_LIFE, until=head - 1)
    meter.week(T0 + 10**6 * MIN)  # drops last week's intervals that ended before then
    save_usage(store, meter, fold, now=None)
    meter, fold = load_usage(store, HALF_LIFE, use_snapshot=False)
    next(iter(fold.accounts.values()))[0] += 1  # a chip-us more waiting than the events say
    store.save_snapshot(tied_snapshot(store, snapshot_name(HALF_LIFE), code_version(), head, encode(meter, fold)))
    verdicts = {v.snapshot.position: v for v in verify_snapshots(store)}
    assert verdicts[head - 1].rebuilt and verdicts[head - 1].problem is None
    assert verdicts[head].problem == "its accounts differ from the events'"


def test_a_snapshot_saved_with_a_clock_keeps_only_the_last_week_and_verifies(store):
    """Saved without a clock, a meter keeps every interval it was ever fed (a lab's whole
    history, in every load); saved at a moment (`now`, what every saver in the product
    passes), only those a week at that moment or later can count. Both are sound."""
    meter, fold = load_usage(store, HALF_LIFE, use_snapshot=False)
    assert meter.recent
    save_usage(store, meter, fold, now=None)
    assert decode(store.list_snapshots()[0].state)[0].recent == meter.recent
    last_end = max(end for end, *_ in meter.recent)
    save_usage(store, meter, fold, now=last_end + WEEK_US)  # a week after the last interval ended
    [snap] = store.list_snapshots()
    assert not decode(snap.state)[0].recent and not meter.recent
    [verdict] = verify_snapshots(store)
    assert verdict.rebuilt and verdict.problem is None


def test_verify_checks_the_weekly_sums(store):
    """The dashboard draws its weekly table from a usage snapshot's weekly sums: a forged
    week is caught as forged accounts are."""
    head = store.head()
    meter, fold = load_usage(store, HALF_LIFE, use_snapshot=False)
    assert fold.weeks
    next(iter(fold.weeks.values()))[3] += 1  # a chip-us more running that week than the events say
    store.save_snapshot(tied_snapshot(store, snapshot_name(HALF_LIFE), code_version(), head, encode(meter, fold)))
    [verdict] = verify_snapshots(store)
    assert verdict.problem == "its weekly sums differ from the events'"


def test_verify_checks_the_admission_part_too(store):
    """`ledger queue` reads a usage snapshot's admission part alone: one whose whole state
    is true but whose admission part lies (hashes consistent) is caught by verify."""
    head = store.head()
    meter, fold = load_usage(store, HALF_LIFE)
    body = usage_snapshot.body_of(meter, fold)
    part = list(usage_snapshot.admission_part(body))
    acc = usage_snapshot.UsageBody._fields.index("acc")
    part[acc] = {owner: value * 2 for owner, value in part[acc].items()}  # the meter's decayed sums, doubled
    first = pickle.dumps(tuple(part), protocol=5)
    blob = (usage_snapshot._MAGIC + len(first).to_bytes(usage_snapshot._LENGTH, "big") + first
            + pickle.dumps(tuple(body._replace(recent=None)), protocol=5))
    assert decode(blob) is not None and decode_admission(blob)[0].acc == part[acc]
    store.save_snapshot(tied_snapshot(store, snapshot_name(HALF_LIFE), code_version(), head, blob))
    [verdict] = verify_snapshots(store)
    assert verdict.problem == "its admission part's meter's decayed sums differ from the events'"
    save_usage(store, meter, fold, now=None)
    assert [v.problem for v in verify_snapshots(store)] == [None]
