"""`ledger queue`, `ledger admit` and inspect's reason line, through the CLI on a real SQLite ledger."""

from __future__ import annotations

import getpass
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger import capacity_snapshot
from ledger.app.cli import cli
from ledger.app.queueview import (
    LedgerPolicy,
    PolicyFile,
    admission_jobs,
    queue_rows,
    queue_summary,
    record_policy,
    recorded_policy,
    would_start,
)
from ledger.events import NewEvent, actor, parse_time
from ledger.events.data import PolicyChanged
from ledger.fold import replay
from ledger.replay import SNAPSHOT_EVERY, load_state, save_snapshot
from ledger.spec.policy import sharing_blocks
from ledger.store import open_store
from ledger.usage.snapshot import load_for_admission, usable
from tests.admission.lab import POLICY, ZONE, policy, spec

GIT = {"spec_hash": "ab" * 32, "commit": "c0ffee", "path": "jobs/a/b.yaml"}


def tpu(name: str, accelerator: str) -> dict:
    return {"name": name, "zone": ZONE, "kind": "node", "accelerator": accelerator}


def running(accelerator: str, name: str, priority: int = 500) -> list[tuple[str, dict]]:
    t = tpu(name, accelerator)
    return [("submitted", {"spec": spec(accelerator, priority=priority)}), ("provisioning", {"attempt": 1, "tpu": t}),
            ("provisioned", {"tpu": t, "hosts": [{"worker": 0}]}), ("setup_started", {}), ("setup_done", {}),
            ("started", {"attempt": 1})]


def lab(tmp_path: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url)
    jobs = {
        "alice/a": running("v4-128", "n1"),  # alice holds 64 of her 64
        "alice/b": [("submitted", {"spec": spec("v4-64")})],
        "carol/c": [("submitted", {"spec": spec("v4-8", priority=900)})],
    }
    for job_id, events in jobs.items():
        store.append(job_id, [NewEvent(t, {**(GIT if t == "submitted" else {}), **d}, actor("git", "tester")) for t, d in events])
    store.close()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return url, str(policy)


def run(url: str, *args: str):
    return CliRunner().invoke(cli, ["--store", url, *args], catch_exceptions=False)


