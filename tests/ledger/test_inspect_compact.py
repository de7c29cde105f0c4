"""`ledger inspect` fits a narrow terminal and a pipe: no line longer than the width, no id or
hash cut, each event a head line with its summary wrapped under it; `--wide` is the table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from ledger.app.cli import cli
from ledger.events import NewEvent, actor
from ledger.store.sqlite import SQLiteStore
from ledger.timeline import Row, cells, compact, wrap

REPO = Path(__file__).resolve().parents[2]
HASH = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
ACTION_ID = "0194c3a2-7e5b-8f4e-9a1b-1c2d3e4f5a6b"
REASON = (f"spec rejected: jobs/alice/a-very-long-job-name-for-a-pretraining-run.yaml:12:5 field tpu.accelerator "
          f"'v5litepod-512' is not offered in zone us-central2-b (blob {HASH}, request {ACTION_ID}); "
          "choose one of v4-8 v4-16 v4-32 or move the job to another zone")
WORDS = [HASH, ACTION_ID, "jobs/alice/a-very-long-job-name-for-a-pretraining-run.yaml:12:5", "git:alice@example.com"]


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path)
    git = actor("git", "alice@example.com", approvers=["bob@example.com"])
    store.append("alice/a", [
        NewEvent("submitted", {"spec": {"tpu": {"accelerator": "v4-8"}}, "spec_hash": "ab12cd34", "commit": "c0ffee12345",
                               "path": "jobs/alice/a.yaml", "author": "alice@example.com",
                               "approvers": ["bob@example.com"]}, git, time="2026-01-01T10:00:00.000000Z"),
        NewEvent("rejected", {"reason": REASON}, git, time="2026-01-01T10:00:01.250000Z"),
    ])
    store.close()
    return path


def check_lines(text: str, width: int) -> list[str]:
    lines = text.rstrip("\n").split("\n")
    assert all(cells(line) <= width for line in lines), [line for line in lines if cells(line) > width]
    for word in WORDS:  # each id, hash and path whole on one line
        assert any(word in line for line in lines), word
    return lines


def test_compact_at_80_columns(ledger_file: Path):
    result = CliRunner(env={"COLUMNS": "80"}).invoke(cli, ["--store", f"sqlite:///{ledger_file}", "inspect", "alice/a"])
    assert result.exit_code == 0, result.output
    lines = check_lines(result.stdout, 80)
    assert lines[:3] == ["alice/a: 2 event(s)", "2026-01-01",
                         "1 10:00:00 submitted git:alice@example.com"]
    assert lines[3].startswith(" " * 11 + "jobs/alice/a.yaml @ c0ffee1234: asked by alice@example.com, approved")
    rejected = lines.index("2 10:00:01 rejected git:alice@example.com")
    end = next((i for i, line in enumerate(lines) if line.startswith("usage:")), len(lines))  # the accounting line
    assert all(line.startswith("  ") for line in lines[rejected + 1:end])  # the summary hangs under its head
    assert " ".join(" ".join(lines[rejected + 1:end]).split()) == " ".join(REASON.split())  # every word, in order
    assert end == 13  # 1 + 5 lines per event, not a table wrapped cell by cell


def test_compact_in_a_pipe_is_80_columns(ledger_file: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run([sys.executable, "-m", "ledger", "--store", f"sqlite:///{ledger_file}", "inspect", "alice/a"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in check_lines(done.stdout, 80)) > 60  # it does use the width


def test_compact_in_a_narrow_terminal(ledger_file: Path):
    result = CliRunner(env={"COLUMNS": "50"}).invoke(cli, ["--store", f"sqlite:///{ledger_file}", "inspect", "alice/a"])
    lines = result.stdout.rstrip("\n").split("\n")
    # Only the hash and the path cannot fit 50 columns: each stands alone on its line, whole.
    assert [line for line in lines if len(line) > 50] == [
        "jobs/alice/a-very-long-job-name-for-a-pretraining-run.yaml:12:5", f"{HASH},"]
    for word in WORDS:
        assert any(word in line for line in lines), word


def test_wide_is_one_table_row_per_event(ledger_file: Path):
    result = CliRunner(env={"COLUMNS": "80"}).invoke(cli, ["--store", f"sqlite:///{ledger_file}", "inspect", "alice/a",
                                                           "--wide"])
    assert result.exit_code == 0
    rows = [line for line in result.stdout.splitlines() if "alice@example.com" in line]
    assert len(rows) == 2 and REASON in rows[1] and "2026-01-01T10:00:01.250000Z" in rows[1]


# -- the layout, for any words and width ---------------------------------------------------
word = st.text(st.characters(codec="utf-8", exclude_categories=("Z", "C")), min_size=1, max_size=70)


@given(st.lists(word, max_size=40), st.integers(20, 120), st.integers(0, 30))
def test_wrap_keeps_every_word_whole_and_within_the_width(words, width, indent):
    lines = wrap(words, width, "", indent)
    assert " ".join(" ".join(lines).split()) == " ".join(words)
    for line in lines:
        # only a word wider than the whole width may make a line wider
        assert cells(line) <= width or (len(line.split()) == 1 and cells(line.strip()) > width)


@given(st.lists(st.tuples(word, word, st.lists(word, max_size=15)), min_size=1, max_size=5), st.integers(20, 100))
def test_compact_lines_fit(rows, width):
    events = [Row(i + 1, "2026-01-01T10:00:00.000000Z", t, a, " ".join(s)) for i, (t, a, s) in enumerate(rows)]
    for line in compact("job: n event(s)", events, width):
        assert cells(line) <= width or (len(line.split()) == 1 and cells(line.split()[0]) > width)
