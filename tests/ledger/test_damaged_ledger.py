"""Every read command on a damaged SQLite file: one line on stderr, exit 1, never a traceback.

The files are really damaged: a run of zeroed pages in the middle of a ledger (its open
succeeds; a command fails when it reads there), a file cut short, and a file that is not a
database at all (both fail as they open)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from workload import workload  # bench/workload.py, on the path by tests/ledger/conftest.py

from ledger.app.cli import cli
from ledger.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parents[2]
PAGE = 4096
MIDDLE_JOB = "user15/job-000015"  # the workload appends job by job: this one's rows sit mid-file

# Each command reads the damaged middle: a full scan, or the middle job's rows.
READS = [
    ["list"], ["list", "--json"], ["inspect", MIDDLE_JOB], ["replay"], ["replay", "--no-snapshot"],
    ["replay", "--until", "2000", "--json"], ["tpus"], ["tpus", "--json"], ["verify"], ["verify", "--json"],
    ["export"], ["tail", "-n", "3000"], ["tail", "-n", "3000", "--json"],
]


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("damaged") / "sound.db"
    store = SQLiteStore(path)
    store.append_many([(job, events, 0) for job, events in workload(3000, 30)])
    store.close()  # the last connection checkpoints the WAL into the file and removes it
    assert not Path(f"{path}-wal").exists() and path.stat().st_size > 200 * PAGE
    return path


def damaged(sound: Path, kind: str) -> Path:
    path = sound.with_name(f"{kind}.db")
    shutil.copyfile(sound, path)
    size = path.stat().st_size
    with path.open("r+b") as f:
        if kind == "zeroed":
            first, last = size // PAGE * 2 // 5, size // PAGE * 3 // 5
            f.seek(first * PAGE)
            f.write(bytes((last - first) * PAGE))
        elif kind == "truncated":
            f.truncate(size // PAGE // 2 * PAGE)
        else:
            f.write(b"not a database, whatever its name says\n" * 200)
            f.truncate()
    return path


@pytest.fixture(scope="module", params=["zeroed", "truncated", "garbage"])
def broken(request, sound) -> Path:
    return damaged(sound, request.param)


@pytest.mark.parametrize("args", READS, ids=lambda a: " ".join(a))
def test_a_read_command_on_a_damaged_ledger_says_so_in_one_line(broken, args):
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{broken}", *args])
    assert isinstance(result.exception, SystemExit), result.exception  # no exception escaped
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(broken) in lines[0], result.stderr
    assert any(why in lines[0] for why in ("malformed", "not a database")), lines[0]


def test_the_sound_ledger_reads_fine(sound):
    """The same commands succeed on the file before it is damaged: the damage is what fails."""
    for args in READS:
        result = CliRunner().invoke(cli, ["--store", f"sqlite:///{sound}", *args])
        assert result.exit_code == 0, (args, result.output)


def test_a_real_process_prints_no_traceback(sound):
    path = damaged(sound, "zeroed")
    done = subprocess.run([sys.executable, "-m", "ledger", "--store", f"sqlite:///{path}", "tpus"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "database disk image is malformed" in done.stderr
