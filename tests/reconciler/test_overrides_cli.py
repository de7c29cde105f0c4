"""The audited manual overrides and `ledger tpus`, through the CLI, on a real SQLite ledger."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.app.readmodels import tpu_health, tpu_rows
from ledger.events import NewEvent, actor
from ledger.fold import replay
from ledger.replay import load_state, save_snapshot
from ledger.store import open_store

SPEC = {"tpu": {"accelerator": "v4-8", "zone": "us-central2-b", "pricing": "spot"}, "command": {"cmd": "true"}}
SHARED = {"tpu": {"accelerator": "v4-8", "zone": "us-central2-b", "shared": True, "name": "lab-v4-8-1"},
          "command": {"cmd": "true"}}


GIT = {"spec_hash": "ab" * 32, "commit": "c0ffee", "path": "jobs/a/b.yaml"}


def ledger_with(tmp_path: Path, *jobs: tuple[str, list[tuple[str, dict]]]) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url)
    for job_id, events in jobs:
        store.append(job_id, [NewEvent(t, {**(GIT if t == "submitted" else {}), **d}, actor("git", "tester")) for t, d in events])
    store.close()
    return url


def run(url: str, *args: str):
    return CliRunner().invoke(cli, ["--store", url, *args])


def job(url: str, job_id: str):
    store = open_store(url)
    try:
        return replay(store.read_stream(job_id)).jobs[job_id], store.read_stream(job_id)[-1]
    finally:
        store.close()


def test_cancel_records_who_and_why_and_refuses_unknown_or_ended_jobs(tmp_path: Path):
    url = ledger_with(tmp_path, ("alice/a", [("submitted", {"spec": SPEC})]),
                      ("bob/done", [("submitted", {"spec": SPEC}), ("cancelled", {})]))
    out = run(url, "cancel", "alice/a", "--reason", "burning quota")
    assert out.exit_code == 0, out.output
    state, last = job(url, "alice/a")
    assert state.state == "cancelling" and last.type == "cancel_requested"
    assert last.actor == {"kind": "cli", "name": getpass.getuser(), "manual": True}
    assert last.data["reason"] == "burning quota"
    unknown = run(url, "cancel", "nobody/x", "--reason", "r")
    assert unknown.exit_code == 2 and "no job 'nobody/x'" in unknown.output
    ended = run(url, "cancel", "bob/done", "--reason", "r")
    assert ended.exit_code == 2 and "bob/done is cancelled" in ended.output


def test_resume_and_rerun_start_the_next_attempt_only_from_states_that_allow_it(tmp_path: Path):
    url = ledger_with(tmp_path,
                      ("alice/dead", [("submitted", {"spec": SPEC}), ("provisioning", {"attempt": 1}),
                                      ("failed", {"kind": "exit", "final": True, "rule": "pass"})]),
                      ("alice/live", [("submitted", {"spec": SPEC})]))
    out = run(url, "resume", "alice/dead")
    assert out.exit_code == 0, out.output
    state, last = job(url, "alice/dead")
    assert last.type == "resumed" and last.data["attempt"] == 2 and state.state == "recovering"
    refused = run(url, "rerun", "alice/live")
    assert refused.exit_code == 2 and "alice/live is pending" in refused.output


def test_tpus_lists_held_tpus_and_who_waits_for_a_shared_one(tmp_path: Path):
    url = ledger_with(tmp_path,
                      ("alice/a", [("submitted", {"spec": SHARED}),
                                   ("provisioning", {"attempt": 1, "tpu": {"name": "lab-v4-8-1", "zone": "us-central2-b",
                                                                          "shared": True, "accelerator": "v4-8"}})]),
                      ("bob/b", [("submitted", {"spec": SHARED}), ("queued", {"reason": "held by alice/a"})]))
    out = run(url, "tpus", "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [(r["tpu"], r["job"], r["job_state"]) for r in rows] == [
        ("lab-v4-8-1", "alice/a", "provisioning"), ("lab-v4-8-1", "bob/b", "waiting (queued)")]


def test_tpus_json_carries_the_health_of_the_last_host_check_as_the_table_shows_it(tmp_path: Path):
    tpu = {"name": "lab-v4-8-1", "zone": "us-central2-b", "shared": True, "accelerator": "v4-8"}
    url = ledger_with(tmp_path,
                      ("alice/a", [("submitted", {"spec": SHARED}), ("provisioning", {"attempt": 1, "tpu": tpu}),
                                   ("provisioned", {"tpu": tpu, "hosts": [{"worker": 0}]}),
                                   ("started", {"spec_hash": "ab" * 32, "health": "warning"})]),
                      ("bob/b", [("submitted", {"spec": SPEC})]))
    rows = json.loads(run(url, "tpus", "--json").output)
    assert [(r["tpu"], r["health"], bool(r["checked"])) for r in rows] == [("lab-v4-8-1", "warning", True)]
    assert "warni" in run(url, "tpus").output  # the table's health column (cut to the 80 columns of a pipe)


def test_tpus_reads_snapshot_tail_and_the_holders_streams_and_answers_as_a_full_replay(tmp_path: Path):
    shared = {"name": "lab-v4-8-1", "zone": "us-central2-b", "shared": True, "accelerator": "v4-8"}
    own = {"name": "tl-carol-c-a1", "zone": "us-central2-b", "accelerator": "v4-8", "kind": "node"}
    gone = {"name": "tl-dave-d-a1", "zone": "us-central2-b", "accelerator": "v4-8", "kind": "node"}
    url = ledger_with(
        tmp_path,
        # the shared TPU's last check was made before the job that ended released it
        ("ann/first", [("submitted", {"spec": SHARED}), ("provisioning", {"attempt": 1, "tpu": shared}),
                       ("provisioned", {"tpu": shared, "hosts": [{"worker": 0}]}),
                       ("started", {"spec_hash": "ab" * 32, "health": "fixed"}), ("finished", {}),
                       ("released", {"tpu": shared, "reason": "job finished"})]),
        ("bob/next", [("submitted", {"spec": SHARED}), ("queued", {"reason": "waits"})]),
        ("carol/c", [("submitted", {"spec": SPEC}), ("provisioning", {"attempt": 1, "tpu": own}),
                     ("provisioned", {"tpu": own, "hosts": [{"worker": 0}]}),
                     ("started", {"spec_hash": "ab" * 32, "health": "warning"})]),
        ("dave/d", [("submitted", {"spec": SPEC}), ("provisioning", {"attempt": 1, "tpu": gone}),
                    ("provisioned", {"tpu": gone, "hosts": [{"worker": 0}]}),
                    ("started", {"spec_hash": "ab" * 32, "health": "healthy"}), ("finished", {}),
                    ("released", {"tpu": gone, "reason": "job finished"})]),
    )
    store = open_store(url)
    save_snapshot(store, load_state(store, until=8))  # a snapshot mid-way: the rest is its tail
    events = list(store.read_all())
    store.close()
    replayed = tpu_rows(replay(events).jobs.values(), tpu_health(events))
    rows = json.loads(run(url, "tpus", "--json").output)
    assert rows == replayed
    assert [(r["tpu"], r["job"], r["health"]) for r in rows] == [
        ("lab-v4-8-1", "bob/next", "fixed"), ("tl-carol-c-a1", "carol/c", "warning")]
    assert "tl-dave-d-a1" not in tpu_health(events)  # a released TPU of a job's own is forgotten
