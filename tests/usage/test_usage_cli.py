"""`ledger usage` and the accounting line of `ledger inspect`, through the real CLI on a real
SQLite ledger holding the hand-built events (tests/usage/ledger_by_hand.py): bert's
preemption at 11:00 loses the 9 minutes since its checkpoint at 10:51, on 16 chips."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.events import NewEvent
from ledger.store.sqlite import SQLiteStore
from tests.usage.ledger_by_hand import EVENTS, at


@pytest.fixture(scope="module")
def ledger_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("usage") / "ledger.db"
    store = SQLiteStore(path)
    for stream, type_, time, data in EVENTS:
        store.append(stream, [NewEvent(type_, data, time=time)])
    store.close()
    return path


def run(path: Path, *args: str, code: int = 0) -> str:
    result = CliRunner(env={"COLUMNS": "220"}).invoke(cli, ["--store", f"sqlite:///{path}", *args])
    assert result.exit_code == code, result.output
    return result.output


def test_json_by_job_until_a_time(ledger_file):
    out = json.loads(run(ledger_file, "usage", "--by", "job", "--until", "2026-03-02T12:33:00Z", "--json",
                         "--price", "v4/spot=1.2", "--price", "v4/on-demand=4"))
    assert out["until"] == at("12:33") and out["since"] is None and out["position"] == len(EVENTS)
    jobs = {r["group"]: r for r in out["rows"]}
    bert = jobs["alice/bert"]
    assert bert["chip_hours"] == pytest.approx({
        "held": 1936 / 60, "waiting": 224 / 60, "provisioning": 80 / 60, "setup": 96 / 60,
        "running": 1584 / 60, "recovering": 144 / 60, "after_end": 32 / 60}, abs=1e-6)
    assert bert["goodput"] == pytest.approx(1584 / 1936, abs=1e-6)
    assert (bert["preemptions"], bert["lost_chip_hours"], bert["recoveries"], bert["mttr_s"]) == \
        (1, pytest.approx(16 * 9 / 60, abs=1e-6), 1, 780.0)
    assert bert["cost_usd"] == pytest.approx(1936 / 60 * 1.2, abs=1e-5)
    assert bert["ondemand_usd"] == pytest.approx(1936 / 60 * 4, abs=1e-5)
    assert jobs["alice/eval"]["cost_usd"] is None and jobs["alice/eval"]["chip_hours"]["running"] == pytest.approx(8.0)
    assert out["missing_prices"] == ["v5litepod/ondemand", "v5litepod/reserved"]
    assert out["total"]["chip_hours"]["held"] == pytest.approx((1936 + 348 + 496) / 60, abs=1e-6)


def test_until_a_seq_and_since(ledger_file):
    # seq 39 is bert's preemption at 11:00: the report stands at that event's time
    out = json.loads(run(ledger_file, "usage", "--since", "2026-03-02T10:30:00Z", "--until", "39", "--json"))
    assert (out["since"], out["until"], out["position"]) == (at("10:30"), at("11:00"), 39)
    owners = {r["group"]: r for r in out["rows"]}
    assert owners["alice"]["chip_hours"]["running"] == pytest.approx((16 * 30 + 4 * 27) / 60, abs=1e-6)
    assert owners["alice"]["preemptions"] == 1
    assert owners["bob"]["chip_hours"]["recovering"] == pytest.approx(4 * 10 / 60, abs=1e-6)
    assert (owners["bob"]["preemptions"], owners["bob"]["recoveries"], owners["bob"]["mttr_s"]) == (1, 2, 360.0)
    # the same question asked as a time gives the same answer
    again = json.loads(run(ledger_file, "usage", "--since", "2026-03-02T10:30:00Z", "--until", "2026-03-02T11:00:00Z", "--json"))
    assert again["rows"] == out["rows"]
    # a seq beyond the head is the head, standing at its last event's time
    beyond = json.loads(run(ledger_file, "usage", "--until", "99999", "--json"))
    assert (beyond["position"], beyond["until"]) == (len(EVENTS), at("12:15"))


def test_table_csv_and_missing_prices(ledger_file):
    table = run(ledger_file, "usage", "--until", "2026-03-02T12:33:00Z", "--by", "pricing")
    assert "usage by pricing in chip-hours" in table and "goodput" in table and "on demand" in table
    assert "spot" in table and "32.27" in table and "81.8%" in table  # bert, alone on spot
    assert "no price for v4/ondemand, v4/spot, v5litepod/ondemand, v5litepod/reserved" in table
    # To a pipe: plain columns, figures aligned on their right edge, the total the last row.
    lines = table.splitlines()[1:table.splitlines().index(next(x for x in table.splitlines() if x.startswith("prices")))]
    assert lines[0].split()[:3] == ["pricing", "held", "running"] and lines[-1].startswith("total ")
    assert len({len(line) for line in lines}) == 1
    rows = list(csv.DictReader(io.StringIO(run(ledger_file, "usage", "--until", "2026-03-02T12:33:00Z", "--csv", "--by", "zone"))))
    assert [r["zone"] for r in rows] == ["us-central2-b", "us-west4-a"]
    assert float(rows[1]["held_chip_hours"]) == pytest.approx(496 / 60, abs=1e-6)
    assert rows[0]["missing_prices"] == "v4/ondemand v4/spot" and rows[0]["cost_usd"] == ""


def test_by_attempt(ledger_file):
    out = json.loads(run(ledger_file, "usage", "--until", "2026-03-02T12:33:00Z", "--by", "attempt", "--json"))
    gpt = {r["group"]: r["chip_hours"]["recovering"] for r in out["rows"] if r["group"].startswith("bob/")}
    assert gpt == pytest.approx({"bob/gpt attempt 1": 4 / 60, "bob/gpt attempt 2": 16 / 60, "bob/gpt attempt 3": 20 / 60}, abs=1e-6)


def test_inspect_ends_with_the_jobs_accounting_line(ledger_file):
    lines = run(ledger_file, "inspect", "alice/bert").rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("usage:"))
    assert all(len(line) <= 220 for line in lines[start:])  # wrapped to the terminal (COLUMNS)
    assert " ".join(" ".join(lines[start:]).split()) == ("usage: 32.27 chip-h held (running 26.40, setup 1.60, provisioning 1.33, recovering 2.40, "
                    "after end 0.533), waiting 3.73; goodput 81.8%; 1 preemption (lost 2.40 chip-h); "
                    "mean time to recover 13.0 min; cost: no price for v4/ondemand, v4/spot")
    assert json.loads(run(ledger_file, "inspect", "alice/bert", "--json"))["events"][0]["type"] == "submitted"


@pytest.mark.parametrize("args, message", [
    (["--since", "yesterday"], "--since 'yesterday' is not an ISO time"),
    (["--since", "2026-03-02T10:00:00"], "has no time zone"),
    (["--until", "soon"], "neither a seq number nor an ISO time"),
    (["--since", "2026-03-02T11:00:00Z", "--until", "2026-03-02T10:00:00Z"], "is after the report's end"),
    (["--json", "--csv"], "pick one"),
    (["--price", "v4/spot"], "is not FAMILY/PRICING=USD"),
    (["--price", "v4/spot=-1"], "is not FAMILY/PRICING=USD"),
])
def test_bad_usage_is_one_line_and_exit_2(ledger_file, args, message):
    out = run(ledger_file, "usage", *args, code=2)
    assert message in out and "Traceback" not in out and len(out.strip().splitlines()) == 1
