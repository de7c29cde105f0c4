"""Force-pushes, racing watchers, a watcher killed mid-ingest, a 1,000-commit push."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from gitops_helpers import BOB, CAROL, ROOT, cli_env, git, job_events, run_cli, spec, wait_for

from ledger.fold import CANCELLING, PENDING, replay
from ledger.gitops import ingest, read_position
from ledger.store.sqlite import SQLiteStore


def test_force_push_pauses_until_the_rewrite_is_accepted(hub, store, store_url):
    hub.bootstrap()
    hub.commit({"jobs/alice/keep.yaml": spec()}, "keep", approvers=(BOB,))
    hub.commit({"jobs/alice/gone.yaml": spec()}, "gone", approvers=(BOB,))
    old = hub.head()
    hub.push()
    ingest(hub.bare, store, "main")
    # rewrite: drop the last commit, add another one, force-push
    git(hub.work, "reset", "-q", "--hard", "HEAD~1")
    new = hub.commit({"jobs/alice/new.yaml": spec()}, "new", approvers=(CAROL,))
    hub.push("--force")
    report = ingest(hub.bare, store, "main")
    assert report.paused and report.rewritten["old_head"] == old and report.rewritten["new_head"] == new
    [(t, d)] = [(e.type, e.data) for e in store.read_stream("_git:main") if e.type == "history_rewritten"]
    assert d == {"old_head": old, "new_head": new, "old_head_exists": True}
    # paused: nothing pruned, nothing new ingested, a second run records nothing more
    assert "alice/new" not in store.streams()
    assert replay(store.read_all()).jobs["alice/gone"].state == PENDING
    head = store.head()
    assert ingest(hub.bare, store, "main").paused and store.head() == head
    proc = run_cli(store_url, "watch", "--repo", str(hub.bare), "--once", check=False)
    assert proc.returncode == 1 and "accept-rewrite" in proc.stderr
    # the operator accepts: the net change old -> new becomes events, nothing silently pruned
    proc = run_cli(store_url, "watch", "--repo", str(hub.bare), "--once", "--accept-rewrite", "--json")
    assert '"paused": false' in proc.stdout
    store2 = SQLiteStore(store.path)
    jobs = replay(store2.read_all()).jobs
    assert jobs["alice/gone"].state == CANCELLING and jobs["alice/new"].state == PENDING
    assert jobs["alice/keep"].state == PENDING
    types = [e.type for e in store2.read_stream("_git:main")]
    assert types.index("history_rewritten") < types.index("rewrite_accepted")
    assert read_position(store2, "main").commit == new
    store2.close()


def test_two_watchers_racing_ingest_every_commit_once(hub, store, store_url):
    hub.bootstrap()
    shas = hub.fast_commits(150)
    hub.push()
    procs = [
        subprocess.Popen([sys.executable, "-m", "ledger", "ingest", "--repo", str(hub.bare), "--json"],
                         cwd=ROOT, env=cli_env(store_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    events = job_events(store)
    assert len(events) == 150 and len({e.id for e in events}) == 150
    assert [e.data["commit"] for e in events] == shas
    markers = [e.data["commit"] for e in store.read_stream("_git:main") if e.type == "note"]
    assert markers[1:] == shas and len(set(markers)) == len(markers)


def test_watcher_killed_mid_ingest_loses_and_duplicates_nothing(hub, store, store_url):
    hub.bootstrap()
    shas = hub.fast_commits(1000)
    hub.push()
    env = cli_env(store_url)
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "watch", "--repo", str(hub.bare), "--once"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # kill -9 once some, but not all, of the backlog is in
        wait_for(lambda: len(job_events(store)) >= 1 or proc.poll() is not None, timeout=60, step=0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    partial = len(job_events(store))
    assert partial > 0, proc.stderr.read()
    if partial >= 1000:
        pytest.skip("the watcher finished before it could be killed")
    run_cli(store_url, "watch", "--repo", str(hub.bare), "--once")
    events = job_events(store)
    assert [e.data["commit"] for e in events] == shas  # every commit, once, in order
    assert len({e.id for e in events}) == 1000
    assert store.head() == len(list(store.read_all()))


@pytest.mark.slow
def test_a_push_of_1000_commits_is_ingested_in_order(hub, store):
    hub.bootstrap()
    shas = hub.fast_commits(1000)
    hub.push()
    report = ingest(hub.bare, store, "main")
    assert report.commits == 1001 and report.counts == {"submitted": 1000, "policy_changed": 1}  # the bootstrap policy
    events = job_events(store)
    assert [e.data["commit"] for e in events] == shas
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    # how long it takes is a figure, not a check: bench/watch_bench.py (1,000-commit backlog)


def test_concurrent_ingest_threads_with_separate_connections(hub, store):
    hub.bootstrap()
    hub.fast_commits(60)
    hub.push()
    errors: list[BaseException] = []

    def run() -> None:
        s = SQLiteStore(store.path)
        try:
            ingest(hub.bare, s, "main", chunk=7)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    events = job_events(store)
    assert len(events) == 60 and len({e.stream for e in events}) == 60


def test_accepting_a_rewrite_whose_old_commits_were_collected(hub, store):
    hub.bootstrap()
    hub.commit({"jobs/alice/keep.yaml": spec(), "jobs/alice/gone.yaml": spec()}, "two", approvers=(BOB,))
    hub.commit({"jobs/alice/keep.yaml": spec("v4-16")}, "resize", approvers=(BOB,))
    hub.push()
    ingest(hub.bare, store, "main")
    git(hub.work, "reset", "-q", "--hard", "HEAD~2")
    new = hub.commit({"jobs/alice/keep.yaml": spec("v4-32"), "jobs/alice/new.yaml": spec()}, "redo",
                     approvers=(CAROL,))
    hub.push("--force")
    for repo in (hub.bare, hub.work):  # the old history is gone for good
        git(repo, "reflog", "expire", "--expire=now", "--all")
        git(repo, "gc", "-q", "--prune=now")
    report = ingest(hub.bare, store, "main")
    assert report.paused and report.rewritten["old_head_exists"] is False
    report = ingest(hub.bare, store, "main", accept_rewrite=True, accepted_by="ops")
    assert not report.paused and report.position == new
    jobs = replay(store.read_all()).jobs
    assert jobs["alice/gone"].state == CANCELLING
    assert jobs["alice/keep"].spec["tpu"]["accelerator"] == "v4-32"
    assert jobs["alice/new"].state == PENDING
    assert [e.type for e in store.read_stream("alice/keep")] == ["submitted", "spec_updated", "spec_updated"]
    accepted = [e for e in store.read_stream("_git:main") if e.type == "rewrite_accepted"]
    assert accepted[0].data["by"] == "ops"
