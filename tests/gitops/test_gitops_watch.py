"""The watch loop's wake-ups: watchdog hints, the poll, the post-receive hook, a remote mirror."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from gitops_helpers import BOB, ROOT, cli_env, git, job_events, run_cli, spec, wait_for

from ledger.gitops import Watcher
from ledger.store.sqlite import SQLiteStore
from tests.processes import service, stop_with_sigterm


def _run(watcher: Watcher) -> threading.Thread:
    t = threading.Thread(target=watcher.run, daemon=True)
    t.start()
    return t


def test_watchdog_hint_ingests_a_push_long_before_the_poll(hub, store):
    hub.bootstrap()
    # The next poll is an hour away: only the file system hint can ingest the push in time.
    # (How fast the hint is, is a figure: bench/watch_bench.py, push -> submitted latency.)
    watcher = Watcher(str(hub.bare), store, "main", interval=3600.0)
    thread = _run(watcher)
    try:
        wait_for(lambda: store.stream_version("_git:main") >= 1)
        hub.commit({"jobs/alice/fast.yaml": spec()}, "fast", approvers=(BOB,))
        hub.push()
        wait_for(lambda: "alice/fast" in store.streams(), timeout=120)
        assert watcher.wakeups > 0
    finally:
        watcher.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_poll_alone_is_the_backstop(hub, store):
    hub.bootstrap()
    watcher = Watcher(str(hub.bare), store, "main", interval=0.2, use_watchdog=False)
    thread = _run(watcher)
    try:
        hub.commit({"jobs/alice/polled.yaml": spec()}, "polled", approvers=(BOB,))
        hub.push()
        wait_for(lambda: "alice/polled" in store.streams(), timeout=20)
        # packed refs change the layout; the branch is still re-read with git
        git(hub.bare, "pack-refs", "--all")
        hub.commit({"jobs/alice/packed.yaml": spec()}, "after pack-refs", approvers=(BOB,))
        hub.push()
        wait_for(lambda: "alice/packed" in store.streams(), timeout=20)
    finally:
        watcher.stop()
        thread.join(timeout=10)


def test_post_receive_hook_ingests_before_push_returns(hub, store, store_url):
    hub.bootstrap()
    proc = run_cli(store_url, "install-hook", "--repo", str(hub.bare))
    assert "post-receive" in proc.stdout
    hook = hub.bare / "hooks" / "post-receive"
    assert hook.exists() and hook.stat().st_mode & 0o111
    hub.commit({"jobs/alice/hooked.yaml": spec()}, "via hook", approvers=(BOB,))
    hub.push()
    # no watcher runs: the hook did it, synchronously, inside `git push`
    assert [e.type for e in store.read_stream("alice/hooked")] == ["submitted"]
    # a foreign hook is not overwritten without --force
    hook.write_text("#!/bin/sh\necho mine\n")
    proc = run_cli(store_url, "install-hook", "--repo", str(hub.bare), check=False)
    assert proc.returncode == 2 and "--force" in proc.stderr


def test_remote_url_is_watched_through_a_local_mirror(hub, store, tmp_path):
    hub.bootstrap()
    hub.commit({"jobs/alice/remote.yaml": spec()}, "remote", approvers=(BOB,))
    hub.push()
    url = hub.bare.as_uri()  # file://: a URL, so it goes through the mirror like https:// or ssh
    cache = tmp_path / "cache"
    watcher = Watcher(url, store, "main", interval=0.2, cache_dir=cache)
    assert watcher.remote and Path(watcher.path).is_relative_to(cache)
    watcher.run_once()
    assert [e.type for e in store.read_stream("alice/remote")] == ["submitted"]
    hub.commit({"jobs/alice/remote2.yaml": spec()}, "second", approvers=(BOB,))
    hub.push()
    thread = _run(watcher)
    try:
        wait_for(lambda: "alice/remote2" in store.streams(), timeout=20)
    finally:
        watcher.stop()
        thread.join(timeout=10)


def test_ledger_watch_process_ingests_pushes_and_stops_cleanly_on_sigterm(hub, store, store_url):
    """As systemd runs it: one JSON object per ingest on stdout (--json), JSON log lines on
    stderr (time, component, message); SIGTERM ends the loop after the ingest under way, the
    shutdown logged, and the ledger verifies afterwards."""
    hub.bootstrap()
    with service([sys.executable, "-m", "ledger", "--log-format", "json", "watch", "--repo", str(hub.bare),
                  "--interval", "30", "--json"], cwd=ROOT, env=cli_env(store_url)) as proc:
        s = SQLiteStore(store.path)
        wait_for(lambda: s.stream_version("_git:main") >= 1, timeout=30)
        hub.commit({"jobs/alice/live.yaml": spec()}, "live", approvers=(BOB,))
        hub.push()
        wait_for(lambda: "alice/live" in s.streams(), timeout=20)
        s.close()
        out, err = stop_with_sigterm(proc, timeout=30)
    assert proc.returncode == 0, err
    assert '"commits": 1' in out
    assert len(job_events(store)) == 1
    records = [json.loads(line) for line in err.splitlines()]  # no Traceback: every line is a record
    assert all(r["component"] == "watch" and r["time"].endswith("Z") for r in records), records
    messages = [r["message"] for r in records]
    assert messages[0].startswith(f"watching {hub.bare} (main)")
    assert messages[-2:] == ["stopping on SIGTERM: the ingest under way was finished", "stopped"]
    assert run_cli(store_url, "verify").returncode == 0


def test_ingest_cli_reports_json_and_errors_in_one_line(hub, store_url, tmp_path):
    hub.bootstrap()
    proc = run_cli(store_url, "ingest", "--repo", str(hub.bare), "--json")
    assert '"commits": 1' in proc.stdout
    proc = run_cli(store_url, "ingest", "--repo", str(hub.bare), "--branch", "nope", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("error: branch 'nope' not found")
    proc = run_cli(store_url, "ingest", "--repo", str(tmp_path / "missing"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
