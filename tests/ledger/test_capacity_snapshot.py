"""The capacity memory's snapshot (ledger/capacity_snapshot.py): snapshot + tail is exactly the
memory of a fold of every event (hypothesis, pure); on a real ledger (SQLite and PostgreSQL)
`load_capacity` starts from it, a snapshot whose content was forged with consistent hashes is caught by
`verify_snapshots`, a damaged one is ignored, and `ledger replay` keeps one current (the
reconciler's: tests/reconciler/test_reconcile.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.app.cli import cli
from ledger.capacity import CapacityMemory
from ledger.capacity_snapshot import (
    SNAPSHOT_NAME,
    code_version,
    decode,
    difference,
    encode,
    load_capacity,
    save_capacity,
)
from ledger.events import NewEvent
from ledger.replay import SNAPSHOT_EVERY, tied_snapshot
from ledger.store import Store
from ledger.verify import verify_snapshots

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
JOBS = ("alice/a", "bob/b", "carol/c")
PLACES = ({"zone": "us-central2-b", "accelerator": "v4-32", "pricing": "spot"},
          {"zone": "us-east5-a", "accelerator": "v5p-8", "pricing": "ondemand"},
          {"zone": "us-central2-b", "accelerator": "v4-32"})  # written before TPUs named their pricing


def _event(kind: str, place: dict, index: int, final: bool) -> tuple[str, dict]:
    if kind == "stockout":
        return "queued", {"reason": "no capacity", "placement": {**place, "index": index},
                          "api": {"code": "RESOURCE_EXHAUSTED", "kind": "stockout", "message": "none left"}}
    if kind == "quota":
        return "queued", {"reason": "quota", "placement": {**place, "index": index},
                          "api": {"code": "RESOURCE_EXHAUSTED", "kind": "quota", "message": "zone quota"}}
    if kind == "provisioning":
        return "provisioning", {"attempt": 1, "tpu": {"name": "n", **place, "placement": index}}
    if kind == "failed":
        return "failed", {"final": final}
    return kind, {}


events = st.lists(st.tuples(st.sampled_from(JOBS),
                            st.sampled_from(("stockout", "stockout", "quota", "provisioning", "submitted", "resumed",
                                             "rerun", "finished", "cancelled", "failed", "running")),
                            st.integers(0, len(PLACES) - 1), st.integers(0, 2), st.booleans(), st.integers(0, 900)),
                  max_size=60)


def rows_of(drawn: list[tuple]) -> list[tuple]:
    rows, t = [], T0
    for seq, (job, kind, place, index, final, gap) in enumerate(drawn, 1):
        t += timedelta(seconds=gap)
        type_, data = _event(kind, PLACES[place], index, final)
        rows.append((seq, job, seq, type_, t.isoformat(), json.dumps(data)))
    return rows


def state_of(memory: CapacityMemory) -> tuple:
    return (memory.position, memory.backoff_us, memory.backoff_max_us, memory.keys, memory.rounds, memory.ran_on,
            memory.moved)


@settings(max_examples=200, deadline=None)
@given(events, st.floats(0, 1), st.floats(0, 1))
def test_snapshot_plus_tail_is_the_full_fold(drawn, cut_at, second_at):
    """Cut anywhere (twice: a snapshot made from a snapshot + tail), go on from the decoded
    memory: the same stockouts, backoffs, rounds and last choices as a fold of every row."""
    rows = rows_of(drawn)
    full = CapacityMemory().apply_rows(rows)
    cut = int(cut_at * len(rows))
    second = cut + int(second_at * (len(rows) - cut))
    kept = decode(encode(CapacityMemory().apply_rows(rows[:cut])))
    assert kept is not None
    kept = decode(encode(kept.apply_rows(rows[cut:second])))
    assert kept is not None
    kept.apply_rows(rows[second:])
    assert state_of(kept) == state_of(full)
    assert difference(kept, full) is None


def test_what_is_not_a_capacity_snapshot_decodes_to_none():
    assert decode(b"TLU2" + b"\x80\x05N.") is None
    assert decode(b"TLC1not a pickle") is None


@pytest.fixture
def store(store_factory):
    store = store_factory()  # SQLite and PostgreSQL (tests/ledger/backends)
    for _seq, job, _version, type_, time, data in rows_of([(JOBS[i % 3], kind, i % 2, i % 3, False, 60)
                                                          for i, kind in enumerate(["stockout"] * 6 + ["provisioning"]
                                                                                   + ["stockout"] * 5)]):
        store.append(job, [NewEvent(type_, json.loads(data), time=time)])
    return store


def full_fold(store: Store, until: int | None = None) -> CapacityMemory:
    memory = CapacityMemory().apply_rows(store.fold_rows(0, until))
    memory.position = store.head() if until is None else until
    return memory


def test_load_capacity_starts_from_the_snapshot_and_folds_the_tail(store):
    save_capacity(store, full_fold(store, 8))
    (snap,) = [s for s in store.list_snapshots() if s.name == SNAPSHOT_NAME]
    assert snap.position == 8
    # The events after it are folded on top: the same memory as a fold of every event.
    assert state_of(load_capacity(store)) == state_of(full_fold(store))
    assert state_of(load_capacity(store, 10)) == state_of(full_fold(store, 10))
    # A memory from before the snapshot is a fold from the start.
    assert state_of(load_capacity(store, 5)) == state_of(full_fold(store, 5))
    assert [v.problem for v in verify_snapshots(store)] == [None]


def test_a_forged_snapshot_is_caught_by_verify_and_a_damaged_one_ignored(store):
    forged = full_fold(store, 8)
    forged.keys.clear()  # "no stockout anywhere": every job would be sent to an empty zone
    store.save_snapshot(tied_snapshot(store, SNAPSHOT_NAME, code_version(), 8, encode(forged)))
    (verdict,) = verify_snapshots(store)
    assert verdict.problem == "its keys differ from the events'"

    store.delete_snapshot(verdict.snapshot)
    save_capacity(store, full_fold(store, 8))
    (snap,) = store.list_snapshots()
    store.delete_snapshot(snap)
    store.save_snapshot(type(snap)(snap.name, snap.code_version, snap.position, snap.event_hash,
                                   snap.state[:-5] + b"xxxxx", snap.hash))  # its own hash no longer matches
    assert state_of(load_capacity(store)) == state_of(full_fold(store))


def test_ledger_replay_keeps_a_capacity_snapshot_beside_the_others(store):
    store.append("alice/a", [NewEvent("note", {"text": str(i)}) for i in range(SNAPSHOT_EVERY)])
    replayed = CliRunner().invoke(cli, ["--store", store.url, "replay", "--json"])
    assert replayed.exit_code == 0, replayed.output
    (snap,) = [s for s in store.list_snapshots() if s.name == SNAPSHOT_NAME]
    assert snap.position == store.head()
    assert state_of(load_capacity(store)) == state_of(full_fold(store))
    assert all(v.problem is None for v in verify_snapshots(store))
