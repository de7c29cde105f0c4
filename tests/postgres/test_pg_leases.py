"""Leases on both backends: exclusive, renewable, released, taken over after expiry."""

from __future__ import annotations

import threading
import time

import pytest

from ledger.errors import StoreError
from ledger.store import open_leases
from ledger.store.leases import LeaseKeeper


@pytest.fixture
def leases(store):
    lease_table = store.leases()
    yield lease_table
    close = getattr(lease_table, "close", None)
    if close:
        close()


def test_one_holder_at_a_time_renew_and_release(leases):
    assert leases.acquire("job:a/x", "r1", ttl=30)
    assert not leases.acquire("job:a/x", "r2", ttl=30)
    assert leases.acquire("job:a/x", "r1", ttl=30)  # own lease: renewed, same token
    held = leases.get("job:a/x")
    assert (held.holder, held.token, held.live) == ("r1", 1, True)
    assert leases.renew("job:a/x", "r1", ttl=30)
    assert not leases.renew("job:a/x", "r2", ttl=30)
    assert not leases.release("job:a/x", "r2")
    assert leases.release("job:a/x", "r1")
    assert not leases.renew("job:a/x", "r1", ttl=30)  # released: renewing cannot revive it
    assert leases.acquire("job:a/x", "r2", ttl=30)
    assert leases.get("job:a/x").token == 2  # changed hands: the fencing token grew
    assert leases.get("job:nothing") is None
    assert [lease.name for lease in leases.all()] == ["job:a/x"]


def test_an_expired_lease_is_taken_over(leases):
    assert leases.acquire("job:a/y", "dead", ttl=0.3)
    deadline = time.monotonic() + 10
    while not leases.acquire("job:a/y", "alive", ttl=30):
        assert time.monotonic() < deadline, "the expired lease was never taken over"
        time.sleep(0.05)
    assert not leases.renew("job:a/y", "dead", ttl=30)
    lease = leases.get("job:a/y")
    assert (lease.holder, lease.token, lease.live) == ("alive", 2, True)


def test_contenders_never_both_win(store_factory):
    handles = [store_factory().leases() for _ in range(4)]
    wins: list[str] = []
    barrier = threading.Barrier(len(handles))

    def contend(i: int) -> None:
        barrier.wait(timeout=30)
        for round_ in range(20):
            if handles[i].acquire(f"job:race/{round_}", f"r{i}", ttl=30):
                wins.append(f"{round_}")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(wins, key=int) == [str(r) for r in range(20)]  # exactly one winner per lease
    for h in handles:
        getattr(h, "close", lambda: None)()


def test_bad_arguments_are_refused(leases):
    with pytest.raises(StoreError):
        leases.acquire("job:a/z", "", ttl=5)
    with pytest.raises(StoreError):
        leases.acquire("job:a/z", "r1", ttl=0)


def test_a_keeper_renews_and_a_killed_holders_lease_is_taken_over(ledger_url, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    ttl = 1.0
    repo = Path(__file__).resolve().parents[2]
    open_leases(ledger_url).close()  # create the ledger before the holder races us
    holder = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("lease_holder.py")), ledger_url, "job:a/x", "doomed", str(ttl)],
        cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, stdout=subprocess.PIPE, text=True,
    )
    keeper = LeaseKeeper(lambda: open_leases(ledger_url), "survivor", ttl)
    try:
        assert holder.stdout.readline().strip() == "held"
        # Renewed in the background: still not ours well past one ttl.
        until = time.monotonic() + 2.5 * ttl
        while time.monotonic() < until:
            assert not keeper.claim("job:a/x")
            time.sleep(0.1)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        # Taken over once its ttl runs out (how soon after the kill: bench/lease_bench.py).
        deadline = time.monotonic() + 60
        while not keeper.claim("job:a/x"):
            assert time.monotonic() < deadline, "the dead holder's lease was never taken over"
            time.sleep(0.05)
        assert keeper.holds("job:a/x") and keeper.held() == ["job:a/x"]
        keeper.release("job:a/x")
        assert not keeper.holds("job:a/x")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        keeper.close()


def test_a_keeper_cut_off_from_the_database_stops_holding_before_the_lease_expires(ledger_url):
    calls = []

    def factory():
        calls.append(1)
        if len(calls) > 1:  # the renewing thread: the database is unreachable from now on
            raise StoreError("cannot connect (simulated by the test)")
        return open_leases(ledger_url)

    # A wide margin, so the order of events is the check, not a measured duration (the
    # figures: bench/lease_bench.py, "cut off"): the keeper lets go at ttl - margin = 1 s,
    # while the server keeps the lease until the ttl, 3 s.
    ttl = 3.0
    keeper = LeaseKeeper(factory, "cut-off", ttl=ttl, margin=2.0)
    other = open_leases(ledger_url)
    try:
        claimed = time.monotonic()
        assert keeper.claim("job:c/z") and keeper.holds("job:c/z")
        deadline = claimed + 60
        while keeper.holds("job:c/z"):
            assert time.monotonic() < deadline, "a keeper cut off from the database kept holding"
            time.sleep(0.02)
        # it has stopped acting, and the lease is still the server's: nobody else has it yet
        assert not other.acquire("job:c/z", "next", ttl=5)
        while not other.acquire("job:c/z", "next", ttl=5):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert time.monotonic() - claimed >= ttl  # only after the server-side ttl (a lower bound)
    finally:
        other.close()
        keeper.close()
