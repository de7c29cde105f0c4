"""Leases on both backends: exclusive, renewable, released, taken over after expiry."""

from __future__ import annotations

import threading
import time

import pytest

from ledger.errors import StoreError
from ledger.store.leases import leases_for


@pytest.fixture
def leases(store):
    lease_table = leases_for(store)
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
    handles = [leases_for(store_factory()) for _ in range(4)]
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
