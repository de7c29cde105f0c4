"""Threads appending through one SQLite store share commits (group commit): each append
still succeeds or fails alone, with its own positions, versions and errors."""

from __future__ import annotations

import threading

import pytest

from ledger.errors import ConflictError
from ledger.events import NewEvent
from ledger.store.sqlite import SQLiteStore
from ledger.verify import verify_store


def test_concurrent_appends_through_one_store_each_land_once(tmp_path):
    store = SQLiteStore(tmp_path / "l.db")
    results: dict[tuple[int, int], object] = {}
    refused: list[Exception] = []
    start = threading.Barrier(9)

    def writer(w: int) -> None:
        start.wait()
        for n in range(40):
            event = NewEvent("note", {"text": f"{w}.{n}"}, key=f"{w}.{n}")
            try:
                results[w, n] = store.append(f"bench/w{w}", [event], expected_version=n)
            except Exception as exc:  # noqa: BLE001 - recorded and asserted below
                results[w, n] = exc

    def stale() -> None:  # two-event appends that always conflict: each fails alone
        start.wait()
        for _ in range(40):
            try:
                store.append("bench/w0", [NewEvent("note", {"text": "a"}), NewEvent("note", {"text": "b"})], expected_version=99)
            except ConflictError as exc:
                refused.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)] + [threading.Thread(target=stale)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(not isinstance(r, Exception) for r in results.values()), results
    positions = sorted(p for r in results.values() for p in r.positions)
    assert positions == list(range(1, 321)) and verify_store(store).ok and len(refused) == 40
    assert all(results[w, n].version == n + 1 for w, n in results)
    # A retry returns the original position; a stale expected version fails alone.
    again = store.append("bench/w3", [NewEvent("note", {"text": "3.5"}, key="3.5")])
    assert again.duplicate and again.positions == results[3, 5].positions
    with pytest.raises(ConflictError):
        store.append("bench/w3", [NewEvent("note", {"text": "late"})], expected_version=1)
    assert store.head() == 320
    store.close()
