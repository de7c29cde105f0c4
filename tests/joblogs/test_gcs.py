"""Job logs collected in Cloud Storage through the official client, against the project's
emulator of its JSON API: appends by compose under generation preconditions, reads by range."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from ledger.app.cli import cli
from reconciler.joblogs import Collector, Limits, open_archive
from tests.joblogs.conftest import BUCKET, fetched, race

JOB = "alice/bert"
KEY = "alice/bert/1/output_worker_0.log"


def test_attempts_from_two_hosts_collected_in_a_bucket_show_anywhere(gcs, tmp_path: Path):
    where = f"gs://{BUCKET}/tpu-ledger"
    a = Collector(tmp_path / "a", open_archive(where), Limits(chunk_bytes=16))
    b = Collector(tmp_path / "b", open_archive(where))
    fetched(tmp_path / "a", JOB, 1, "output_worker_0.log", b"step 1\nstep 2\n")
    a.run_pass()
    fetched(tmp_path / "a", JOB, 1, "output_worker_0.log", b"preempted at step 2\n")  # grows: appended by compose
    fetched(tmp_path / "a", JOB, 1, "status_worker_0.json", b'{"state": "gone"}')
    while a.run_pass():  # 16-byte chunks: one per file and pass
        pass
    fetched(tmp_path / "b", JOB, 2, "output_worker_0.log", b"resumed\n")
    b.run_pass()

    env = {"LEDGER_LOG_ARCHIVE": where, "LEDGER_LOG_DIR": str(tmp_path / "elsewhere")}
    first = CliRunner(env=env).invoke(cli, ["logs", JOB, "--attempt", "1", "--json"])
    assert first.exit_code == 0, first.output
    shown = json.loads(first.output)
    assert shown["output"] == "step 1\nstep 2\npreempted at step 2\n" and shown["status"] == {"state": "gone"}
    assert shown["attempts"] == [1, 2] and shown["output_from"] == f"gs://{BUCKET}/tpu-ledger"
    assert CliRunner(env=env).invoke(cli, ["logs", JOB]).output == "resumed\n"
    names = sorted(gcs.storage.buckets[BUCKET])
    assert names == [f"tpu-ledger/alice/bert/1/{n}" for n in ("output_worker_0.log", "status_worker_0.json")] + \
        ["tpu-ledger/alice/bert/2/output_worker_0.log"]  # no part objects left behind
    assert ("POST", "/storage/v1/b/lab-logs/o/tpu-ledger%2Falice%2Fbert%2F1%2Foutput_worker_0.log/compose") \
        in gcs.storage.requests


def test_racing_collectors_never_store_a_byte_twice_in_the_bucket(gcs, tmp_path: Path):
    output = b"".join(b"line %d\n" % i for i in range(3000))
    fetched(tmp_path / "a", JOB, 1, "output_worker_0.log", output[:9000])
    fetched(tmp_path / "b", JOB, 1, "output_worker_0.log", output)
    where = f"gs://{BUCKET}"
    collectors = [Collector(tmp_path / n, open_archive(where), Limits(chunk_bytes=2048)) for n in ("a", "b")]

    race(collectors, KEY)
    assert open_archive(where).read("alice/bert/1/output_worker_0.log") == output
