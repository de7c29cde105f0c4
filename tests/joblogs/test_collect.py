"""Collected job logs: two reconciler hosts (two log directories), one shared directory;
`ledger logs` and the dashboard's log tail show every attempt from either host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.app.dashboard import views
from ledger.errors import UsageError
from reconciler.joblogs import Collector, DirArchive, Limits, LogView
from reconciler.joblogs.bounds import marker
from tests.joblogs.conftest import fetched, race

JOB = "alice/bert"
KEY = "alice/bert/3/output_worker_0.log"


def test_after_a_takeover_every_attempt_shows_from_either_host(tmp_path: Path):
    host_a, host_b, shared = tmp_path / "a-logs", tmp_path / "b-logs", tmp_path / "shared"
    a, b = Collector(host_a, DirArchive(shared)), Collector(host_b, DirArchive(shared))
    fetched(host_a, JOB, 1, "setup_worker_0.log", b"== setup on A\n")
    fetched(host_a, JOB, 1, "output_worker_0.log", b"step 1\nstep 2\n")
    a.run_pass()
    fetched(host_a, JOB, 1, "output_worker_0.log", b"preempted\n")
    fetched(host_a, JOB, 1, "status_worker_0.json", b'{"state": "gone"}')
    a.run_pass()  # then host A dies; B takes the job over and runs attempt 2
    fetched(host_b, JOB, 2, "output_worker_0.log", b"resumed at step 2\n")
    fetched(host_b, JOB, 2, "output_worker_1.log", b"worker 1 of attempt 2\n")
    b.run_pass()

    for log_dir in (host_a, host_b, tmp_path / "elsewhere"):  # on host A, host B, any host
        env = {"LEDGER_LOG_ARCHIVE": str(shared), "LEDGER_LOG_DIR": str(log_dir)}
        first = CliRunner(env=env).invoke(cli, ["logs", JOB, "--attempt", "1", "--setup"])
        assert first.exit_code == 0, first.output
        assert first.output == "==> setup_worker_0.log <==\n== setup on A\n==> output_worker_0.log <==\nstep 1\nstep 2\npreempted\n"
        latest = CliRunner(env=env).invoke(cli, ["logs", JOB, "--worker", "1", "--json"])
        assert json.loads(latest.output)["output"] == "worker 1 of attempt 2\n"
        assert json.loads(latest.output)["attempts"] == [1, 2]
        done = CliRunner(env=env).invoke(cli, ["logs", JOB, "-a", "1", "--follow"])  # ends: A saw it end
        assert done.exit_code == 0 and done.output.endswith("preempted\n")

    tail = views.log_tail(LogView([DirArchive(shared), DirArchive(host_b)]), JOB, attempt=1)
    assert tail["attempts"] == [1, 2] and tail["text"] == "step 1\nstep 2\npreempted\n"


def test_two_collectors_of_one_attempt_store_each_byte_once(tmp_path: Path):
    """Mid-attempt takeover: A fetched the start of the output, B fetched it all from offset
    0; both collect at once, as fast as they can."""
    output = b"".join(b"line %d\n" % i for i in range(20_000))
    fetched(tmp_path / "a", JOB, 3, "output_worker_0.log", output[:70_000])
    fetched(tmp_path / "b", JOB, 3, "output_worker_0.log", output)
    shared = DirArchive(tmp_path / "shared")
    small = Limits(chunk_bytes=4096)
    collectors = [Collector(tmp_path / name, shared, small) for name in ("a", "b")]

    race(collectors, KEY)
    assert shared.read("alice/bert/3/output_worker_0.log") == output


def test_one_job_cannot_fill_the_archive(tmp_path: Path):
    limits = Limits(file_bytes=1000, job_bytes=2500, chunk_bytes=300)
    shared = DirArchive(tmp_path / "shared")
    collector = Collector(tmp_path / "logs", shared, limits)
    for attempt in range(1, 5):
        fetched(tmp_path / "logs", JOB, attempt, "output_worker_0.log", b"x" * 5000)
        fetched(tmp_path / "logs", "bob/small", attempt, "output_worker_0.log", b"fine\n")
        while collector.run_pass():
            pass
    mine = shared.sizes("alice/")
    assert sum(mine.values()) <= limits.job_bytes + len(marker(limits))
    assert shared.read("alice/bert/1/output_worker_0.log").endswith(marker(limits))
    assert shared.sizes("alice/bert/4/") == {}  # nothing more once the job's bound is reached
    assert all(shared.read(f"bob/small/{a}/output_worker_0.log") == b"fine\n" for a in range(1, 5))
    shown = CliRunner(env={"LEDGER_LOG_ARCHIVE": str(shared.root), "LEDGER_LOG_DIR": str(tmp_path / "elsewhere")}) \
        .invoke(cli, ["logs", JOB, "--attempt", "1"])
    assert shown.exit_code == 0 and shown.output.endswith(marker(limits).decode())


def test_a_key_never_leaves_the_archive(tmp_path: Path):
    shared = DirArchive(tmp_path / "shared")
    for bad in ("../x", "a/../../x", "/etc/passwd", "a//b", ""):
        with pytest.raises(UsageError, match="bad log key"):
            shared.put(bad, b"x")
    assert list(tmp_path.iterdir()) == []


def test_an_attempt_over_and_collected_is_not_walked_again_until_its_folder_changes(tmp_path: Path):
    shared = DirArchive(tmp_path / "shared")
    collector = Collector(tmp_path / "logs", shared)
    fetched(tmp_path / "logs", JOB, 1, "output_worker_0.log", b"done\n")
    running = fetched(tmp_path / "logs", JOB, 2, "output_worker_0.log", b"step 1\n")
    collector.run_pass()
    assert {k for k, _, _ in collector.local_files()} >= {"alice/bert/1/output_worker_0.log"}  # no status yet
    fetched(tmp_path / "logs", JOB, 1, "status_worker_0.json", b'{"state": "exited"}')
    collector.run_pass()
    collector.run_pass()
    walked = {k for k, _, _ in collector.local_files()}
    assert walked == {"alice/bert/2/output_worker_0.log"}  # attempt 1 is over and collected
    with open(running, "ab") as f:
        f.write(b"step 2\n")
    fetched(tmp_path / "logs", JOB, 1, "output_worker_1.log", b"late worker\n")  # a new file: walked again
    collector.run_pass()
    assert shared.read("alice/bert/1/output_worker_1.log") == b"late worker\n"
    assert shared.read("alice/bert/2/output_worker_0.log") == b"step 1\nstep 2\n"
