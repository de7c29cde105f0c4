"""Prices: the policy's `prices:` block, and the usage fold pricing each interval at the table
in force when it happened (the `policy_changed` events on the `_policy` stream).

The ledger below, worked out by hand: a/x holds a v4-8 (4 chips), spot, from 10:00 to 11:40.

    09:00  policy: v4/spot 1.0, v4/ondemand 4.0
    10:00  provisioning   10:10 provisioned   10:20 started
    10:30  policy: v4/spot 2.0, v4/ondemand 4.0       (mid-run: the interval is split)
    11:00  policy: v4/spot 3.0 (no on-demand price any more)
    11:30  finished       11:40 released

    held 10:00-10:30  30 min x 4 chips = 2 chip-h   at 1.0 = 2.0   on demand 4.0 -> 8.0
         10:30-11:00  2 chip-h                      at 2.0 = 4.0   on demand 4.0 -> 8.0
         11:00-11:40  40 min x 4 = 8/3 chip-h       at 3.0 = 8.0   on demand: missing
    cost 14.0; on demand unknown (v4/ondemand missing from 11:00 on)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.events import NewEvent
from ledger.spec.policy import parse_policy
from ledger.store.sqlite import SQLiteStore
from ledger.usage import POLICY_STREAM, UsageFold, summarize, to_us
from tests.usage.ledger_by_hand import at

TPU = {"name": "n1", "zone": "us-central2-b", "kind": "node", "accelerator": "v4-8", "attempt": 1}


def policy(**prices: float) -> dict:
    return {"commit": "c0ffee01", "prices": [
        {"family": key.split("_")[0], "pricing": key.split("_")[1], "usd_per_chip_hour": usd} for key, usd in prices.items()]}


EVENTS = [
    (POLICY_STREAM, "policy_changed", at("09:00"), policy(v4_spot=1.0, v4_ondemand=4.0)),
    ("a/x", "submitted", at("10:00"), {"spec": {"tpu": {"accelerator": "v4-8", "zone": "us-central2-b", "pricing": "spot"}},
                                       "spec_hash": "ab12cd34", "commit": "c0ffee00", "path": "jobs/a/x.yaml"}),
    ("a/x", "provisioning", at("10:00"), {"attempt": 1, "tpu": TPU}),
    ("a/x", "provisioned", at("10:10"), {"tpu": TPU}),
    ("a/x", "setup_started", at("10:10"), {"attempt": 1}),
    ("a/x", "setup_done", at("10:19"), {"attempt": 1}),
    ("a/x", "started", at("10:20"), {"attempt": 1}),
    (POLICY_STREAM, "policy_changed", at("10:30"), policy(v4_spot=2.0, v4_ondemand=4.0)),
    (POLICY_STREAM, "policy_changed", at("11:00"), policy(v4_spot=3.0)),
    ("a/x", "finished", at("11:30"), {"attempt": 1}),
    ("a/x", "released", at("11:40"), {"tpu": TPU, "reason": "job ended"}),
]


def rows(events=EVENTS) -> list[tuple]:
    return [(seq, s, 0, t, time, json.dumps(d)) for seq, (s, t, time, d) in enumerate(events, 1)]


def report(until: str | None = None, *, prices=None, events=EVENTS, now: str = "12:00"):
    fold = UsageFold(until=to_us(at(until)) if until else None, prices=prices).apply_rows(rows(events))
    return summarize(fold.figures(to_us(at(now))), "job").rows[0]


def test_each_interval_is_priced_at_the_price_in_force_even_when_it_changes_mid_interval():
    row = report()
    assert row.held_us == 100 * 60_000_000 * 4
    assert row.cost == pytest.approx(2.0 + 4.0 + 8.0)
    assert row.ondemand_cost is None and row.missing == ("v4/ondemand",)


def test_a_report_until_a_moment_prices_what_was_in_force_then():
    row = report("10:45")  # 10:00-10:30 at 1.0 (2 chip-h), 10:30-10:45 at 2.0 (1 chip-h)
    assert row.cost == pytest.approx(2.0 + 2.0) and row.ondemand_cost == pytest.approx(3 * 4.0) and row.missing == ()


def test_a_running_interval_open_at_the_report_is_priced_at_the_current_table():
    row = report(events=EVENTS[:-2], now="11:15")  # still running: 11:00-11:15 is 1 chip-h at 3.0
    assert row.cost == pytest.approx(2.0 + 4.0 + 3.0) and row.missing == ("v4/ondemand",)


def test_report_prices_override_the_ledgers_for_the_whole_report():
    row = report(prices={("v4", "on-demand"): 5.0})
    assert row.ondemand_cost == pytest.approx(100 * 4 / 60 * 5.0) and row.missing == ()
    assert row.cost == pytest.approx(14.0)  # spot still from the ledger, interval by interval


def test_no_policy_event_means_no_price_and_the_missing_ones_are_named():
    row = report(events=[e for e in EVENTS if e[0] != POLICY_STREAM])
    assert row.cost is None and row.ondemand_cost is None and row.missing == ("v4/ondemand", "v4/spot")


def test_a_price_change_splits_intervals_but_changes_no_chip_hours():
    with_prices = UsageFold(keep_intervals=True).apply_rows(rows())
    without = UsageFold(keep_intervals=True).apply_rows(rows([e for e in EVENTS if e[0] != POLICY_STREAM]))
    assert len(with_prices.intervals) == len(without.intervals) + 2  # running split at 10:30 and 11:00
    now = to_us(at("12:00"))
    assert summarize(with_prices.figures(now)).total.chip_us == summarize(without.figures(now)).total.chip_us


def test_policy_prices_block_is_parsed_and_checked_with_lines():
    parsed = parse_policy("prices:\n  v4: {spot: 1.2, ondemand: 3}\n  v5litepod: {reserved: 0.5}\n")
    assert parsed.errors == ()
    assert dict(parsed.policy.prices.usd) == {("v4", "ondemand"): 3.0, ("v4", "spot"): 1.2, ("v5litepod", "reserved"): 0.5}
    assert parsed.policy.prices.rate("v4", "spot") == 1.2 and parsed.policy.prices.rate("v6e", "spot") is None
    bad = parse_policy("approval: {mode: either}\nprices:\n  v4: {spot: -1, od: 3}\n")
    assert [(m.line, m.pointer) for m in bad.errors] == [(3, "/prices/v4/spot"), (3, "/prices/v4/od")]
    assert bad.policy.prices.usd == {} and bad.policy.approval.mode == "either"  # only the broken block falls back
    typo = parse_policy("prices:\n  v4: {spot: 1}\n  v9: {spot: 1}\n")
    assert [(m.line, m.pointer, m.message) for m in typo.errors] == [
        (3, "/prices/v9", "`prices` names 'v9', which is not a Cloud TPU family")]
    assert parse_policy(None).policy.prices.usd == {}  # no numbers of ours


def test_ledger_usage_and_inspect_show_costs_from_the_ledgers_prices(tmp_path: Path):
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path)
    for stream, type_, time, data in EVENTS:
        store.append(stream, [NewEvent(type_, data, time=time)])
    store.close()
    runner = CliRunner(env={"COLUMNS": "220"})
    out = runner.invoke(cli, ["--store", f"sqlite:///{path}", "usage", "--by", "job", "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["rows"][0]["cost_usd"] == pytest.approx(14.0) and got["rows"][0]["ondemand_usd"] is None
    assert got["missing_prices"] == ["v4/ondemand"]
    assert got["prices_in_force"] == [{"family": "v4", "pricing": "spot", "usd_per_chip_hour": 3.0, "from": "policy"}]
    table = runner.invoke(cli, ["--store", f"sqlite:///{path}", "usage"])
    assert "no price for v4/ondemand" in table.output and "prices:" in table.output
    assert "in force at the end (the policy of commit c0ffee01): v4/spot $3" in " ".join(table.output.split())
    early = json.loads(runner.invoke(cli, ["--store", f"sqlite:///{path}", "usage", "--json",
                                           "--until", "2026-03-02T10:45:00Z", "--price", "v6e/spot=2"]).output)
    assert [(p["family"], p["pricing"], p["usd_per_chip_hour"], p["from"]) for p in early["prices_in_force"]] == [
        ("v4", "ondemand", 4.0, "policy"), ("v4", "spot", 2.0, "policy"), ("v6e", "spot", 2.0, "--price")]
    line = runner.invoke(cli, ["--store", f"sqlite:///{path}", "inspect", "a/x"]).output
    assert "cost: no price for v4/ondemand" in " ".join(line.split())
    csv_out = runner.invoke(cli, ["--store", f"sqlite:///{path}", "usage", "--csv", "--price", "v4/ondemand=5"]).output
    assert csv_out.splitlines()[1].split(",")[-3:] == ["14.0", "33.333333", ""]
