"""Properties of the accounting fold over any sequence of events, surprising ones included
(hypothesis): one job's intervals never overlap, the held categories add up to the chip-time
held (computed here independently), totals by owner equal totals by job, and folding is
incremental."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.placement import chips_of
from ledger.usage import GROUPINGS, HELD, UsageFold, from_us, summarize, to_us
from ledger.usage.fold import COST, LOST, RUNNING, WAITING

T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in us
MIN = 60_000_000
JOBS = ["alice/a", "alice/b", "bob/c", "_system"]
STREAMS = st.sampled_from(JOBS[:2]) | st.sampled_from(JOBS)  # mostly two jobs, at times all
# A TPU's name decides its accelerator (the reconciler never renames one); v9-8 is no type
# Google offers: it weighs 0 chips rather than an invented number.
TPUS = {"tpu-a": "v4-8", "tpu-b": "v4-32", "tpu-c": "v5litepod-4", "tpu-x": "v9-8"}


def iso(us: int) -> str:
    return from_us(us).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


tpu = st.sampled_from(sorted(TPUS)).map(lambda n: {"name": n, "accelerator": TPUS[n], "zone": "us-central2-b"})
attempt = st.integers(0, 4)
final = st.booleans()
DATA = {
    "submitted": st.builds(lambda acc, pricing: {"spec": {"tpu": {"accelerator": acc, "pricing": pricing}}},
                           st.sampled_from(["v4-8", "v4-32", "v5litepod-4"]), st.sampled_from(["spot", "ondemand"])),
    "spec_updated": st.builds(lambda acc: {"spec": {"tpu": {"accelerator": acc}}}, st.sampled_from(["v4-8", "v6e-8"])),
    "provisioning": st.fixed_dictionaries({"attempt": attempt, "tpu": tpu}),
    "provisioned": st.fixed_dictionaries({}, optional={"tpu": tpu}),
    "provision_failed": st.fixed_dictionaries({"final": final}),
    "setup_failed": st.fixed_dictionaries({"final": final}),
    "failed": st.fixed_dictionaries({"kind": st.sampled_from(["grpc", "lost_host", "exit"]), "final": final}),
    "resumed": st.fixed_dictionaries({"attempt": attempt, "kind": st.sampled_from(["grpc", "preempted", "loop"])}),
    "rerun": st.fixed_dictionaries({"attempt": attempt}),
    "released": st.fixed_dictionaries({}, optional={"tpu": tpu}),
    "checkpointed": st.fixed_dictionaries({"attempt": attempt, "step": st.integers(0, 100)}),
}
TYPES = sorted({*DATA, "cancel_requested", "queued", "setup_started", "setup_done", "started", "preempted",
                "finished", "cancelled", "rejected", "action_intent", "note"})
# Drawn more often: the steps of a job's ordinary life, so most examples hold TPUs for a while
# (uniform draws rarely get from submitted to a released TPU).
LIFE = ["submitted", "provisioning", "provisioned", "started", "released", "preempted", "resumed", "queued"]


@st.composite
def ledgers(draw, max_events: int = 60):
    """Rows as fold_rows yields them; times never run backwards (the fold's clamp of
    backwards times is tested by hand)."""
    t, out = T0, []
    for seq in range(1, draw(st.integers(1, max_events)) + 1):
        t += draw(st.sampled_from([0, 1, 5, 30])) * MIN
        type_ = draw(st.sampled_from(LIFE) if draw(st.booleans()) else st.sampled_from(TYPES))
        data = draw(DATA.get(type_, st.just({})))
        out.append((seq, draw(STREAMS), seq, type_, iso(t), json.dumps(data)))
    return out


def window(draw_lo: int | None, draw_hi: int | None) -> tuple[int | None, int | None]:
    lo = None if draw_lo is None else T0 + draw_lo * MIN
    hi = None if draw_hi is None else T0 + draw_hi * MIN
    if lo is not None and hi is not None and hi < lo:
        lo, hi = hi, lo
    return lo, hi


edges = st.none() | st.integers(0, 600)


def held_by_hand(rows, lo, hi, now) -> dict[str, int]:
    """Chip-us each job held a TPU and was not waiting for capacity, inside [lo, hi] up to
    `now`, written without the fold: a job counts its TPU's chips from the moment it takes
    it (provisioning/provisioned, after its first submission) until it releases it (or is
    resubmitted), except while it is live and queued (a queued resource not yet ACTIVE)."""
    lo = lo if lo is not None else -(2**62)
    end = min(now, hi) if hi is not None else now
    state: dict[str, dict] = defaultdict(lambda: {"seen": False, "tpu": None, "live": False, "cancelling": False,
                                                  "queued": False, "at": None})
    total: dict[str, int] = defaultdict(int)

    def count(s: dict, job: str, until: int) -> None:
        if s["at"] is not None and s["seen"] and s["tpu"] and not (s["live"] and s["queued"]):
            total[job] += max(0, min(until, end) - max(s["at"], lo)) * chips_of(TPUS[s["tpu"]])

    for _seq, job, _v, type_, time, data_json in rows:
        if job.startswith("_") or type_ in ("rejected", "action_intent", "note"):
            continue
        d, s = json.loads(data_json), state[job]
        t = to_us(time)
        count(s, job, t)
        s["at"] = t
        if type_ == "submitted":
            s.update(seen=True, tpu=None, live=True, cancelling=False, queued=True)
        elif type_ in ("provisioning", "provisioned"):
            s["tpu"] = d.get("tpu", {}).get("name", s["tpu"]) if "tpu" in d else s["tpu"]
            if s["live"]:
                s["queued"] = False
        elif type_ == "released":
            if s["tpu"] and d.get("tpu", {}).get("name", s["tpu"]) == s["tpu"]:
                s["tpu"] = None
        elif type_ == "queued" and s["live"]:
            s["queued"] = True
        elif type_ == "provision_failed" and s["live"]:
            s["live"] = not d["final"]
            s["queued"] = True
        elif type_ == "started" or type_ in ("setup_started", "setup_done") and s["live"]:
            s["queued"] = False
        elif type_ in ("resumed", "rerun"):
            s["queued"] = False
            if s["seen"] and not s["live"] and not s["cancelling"]:
                s["live"] = True
        elif type_ == "cancel_requested" and s["live"]:
            s.update(live=False, cancelling=True)
        elif type_ in ("finished", "cancelled") or type_ == "failed" and d["final"]:
            s.update(live=False, cancelling=False)  # an ended job: resumed or rerun revive it
        elif type_ == "setup_failed" and d["final"] and s["live"]:  # a cancel under way stays one
            s["live"] = False
    for job, s in state.items():
        count(s, job, end)
    return dict(total)


def per_job(figures) -> dict[str, list[int]]:
    """The counted figures (not the costs) of each job, summed over its accounts."""
    out: dict[str, list[int]] = {}
    for key, values in figures.items():
        acc = out.setdefault(key.job, [0] * COST)
        for i, v in enumerate(values[:COST]):
            acc[i] += v
    return out


@settings(max_examples=300, deadline=None)
@given(ledgers(), edges, edges, st.integers(0, 900))
def test_intervals_never_overlap_and_held_adds_up(rows, a, b, now_min):
    lo, hi = window(a, b)
    now = T0 + now_min * MIN
    f = UsageFold(lo, hi, per_attempt=True, keep_intervals=True).apply_rows(rows)
    now = max(now, to_us(rows[-1][4]))  # a report is asked at or after the last event it folded
    intervals = f.intervals + f.open_intervals(now)
    by_job = defaultdict(list)
    for iv in intervals:
        assert iv.end > iv.start and iv.chips > 0
        assert (lo is None or iv.start >= lo) and (hi is None or iv.end <= hi)
        by_job[iv.key.job].append(iv)
    for job, ivs in by_job.items():
        ivs.sort(key=lambda iv: iv.start)
        for before, after in zip(ivs, ivs[1:], strict=False):
            assert after.start >= before.end, f"{job}: {before} overlaps {after}"
    figures = f.figures(now)
    # the figures are exactly the intervals, weighed by chips
    summed = defaultdict(int)
    for iv in intervals:
        summed[iv.key, iv.category] += (iv.end - iv.start) * iv.chips
    assert {k: v for k, v in summed.items() if v} == {
        (key, c): values[c] for key, values in figures.items() for c in range(6) if values[c]}
    # sum of the held categories = chip-time held, counted independently
    expected = held_by_hand(rows, lo, hi, now)
    got = {job: sum(v[c] for c in HELD) for job, v in per_job(figures).items()}
    assert {j: v for j, v in got.items() if v} == {j: v for j, v in expected.items() if v}
    # work lost to a preemption was running time of the same job, inside the window
    for job, values in per_job(figures).items():
        assert 0 <= values[LOST] <= values[RUNNING], job


@settings(max_examples=200, deadline=None)
@given(ledgers(), edges, edges, st.dictionaries(
    st.tuples(st.sampled_from(["v4", "v5litepod", "v9"]), st.sampled_from(["spot", "ondemand"])),
    st.floats(0, 10, allow_nan=False), max_size=4))
def test_totals_by_owner_equal_totals_by_job(rows, a, b, prices):
    lo, hi = window(a, b)
    figures = UsageFold(lo, hi, prices=prices).apply_rows(rows).figures(T0 + 10_000 * MIN)
    jobs = summarize(figures, "job")
    owners = summarize(figures, "owner")
    for owner in owners.rows:
        mine = [r for r in jobs.rows if r.group.partition("/")[0] == owner.group]
        assert owner.chip_us == tuple(map(sum, zip(*(r.chip_us for r in mine), strict=True)))
        for field in ("preemptions", "lost_us", "recoveries", "recover_us"):
            assert getattr(owner, field) == sum(getattr(r, field) for r in mine)
        assert set(owner.missing) == {m for r in mine for m in r.missing}
        if owner.cost is None:
            assert any(r.cost is None for r in mine)
        else:
            assert owner.cost == pytest.approx(sum(r.cost for r in mine))
    assert {r.group.partition("/")[0] for r in jobs.rows} == {r.group for r in owners.rows}
    # every grouping adds up to the same total
    totals = {by: summarize(figures, by).total for by in GROUPINGS}
    assert len({(t.chip_us, t.preemptions, t.lost_us, t.recoveries, t.recover_us, t.missing) for t in totals.values()}) == 1


@settings(max_examples=150, deadline=None)
@given(ledgers(), st.integers(0, 60), edges, edges)
def test_incremental_and_per_attempt_agree(rows, cut, a, b):
    lo, hi = window(a, b)
    now = T0 + 10_000 * MIN
    whole = UsageFold(lo, hi).apply_rows(rows).figures(now)
    f = UsageFold(lo, hi)
    f.apply_rows(rows[:cut])
    f.figures(now)
    f.apply_rows(rows[cut:])
    assert f.figures(now) == whole
    by_attempt = UsageFold(lo, hi, per_attempt=True).apply_rows(rows).figures(now)
    merged = defaultdict(lambda: [0] * COST)
    for key, values in by_attempt.items():
        for i, v in enumerate(values[:COST]):
            merged[key._replace(attempt=0)][i] += v
    assert {k: v for k, v in merged.items() if any(v)} == {k: v[:COST] for k, v in whole.items() if any(v[:COST])}
    # waiting never weighs a TPU held: a job waits with the chips it asks for
    assert all(values[WAITING] >= 0 for values in whole.values())


def _priced(usd: float) -> str:
    return json.dumps({"commit": "c", "prices": [
        {"family": f, "pricing": p, "usd_per_chip_hour": usd} for f in ("v4", "v5litepod") for p in ("spot", "ondemand")]})


@settings(max_examples=150, deadline=None)
@given(ledgers(), st.lists(st.integers(0, 60), max_size=4), edges, edges)
def test_price_changes_split_intervals_but_change_no_figure_and_a_constant_price_is_held_times_price(rows, cuts, a, b):
    lo, hi = window(a, b)
    now = T0 + 10_000 * MIN
    with_prices = list(rows)
    for cut in sorted(set(cuts), reverse=True):  # the same price every time: only the splits differ
        at = min(cut, len(rows) - 1)
        with_prices.insert(at, (0, "_policy", 0, "policy_changed", rows[at][4], _priced(2.0)))
    with_prices = [(seq, *r[1:]) for seq, r in enumerate(with_prices, 1)]
    plain = UsageFold(lo, hi, prices={(f, p): 2.0 for f in ("v4", "v5litepod") for p in ("spot", "ondemand")})
    plain = plain.apply_rows(rows).figures(now)
    split = UsageFold(lo, hi, prices={("v4", "spot"): 2.0, ("v4", "ondemand"): 2.0,
                                      ("v5litepod", "spot"): 2.0, ("v5litepod", "ondemand"): 2.0})
    split = split.apply_rows(with_prices).figures(now)
    assert {k: v[:COST] for k, v in plain.items() if any(v[:COST])} == {k: v[:COST] for k, v in split.items() if any(v[:COST])}
    ledger_only = UsageFold(lo, hi).apply_rows([(0, "_policy", 0, "policy_changed", rows[0][4], _priced(2.0)), *with_prices])
    for report in (summarize(plain, "job"), summarize(ledger_only.figures(now), "job")):
        for row in report.rows:
            if row.missing:  # v9-8 weighs 0 chips; any other family here has a price
                continue
            assert row.cost == pytest.approx(row.held_us / 3_600_000_000 * 2.0)


@settings(max_examples=150, deadline=None)
@given(ledgers(), st.lists(st.integers(0, 60), max_size=3), st.lists(st.integers(1, 60), min_size=1, max_size=4))
def test_a_kept_rollup_reports_what_adding_every_account_reports(rows, price_cuts, report_cuts):
    """The dashboard keeps the sums of closed accounts from one report to the next
    (`Rollup.report_of`): at every point, for every grouping, its report is the one
    adding up all of `figures()` gives, to the last bit of every cost, whatever jobs
    ended, were revived, or prices changed in between. A fold loaded from a usage
    snapshot (which keeps the closed accounts in their order) reports the same."""
    from ledger.usage.report import Rollup
    from ledger.usage.share import ShareMeter
    from ledger.usage.snapshot import decode, encode

    priced = list(rows)
    for i, cut in enumerate(sorted(set(price_cuts), reverse=True)):
        at = min(cut, len(rows) - 1)
        priced.insert(at, (0, "_policy", 0, "policy_changed", rows[at][4], _priced(1.0 + i / 3)))
    priced = [(seq, *r[1:]) for seq, r in enumerate(priced, 1)]
    fold, rollups, done = UsageFold(), {by: Rollup(by) for by in GROUPINGS if by != "attempt"}, 0
    for cut in sorted({min(c, len(priced)) for c in report_cuts} | {len(priced)}):
        fold.apply_rows(priced[done:cut])
        done = cut
        now = to_us(priced[cut - 1][4]) + MIN
        fresh = UsageFold().apply_rows(priced[:cut])
        _, loaded = decode(encode(ShareMeter(168.0), fold))
        for by, rollup in rollups.items():
            whole = summarize(fold.figures(now), by)
            assert rollup.report_of(fold, now) == whole
            assert summarize(fresh.figures(now), by) == whole == summarize(loaded.figures(now), by)
