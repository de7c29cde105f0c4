"""Replay properties (hypothesis), on every store backend: the fold of any prefix continued
with the rest equals the fold of everything, and snapshot + tail equals a full replay."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import fold
from ledger.errors import UsageError
from ledger.events.schema import validate_event
from ledger.replay import (
    decode_state,
    encode_state,
    fold_into,
    fold_rows,
    load_state,
    maybe_snapshot,
    resolve_until,
    save_snapshot,
)
from tests.ledger.strategies import event_batches

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def filled(store_factory, batches):
    store = store_factory()
    for stream, events in batches:
        store.append(stream, events)
    return store


def as_data(state: fold.LedgerState) -> tuple:
    return state.position, {k: v.to_dict() for k, v in state.jobs.items()}


@PROPERTY
@given(batches=event_batches(), cut=st.floats(0, 1))
def test_prefix_then_rest_equals_full_replay(store_factory, batches, cut):
    store = filled(store_factory, batches)
    for event in store.read_all():  # every appended event matches the schema
        assert validate_event(event.to_dict()) == []
    head = store.head()
    k = int(head * cut)
    full = load_state(store, use_snapshot=False)
    assert as_data(full) == as_data(fold.replay(store.read_all()))  # the reference fold
    prefix = load_state(store, until=k, use_snapshot=False)
    assert prefix.position == k
    assert as_data(fold_into(prefix, fold_rows(store, k))) == as_data(full)


@PROPERTY
@given(batches=event_batches(), cut=st.floats(0, 1), earlier=st.floats(0, 1))
def test_snapshot_plus_tail_equals_full_replay(store_factory, batches, cut, earlier):
    store = filled(store_factory, batches)
    head = store.head()
    k = int(head * cut)
    save_snapshot(store, load_state(store, until=k, use_snapshot=False))
    assert as_data(load_state(store)) == as_data(load_state(store, use_snapshot=False))
    j = int(k * earlier)  # before the snapshot: it must not be used
    assert as_data(load_state(store, until=j)) == as_data(load_state(store, until=j, use_snapshot=False))


def test_snapshot_encoding_round_trips_and_refuses_code(store_factory):
    import pickle

    store = store_factory()
    store.append("alice/a", [fold_event("submitted", spec={"x": 1}, spec_hash="ab" * 4, commit="c", path="p")])
    state = load_state(store)
    assert as_data(decode_state(encode_state(state))) == as_data(state)
    assert decode_state(b"TLS1" + pickle.dumps(fold.JobState("x/y"))) is None  # names a class: refused
    assert decode_state(b"not a snapshot") is None


def test_snapshot_policy(store_factory):
    store = store_factory()
    for i in range(5):
        store.append("alice/a", [fold_event("note", text=str(i))])
    state = load_state(store)
    assert not maybe_snapshot(store, state, every=10)
    assert maybe_snapshot(store, state, every=5)
    assert not maybe_snapshot(store, state, every=5)  # nothing new since


def test_until_accepts_seq_and_time(store_factory):
    from ledger.events import NewEvent

    store = store_factory()
    store.append("alice/a", [NewEvent("note", {}, time=f"2026-01-0{d}T00:00:00.000000Z") for d in (1, 2, 3)])
    assert resolve_until(store, "2") == 2
    assert resolve_until(store, "2026-01-02T12:00:00Z") == 2
    assert resolve_until(store, "2026-01-02T01:00:00+02:00") == 1
    assert resolve_until(store, None) is None
    with pytest.raises(UsageError):
        resolve_until(store, "yesterday")
    with pytest.raises(UsageError):
        resolve_until(store, "2026-01-02T00:00:00")


def fold_event(type_: str, **data):
    from ledger.events import NewEvent

    return NewEvent(type_, data)