def test_queue_lists_waiting_jobs_in_order_with_why(tmp_path: Path):
    url, policy = lab(tmp_path)
    out = run(url, "queue", "--policy", policy, "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [(r["job"], r["wait"]) for r in rows] == [("carol/c", "admitted"), ("alice/b", "quota")]
    assert "user alice holds 64 of 64 v4 chips, needs 32" in rows[1]["reason"]
    table = run(url, "queue", "--policy", policy)
    assert "alice/b" in table.output and "quota" in table.output
    # without the policy nobody is held back
    rows = json.loads(run(url, "queue", "--json").output)
    assert {r["wait"] for r in rows} == {"admitted"}


def test_queue_shows_the_fair_tree_below_the_jobs_and_alone_with_tree(tmp_path: Path):
    url, policy = lab(tmp_path)
    table = run(url, "queue", "--policy", policy)
    assert "fair tree" in table.output and "@lab/nlp" in table.output
    levels = json.loads(run(url, "queue", "--policy", policy, "--tree", "--json").output)
    assert [(lv["level"], lv["name"], lv["parent"]) for lv in levels] == [
        ("lab", "lab", ""), ("team", "(no team)", "lab"), ("user", "carol", "(no team)"),
        ("team", "@lab/nlp", "lab"), ("user", "alice", "@lab/nlp")]
    nlp = levels[3]
    assert nlp["weight"] == 1 and nlp["share"] == 0.5 and nlp["usage"] > 0 and nlp["usage_share"] == 1.0
    assert levels[1]["fair_share"] is None  # no usage yet: owed the most
    assert json.loads(run(url, "queue", "--tree", "--json").output) == []  # no sharing rules recorded: no tree
    assert "no sharing policy" in run(url, "queue", "--tree").output


def test_queue_summary_counts_the_waiting_and_their_oldest_wait(tmp_path: Path):
    url, policy_path = lab(tmp_path)
    store = open_store(url)
    try:
        rows = queue_rows(store, policy())
        submitted = {e.stream: e.time for e in store.read_all() if e.type == "submitted"}
    finally:
        store.close()
    later = parse_time(max(submitted.values())) + timedelta(seconds=90)
    summary = queue_summary(rows, later)
    assert (summary["waiting"], summary["by_wait"]) == (2, {"admitted": 1, "quota": 1})
    assert summary["oldest_since"] == min(submitted[j] for j in ("alice/b", "carol/c"))
    assert 90 <= summary["oldest_wait_s"] < 100
    assert queue_summary([]) == {"waiting": 0, "by_wait": {}, "oldest_since": None, "oldest_wait_s": None}


def test_inspect_says_why_a_job_waits(tmp_path: Path):
    url, policy = lab(tmp_path)
    out = run(url, "inspect", "alice/b", "--policy", policy)
    assert out.exit_code == 0, out.output
    assert "waiting: #2 in the queue (normal, quota)" in " ".join(out.output.split())
    # --json: the same row `ledger queue --json` has for the job, beside its events
    shown = json.loads(run(url, "inspect", "alice/b", "--policy", policy, "--json").output)
    queue = json.loads(run(url, "queue", "--policy", policy, "--json").output)
    row = next(r for r in queue if r["job"] == "alice/b")
    # fair-share usage grows with the open intervals between the two calls: all else is equal
    moving = "fair_share_usage"
    assert {k: v for k, v in shown["waiting"].items() if k != moving} == {k: v for k, v in row.items() if k != moving}
    assert shown["waiting"][moving] == pytest.approx(row[moving], abs=0.1)
    assert shown["waiting"]["wait"] == "quota" and shown["events"][0]["type"] == "submitted"
    assert json.loads(run(url, "inspect", "carol/c", "--json").output)["waiting"]["wait"] == "admitted"


def test_admit_is_audited_and_lets_the_job_past_its_quota(tmp_path: Path):
    url, policy = lab(tmp_path)
    out = run(url, "admit", "alice/b", "--reason", "paper deadline")
    assert out.exit_code == 0, out.output
    store = open_store(url)
    events = store.read_stream("alice/b")
    store.close()
    assert events[-1].type == "admitted" and events[-1].data["by"] == getpass.getuser()
    assert events[-1].actor["manual"] is True
    assert replay(events).jobs["alice/b"].admitted_by == getpass.getuser()
    rows = json.loads(run(url, "queue", "--policy", policy, "--json").output)
    assert {r["job"]: r["wait"] for r in rows}["alice/b"] == "admitted"
    assert run(url, "verify").exit_code == 0
    bad = CliRunner().invoke(cli, ["--store", url, "admit", "nobody/x", "--reason", "r"])
    assert bad.exit_code != 0 and "no job" in bad.output


def test_plan_says_whether_a_new_job_would_start_now_or_wait(tmp_path: Path):
    url, _ = lab(tmp_path)
    store = open_store(url)
    try:
        answer = would_start(store)
        assert answer is not None
        starts = answer({"alice/new": spec("v4-8"), "dave/new": spec("v4-8")}, policy())
    finally:
        store.close()
    assert starts["dave/new"] == "would start now"
    assert starts["alice/new"].startswith("would wait (#")
    assert "over quota: user alice holds 64 of 64 v4 chips, needs 4" in starts["alice/new"]
    assert would_start(None) is None


def test_the_reconcilers_policy_is_recorded_once_and_queue_explains_by_it(tmp_path: Path):
    url, _ = lab(tmp_path)
    store = open_store(url)
    try:
        assert record_policy(store, None, source="", holder="r1") is False  # nothing to say yet
        assert record_policy(store, policy(), source="jobs/.ledger/policy.yaml", holder="r1") is True
        assert record_policy(store, policy(), source="jobs/.ledger/policy.yaml", holder="r1") is False  # unchanged
        assert recorded_policy(store).quotas == policy().quotas
        events = list(store.read_stream("_policy"))
        assert len(events) == 1 and "webhook" not in json.dumps(events[0].data)
    finally:
        store.close()
    rows = json.loads(run(url, "queue", "--json").output)  # no --policy: the recorded one
    assert {r["job"]: r["wait"] for r in rows}["alice/b"] == "quota"
    store = open_store(url)
    try:  # a reconciler started without a policy records that nothing is enforced any more
        assert record_policy(store, None, source="", holder="r2") is True
    finally:
        store.close()
    rows = json.loads(run(url, "queue", "--json").output)
    assert {r["wait"] for r in rows} == {"admitted"}
    assert run(url, "verify").exit_code == 0


def test_the_policy_file_is_followed_recorded_per_change_and_a_broken_or_empty_edit_kept_out(tmp_path: Path):
    url, path = lab(tmp_path)
    source = PolicyFile(Path(path), url, "r1")
    first = source()
    assert first is not None and first.quotas.users["alice"].chips["v4"] == 64
    assert source() is first  # unchanged file: not even parsed again

    def recorded() -> int:
        store = open_store(url)
        try:
            return store.stream_version("_policy")
        finally:
            store.close()

    assert recorded() == 1
    Path(path).write_text(POLICY.replace("alice: {chips: {v4: 64}}", "alice: {chips: {v4: 128}}"))
    second = source()
    assert second is not None and second.quotas.users["alice"].chips["v4"] == 128 and recorded() == 2
    Path(path).write_text(POLICY + "quotas: [broken\n")
    assert source() is second and recorded() == 2  # the last good one stays in force
    Path(path).write_text("")  # truncated by a rewrite, caught before the write
    assert source() is second and recorded() == 2  # not a policy without a single quota
    Path(path).write_text(POLICY)
    third = source()
    assert third is not None and third.quotas.users["alice"].chips["v4"] == 64 and recorded() == 3
    Path(path).write_text("{}\n")  # every rule lifted, on purpose
    assert source().quotas.users == {} and recorded() == 4


def test_the_watchers_policy_in_git_is_the_one_in_force_by_default(tmp_path: Path):
    url, path = lab(tmp_path)
    store = open_store(url)
    try:
        follow = LedgerPolicy(url)
        assert follow() is None  # nothing recorded: nothing enforced
        changed = PolicyChanged(commit="c1", prices=[], sharing=sharing_blocks(policy()))
        store.append("_policy", [NewEvent("policy_changed", changed, actor("watcher", "ledger watch"))])
        assert follow().quotas == policy().quotas  # the branch's rules, followed
        assert record_policy(store, policy(), source=path, holder="r1") is False  # the same rules: nothing to add
        rows = json.loads(run(url, "queue", "--json").output)
        assert {r["job"]: r["wait"] for r in rows}["alice/b"] == "quota"
        # a reconciler given another file records its rules: they are the ones in force now
        assert record_policy(store, policy("quotas: {lab: {chips: {v4: 8}}}\n"), source="other.yaml", holder="r1")
        assert follow().quotas.lab.chips == {"v4": 8}
    finally:
        store.close()
    assert run(url, "verify").exit_code == 0


def test_queue_reads_only_the_live_jobs_and_answers_as_with_every_job(tmp_path: Path):
    """`ledger queue` and inspect decode only the jobs admission reads (not ended, or still
    holding a TPU) from the snapshot: the same rows as from every job's state."""
    url, _ = lab(tmp_path)
    store = open_store(url)
    try:
        ended = {
            "bob/done": [*running("v4-8", "n2"), ("finished", {"exit_code": 0}), ("released", {"tpu": tpu("n2", "v4-8")})],
            "alice/old": [*running("v4-128", "n0"), ("finished", {"exit_code": 0})],  # its TPU not yet released
        }
        for job_id, events in ended.items():
            store.append(job_id, [NewEvent(t, {**(GIT if t == "submitted" else {}), **d}, actor("git", "tester"))
                                  for t, d in events])
        save_snapshot(store, load_state(store))
        store.append("dan/d", [NewEvent("submitted", {**GIT, "spec": spec("v4-32")}, actor("git", "tester"))])  # after it
        every = load_state(store).jobs
        assert every["alice/old"].terminal and every["alice/old"].tpu and every["bob/done"].tpu is None
        live = admission_jobs(store)
        assert set(live) == {"alice/a", "alice/b", "carol/c", "alice/old", "dan/d"}
        assert all(live[j] == every[j] for j in live)
        rules, now = policy(), datetime.now(UTC)  # one moment for both: fair-share usage decays
        rows = queue_rows(store, rules, now=now)
        assert rows == queue_rows(store, rules, every, now=now)
        assert [(r["job"], r["wait"]) for r in rows][-1] == ("alice/b", "quota")
    finally:
        store.close()


def test_queue_keeps_the_whole_usage_fold_it_had_to_make(tmp_path: Path):
    """After an upgrade of the usage snapshot's code no snapshot is usable: the first `ledger
    queue` folds usage from the first event, and saves it so that the next reader (another
    queue, inspect) starts from it instead of folding it all again."""
    url, policy_file = lab(tmp_path)
    store = open_store(url)
    try:
        store.append("alice/notes", [NewEvent("note", {"text": str(i)}) for i in range(SNAPSHOT_EVERY)])
        half_life = policy().fair_share.half_life_hours
        assert usable(store, half_life, store.head()) is None
        folded_whole: list[int] = []
        load_for_admission(store, half_life, keep_whole=lambda meter, fold: folded_whole.append(fold.position))
        assert folded_whole == [store.head()]  # nothing to start from: the whole fold
        before = [(r["job"], r["wait"], r["reason"]) for r in json.loads(run(url, "queue", "--policy", policy_file, "--json").output)]
        assert usable(store, half_life, store.head())[1].position == store.head()
        load_for_admission(store, half_life, keep_whole=lambda meter, fold: folded_whole.append(fold.position))
        assert folded_whole == [store.head()]  # the saved snapshot's admission part sufficed
        after = json.loads(run(url, "queue", "--policy", policy_file, "--json").output)
        assert [(r["job"], r["wait"], r["reason"]) for r in after] == before
    finally:
        store.close()


def test_queue_keeps_the_capacity_memory_it_had_to_fold(tmp_path: Path):
    """With no usable capacity snapshot (after an upgrade of its code) the first `ledger
    queue` folds the capacity memory from the first event and saves it, so the next reader
    starts from it; the answers are the same."""
    url, policy_file = lab(tmp_path)
    store = open_store(url)
    try:
        store.append("alice/notes", [NewEvent("note", {"text": str(i)}) for i in range(SNAPSHOT_EVERY)])
        code = capacity_snapshot.code_version()
        assert store.load_snapshot(capacity_snapshot.SNAPSHOT_NAME, code, at_most=store.head()) is None
        before = [(r["job"], r["wait"], r["reason"]) for r in json.loads(run(url, "queue", "--policy", policy_file, "--json").output)]
        saved = store.load_snapshot(capacity_snapshot.SNAPSHOT_NAME, code, at_most=store.head())
        assert saved is not None and saved.position == store.head()
        assert not capacity_snapshot.capacity_due(store, store.head())  # the next reader starts from it
        after = json.loads(run(url, "queue", "--policy", policy_file, "--json").output)
        assert [(r["job"], r["wait"], r["reason"]) for r in after] == before
    finally:
        store.close()
