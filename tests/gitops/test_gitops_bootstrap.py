"""A hub laid by `ledger init`: its first commit brings the policy that governs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ledger.gitops import ingest
from ledger.store.sqlite import SQLiteStore
from tests.gitops.gitops_helpers import ROOT


def test_template_examples_in_the_first_commit_are_ignored_not_rejected(tmp_path: Path):
    hub = tmp_path / "hub.git"
    done = subprocess.run([sys.executable, "-m", "ledger", "init", "--bare", str(hub)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    store = SQLiteStore(tmp_path / "ledger.db")
    report = ingest(str(hub), store, "main")
    assert report.commits == 1
    job_events = [e for e in store.read_all() if not e.stream.startswith("_")]
    assert job_events == [], [(e.stream, e.type, e.data.get("reason")) for e in job_events]
    store.close()
