"""The fan-out against the official Pub/Sub emulator and real SQLite stores."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emulator.pubsub import PubSubEmulator
from ledger.events import Event, NewEvent
from ledger.fanout import pubsub
from ledger.fanout.publisher import cursor_name, drain, start_publisher_thread
from ledger.fanout.subscriber import PubSubSubscriber, StoreSubscriber, wait_for_event
from ledger.store import open_store
from tests.fanout.conftest import REPO


def append_interleaved(url: str, n: int, jobs: int, start: int = 0) -> None:
    store = open_store(url)
    try:
        batches = [(f"user{i % jobs}/job{i % jobs}", [NewEvent("note", {"text": str(i)}, key=f"e{i}")], None)
                   for i in range(start, start + n)]
        for k in range(0, len(batches), 2000):
            store.append_many(batches[k : k + 2000])
    finally:
        store.close()


def collect(sub, count: int, timeout: float) -> list[Event]:
    got: list[Event] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += sub.receive(1.0)
    return got


def assert_per_job_order(events: list[Event]) -> None:
    seen: dict[str, int] = {}
    for event in events:
        assert event.version == seen.get(event.stream, 0) + 1, f"{event.stream} out of order at v{event.version}"
        seen[event.stream] = event.version


def test_events_arrive_in_per_job_order_with_attributes(emulator, names, store_url) -> None:
    topic, sub_name = names
    append_interleaved(store_url, 1000, jobs=7)
    sub = PubSubSubscriber(sub_name, topic=topic)
    try:
        stats = drain(store_url, topic=topic, subscriptions=(sub_name,), batch_size=500)
        assert stats.position == 1000 and stats.published == 1000
        store = open_store(store_url)
        assert store.get_cursor(cursor_name(topic)) == 1000
        got = collect(sub, 1000, timeout=60)
        assert len(got) == 1000 and len({e.id for e in got}) == 1000
        assert_per_job_order(got)
        assert all(e.expected_hash() == e.hash for e in got)
        # the raw messages carry the attributes and the job as ordering key
        store.append("user1/job1", [NewEvent("failed", {"kind": "exit", "exit_code": 3})])
        raw_name = sub_name + "-raw"
        pubsub.ensure_all(pubsub.config_from_env(None, topic), (raw_name,))
        drain(store, topic=topic)
        client = pubsub.subscriber_client(pubsub.config_from_env(None, topic))
        path = pubsub.config_from_env(None, topic).subscription_path(raw_name)
        response = client.pull(request={"subscription": path, "max_messages": 10}, timeout=30)
        client.acknowledge(request={"subscription": path, "ack_ids": [m.ack_id for m in response.received_messages]})
        client.close()
        (message,) = [m.message for m in response.received_messages]
        assert message.ordering_key == "user1/job1"
        assert dict(message.attributes) == {"type": "failed", "stream": "user1/job1", "seq": "1001",
                                            "id": store.get_event(message.attributes["id"]).id}
        store.close()
    finally:
        sub.close()


def test_duplicates_are_dropped_by_id(emulator, names, store_url, tmp_path: Path) -> None:
    """Two copies of one ledger published to one topic: each event reaches the subscriber once."""
    topic, sub_name = names
    append_interleaved(store_url, 500, jobs=5)
    copy = tmp_path / "copy.db"
    shutil.copy(store_url.removeprefix("sqlite:///"), copy)
    sub = PubSubSubscriber(sub_name, topic=topic)
    try:
        drain(store_url, topic=topic, subscriptions=(sub_name,))
        drain(f"sqlite:///{copy}", topic=topic)
        got = collect(sub, 500, timeout=60)
        deadline = time.monotonic() + 60
        while sub.received < 1000 and time.monotonic() < deadline:
            got += sub.receive(0.5)
        assert sub.received == 1000 and sub.dedup.dropped == 500
        assert len(got) == 500 and len({e.id for e in got}) == 500
        assert_per_job_order(got)
    finally:
        sub.close()


def test_kill_9_mid_stream_then_restart_delivers_everything(emulator, names, store_url, tmp_path: Path) -> None:
    topic, sub_name = names
    total = 12_000
    append_interleaved(store_url, total, jobs=50)
    sub = PubSubSubscriber(sub_name, topic=topic)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PUBSUB_EMULATOR_HOST": emulator.endpoint}
    cmd = [sys.executable, "-m", "ledger", "--store", store_url, "fanout", "--topic", topic,
           "--subscription", sub_name, "--batch-size", "100"]
    store = open_store(store_url)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while store.get_cursor(cursor_name(topic)) < 1000 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed_at = store.get_cursor(cursor_name(topic))
        assert 1000 <= killed_at < total, "the kill must land mid-stream"
        restart = subprocess.run([*cmd, "--once", "--json"], env=env, cwd=REPO, capture_output=True, timeout=240)
        assert restart.returncode == 0, restart.stderr.decode()
        assert store.get_cursor(cursor_name(topic)) == total
        got = collect(sub, total, timeout=120)
        assert len(got) == total and len({e.id for e in got}) == total
        assert sub.received >= total  # the batch in flight at the kill may come twice
        assert_per_job_order(got)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        store.close()
        sub.close()


@pytest.fixture
def own_emulator(tmp_path: Path, emulator):
    """A second emulator this test may stop and restart (the session one is shared)."""
    emu = PubSubEmulator(tmp_path / "emulator.log")
    emu.start()
    previous = os.environ["PUBSUB_EMULATOR_HOST"]
    os.environ["PUBSUB_EMULATOR_HOST"] = emu.endpoint
    try:
        yield emu
    finally:
        os.environ["PUBSUB_EMULATOR_HOST"] = previous
        emu.stop()


def test_backlog_drains_after_the_emulator_restarts(own_emulator, names, store_url) -> None:
    topic, sub_name = names
    sub = PubSubSubscriber(sub_name, topic=topic)
    thread, stop = start_publisher_thread(store_url, None, topic, subscriptions=(sub_name,))
    try:
        append_interleaved(store_url, 200, jobs=4)
        assert len(collect(sub, 200, timeout=60)) == 200
        own_emulator.stop()
        append_interleaved(store_url, 300, jobs=4, start=200)
        time.sleep(1.0)  # let the publisher and subscriber hit the outage
        own_emulator.start()
        got = collect(sub, 300, timeout=90)
        assert len(got) == 300 and {int(e.data["text"]) for e in got} == set(range(200, 500))
        for stream in {e.stream for e in got}:
            versions = [e.version for e in got if e.stream == stream]
            assert versions == sorted(versions)
    finally:
        stop.set()
        thread.join(timeout=30)
        sub.close()
    assert not thread.is_alive()
    store = open_store(store_url)
    assert store.get_cursor(cursor_name(topic)) == 500
    store.close()


def test_wait_for_event_wakes_on_append_or_times_out(emulator, names, store_url) -> None:
    topic, sub_name = names
    store = open_store(store_url)
    tailer = StoreSubscriber(store_url)
    sub = PubSubSubscriber(sub_name, topic=topic)
    thread, stop = start_publisher_thread(store_url, None, topic, subscriptions=(sub_name,))
    try:
        started = time.monotonic()
        assert wait_for_event(tailer, 0.3) is False
        assert time.monotonic() - started >= 0.3
        timer = threading.Timer(0.3, lambda: open_store(store_url).append("a/b", [NewEvent("queued")]))
        timer.start()
        # an hour's timeout: returning True at all means the append woke it (how soon is a
        # figure: bench/fanout_bench.py, append -> receipt latency)
        woke: list[bool] = []
        waiter = threading.Thread(target=lambda: woke.append(wait_for_event(tailer, 3600)), daemon=True)
        waiter.start()
        waiter.join(120)
        assert woke == [True]
        assert wait_for_event(sub, 30) is True
        assert wait_for_event(sub, 0.5) is False
        timer.join()
    finally:
        stop.set()
        thread.join(timeout=30)
        tailer.close()
        sub.close()
        store.close()


def test_store_subscriber_filters_and_resumes(store_url) -> None:
    store = open_store(store_url)
    store.append("alice/a", [NewEvent("queued"), NewEvent("started"), NewEvent("failed", {"kind": "exit"})])
    store.append("bob/b", [NewEvent("queued"), NewEvent("failed", {"kind": "exit"})])
    sub = StoreSubscriber(store, after=0, types=["failed"])
    assert [(e.stream, e.type) for e in sub.receive(1.0)] == [("alice/a", "failed"), ("bob/b", "failed")]
    assert sub.receive(0.1) == []
    only_bob = StoreSubscriber(store, after=0, streams=["bob/b"])
    assert [e.version for e in only_bob.receive(1.0)] == [1, 2]
    assert StoreSubscriber(store).receive(0.1) == []  # default: from the head on
    store.close()


def test_bad_topic_name_is_a_one_line_error(emulator, store_url) -> None:
    append_interleaved(store_url, 1, jobs=1)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "ledger", "--store", store_url, "fanout", "--once", "--topic", "x"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith("error: Pub/Sub refused the request") and "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_100k_backlog_drains_in_bounded_memory(emulator, names, store_url) -> None:
    """The publisher holds at most two batches: its peak RSS stays far below the backlog's size."""
    topic, _ = names
    total = 100_000
    store = open_store(store_url)
    pad = "x" * 300  # ~100k x 0.8 kB envelopes: ~80 MB as bytes, several times that as objects
    for k in range(0, total, 10_000):
        store.append_many([(f"user{i % 500}/job", [NewEvent("note", {"text": f"{i} {pad}"})], None)
                           for i in range(k, k + 10_000)])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "--store", store_url, "fanout", "--once",
                             "--topic", topic, "--timeout", "120"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = time.monotonic()
    # Anonymous memory is what a backlog could exhaust; the store's memory-mapped file pages
    # also count in RSS but are page cache the kernel reclaims, so they are left out.
    peak_kb = 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            break
        peak_kb = max(peak_kb, next((int(line.split()[1]) for line in status.splitlines() if line.startswith("RssAnon:")), 0))
        time.sleep(0.05)
    print(f"drained {total} events in {time.monotonic() - started:.1f}s, peak anonymous RSS {peak_kb // 1024} MB")
    assert proc.wait() == 0, proc.stderr.read().decode()
    assert store.get_cursor(cursor_name(topic)) == total
    peak_mb = peak_kb / 1024
    assert peak_mb < 150, f"publisher peaked at {peak_mb:.0f} MB"
    store.close()


def test_long_running_commands_publish_while_they_run(emulator, names, store_url) -> None:
    """`ledger watch --topic` and `ledger reconcile --topic` run the outbox beside them."""
    from ledger.fanout import publishing

    topic, sub_name = names
    sub = PubSubSubscriber(sub_name, topic=topic)
    try:
        with publishing(store_url, None, topic):
            append_interleaved(store_url, 20, jobs=2)
            assert len(collect(sub, 20, timeout=60)) == 20
    finally:
        sub.close()
    store = open_store(store_url)
    assert store.get_cursor(cursor_name(topic)) == 20
    store.close()
