"""Replay properties (hypothesis), on every store backend: the fold of any prefix continued
with the rest equals the fold of everything, and snapshot + tail equals a full replay."""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import fold, jsontext
from ledger.errors import UsageError
from ledger.events.schema import validate_event
from ledger.replay import (
    fold_into,
    fold_rows,
    load_lazy,
    load_state,
    load_state_apart,
    maybe_snapshot,
    resolve_until,
    save_snapshot,
)
from ledger.snapshots.columns import JobIndex, Names, codes_below
from ledger.snapshots.jobs import (
    PIECES,
    ROWS,
    Encoded,
    SnapshotPartError,
    code_version,
    encode_state,
    job_text,
)
from ledger.snapshots.lazy import LazyState, decode_lazy, decode_state
from ledger.snapshots.plain import load_plain
from ledger.store.base import Snapshot
from ledger.verify import verify_snapshots
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
    for until in (None, j):  # the lazy read of the same snapshot and tail, job by job
        assert_lazy_is(load_lazy(store, until=until), load_state(store, until=until, use_snapshot=False))
    assert_apart_is(store, load_state(store, use_snapshot=False), k)


def assert_apart_is(store, full: fold.LedgerState, snapshot_at: int) -> None:
    """load_state_apart (the reconciler's start) with every ended job put apart: what it
    keeps and what it puts apart are every job of `full`, each once and as `full` has it;
    a job the events after the snapshot touch is kept, whatever it is."""
    apart: dict[str, fold.JobState] = {}

    def put(job: fold.JobState, where) -> None:
        assert job.id not in apart and where.text() == job_text(job)
        apart[job.id] = job

    loaded = load_state_apart(store, lambda job: job.terminal, put)
    assert loaded is not None
    kept, index = loaded
    assert kept.position == full.position
    assert_lazy_is(index, full)  # the index at the head, as load_lazy gives it
    assert not kept.jobs.keys() & apart.keys() and {**kept.jobs, **apart} == full.jobs
    touched = {e.stream for e in store.read_all(after=snapshot_at)}
    assert not touched & apart.keys() and all(j.terminal for j in apart.values())
    # Told what `apart` and `put` read, it gives them those fields alone: the same jobs go apart.
    brief: dict[str, tuple[str, int]] = {}

    def put_fields(job, where) -> None:
        assert not isinstance(job, fold.JobState) and where.text() == job_text(full.jobs[job.id])
        brief[job.id] = (job.state, job.attempt)

    loaded = load_state_apart(store, lambda job: job.state in fold.TERMINAL, put_fields, reads=("id", "state", "attempt"))
    assert loaded is not None and loaded[0].jobs == kept.jobs
    assert brief == {i: (j.state, j.attempt) for i, j in apart.items()}


def assert_lazy_is(lazy, full: fold.LedgerState) -> None:
    """`lazy` (LazyState) answers what the full replay `full` says: every job,
    the index, the selections, and `ledger list --json`'s text of any selection. (The order
    of the jobs is no promise: every reader sorts what it shows.)"""
    assert lazy.position == full.position and sorted(lazy.index) == sorted(full.jobs)
    assert lazy.index == {i: JobIndex.of(j) for i, j in full.jobs.items()}
    assert as_data(lazy.decoded()) == as_data(full)
    owners = sorted({j.owner for j in full.jobs.values()})
    for owner in [None, *owners[:2]]:
        ids = lazy.select(owner=owner)
        assert ids == sorted(i for i, j in full.jobs.items() if owner is None or j.owner == owner)
        assert lazy.jobs(ids) == [full.jobs[i] for i in ids]
        assert jsontext.pretty_list(lazy.texts(ids)) == jsontext.pretty([full.jobs[i].to_dict() for i in ids])
    every = lazy.select()
    assert jsontext.pretty_list(lazy.texts(every[1::2])) == jsontext.pretty([full.jobs[i].to_dict() for i in every[1::2]])
    for state in sorted({j.state for j in full.jobs.values()})[:2]:
        assert lazy.select(state=state, owner=owners[0]) == sorted(
            i for i, j in full.jobs.items() if j.state == state and j.owner == owners[0])
    entries = [JobIndex.of(j) for j in full.jobs.values()]
    assert sorted(lazy.holders()) == sorted(x for x in entries if x.held is not None or x.wants_shared is not None)
    names = {n for x in entries for n in x.released[:1]}
    assert lazy.releasing(names) == {x.id for x in entries if names.intersection(x.released)}


def test_snapshot_encoding_round_trips_and_refuses_code(store_factory):
    import pickle

    store = store_factory()
    store.append("alice/a", [fold_event("submitted", spec={"x": 1}, spec_hash="ab" * 4, commit="c", path="p")])
    state = load_state(store)
    encoded = encode_state(state)
    parts = encoded.parts.get
    assert as_data(decode_state(encoded.manifest, parts)) == as_data(state)
    assert as_data(decode_state(encoded.manifest, parts, check=True)) == as_data(state)
    assert as_data(decode_lazy(encoded.manifest, parts).decoded()) == as_data(state)
    assert decode_state(b"TLS4" + pickle.dumps(fold.JobState("x/y")), parts) is None  # names a class: refused
    assert decode_state(b"not a snapshot", parts) is None
    assert decode_state(encoded.manifest[:-40], parts) is None  # cut short
    assert decode_state(b"TLS3" + encoded.manifest[4:], parts) is None  # the earlier encoding's magic: not this code's
    # Each reader fetches only the parts it reads; one that is missing or not the one named is refused.
    fetched: list[str] = []
    assert decode_lazy(encoded.manifest, lambda p: fetched.append(p) or parts(p)).select() == ["alice/a"]
    assert fetched == [PIECES]
    assert decode_state(encoded.manifest, lambda p: fetched.append(p) or parts(p)) is not None
    assert fetched == [PIECES, ROWS]
    other = encode_state(fold.LedgerState(state.position, {})).parts
    for reader in (decode_lazy, functools.partial(decode_state, check=True)):  # the readers of the pieces
        with pytest.raises(SnapshotPartError, match="part 'pieces' is missing"):
            reader(encoded.manifest, {ROWS: encoded.parts[ROWS]}.get)
        with pytest.raises(SnapshotPartError, match="part 'pieces' is not the one it names"):
            reader(encoded.manifest, {**encoded.parts, PIECES: other[PIECES]}.get)
    with pytest.raises(SnapshotPartError, match="part 'rows' is missing"):
        decode_state(encoded.manifest, {PIECES: encoded.parts[PIECES]}.get)


def test_snapshots_of_the_earlier_encoding_are_never_loaded(store_factory):
    """The encoding is part of a job-state snapshot's code version: a snapshot the fold's
    same code saved in another encoding is not even looked at (no warning, no misreading)."""
    assert code_version() != fold.code_version()
    store = store_factory()
    store.append("alice/a", [fold_event("submitted", spec={"x": 1}, spec_hash="ab" * 4, commit="c", path="p")])
    store.save_snapshot(Snapshot.seal("ledger", fold.code_version(), 1, store.hash_at(1), b"TLS1 earlier"))
    assert store.load_snapshot("ledger", code_version()) is None
    assert as_data(load_state(store)) == as_data(load_state(store, use_snapshot=False))


def test_an_index_that_lies_about_a_job_is_caught_by_verify(store_factory):
    """Lazy readers choose jobs by the snapshot's index: verify checks it says what each
    job's state says, not only the states."""
    import pickle

    store = two_jobs(store_factory)
    real = load_state(store)
    encoded = encode_state(real)
    position, names, columns, digests = pickle.loads(encoded.manifest[4:])
    ids, id_starts, owners, owner_of, states, state_of, *rest = columns
    assert ids == "alice/a\0bob/b\0" and states == ["pending"]  # the ids as one text
    columns = (ids, id_starts, owners, owner_of, ["pending", "finished"], _codes(1, 0), *rest)  # alice/a claimed finished
    lie = encoded._replace(manifest=b"TLS4" + pickle.dumps((position, names, columns, digests), protocol=5))
    assert decode_lazy(lie.manifest, lie.parts.get).select(state="finished") == ["alice/a"]  # what a lazy reader would believe
    insert_encoded(store_factory, store, lie)
    verdicts = verify_snapshots(store)
    assert [(v.snapshot.name, v.rebuilt, v.problem) for v in verdicts] == [
        ("ledger", True, "job alice/a: its columns do not say what its row says"), ("ledger.pieces", False, None),
        ("ledger.rows", False, None)]


def test_a_text_that_lies_about_a_job_is_caught_by_verify(store_factory):
    """`ledger list --json` writes the snapshot's text of each job: verify checks it says
    what the job's state says, not only the rows the full decoders load."""
    import pickle

    store = two_jobs(store_factory)
    real = load_state(store)
    encoded, forged = encode_state(real), finished(real, "alice/a")
    position, names, columns, digests = pickle.loads(encoded.manifest[4:])
    _, _, lied, lied_digests = pickle.loads(forged.manifest[4:])
    columns = (*columns[:6], *lied[6:8], *columns[8:])  # the places of the lie's texts
    digests = {**digests, PIECES: lied_digests[PIECES]}  # and the lie's pieces, their digest recomputed
    lie = Encoded(b"TLS4" + pickle.dumps((position, names, columns, digests), protocol=5),
                  {**encoded.parts, PIECES: forged.parts[PIECES]})
    assert decode_lazy(lie.manifest, lie.parts.get).job("alice/a").state == fold.FINISHED  # what `ledger list --json` would print
    assert decode_state(lie.manifest, lie.parts.get) == real  # what the reconciler would load
    insert_encoded(store_factory, store, lie)
    assert [v.problem for v in verify_snapshots(store)] == ["job alice/a: its text does not say what its row says", None, None]


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


# -- snapshots are checked, not trusted ------------------------------------------------------
BLOB = {"sqlite": "X'{hex}'", "postgres": "decode('{hex}', 'hex')"}  # a bytea/BLOB literal per backend


def _codes(*values: int) -> bytes:
    """A column of codes as a snapshot stores it (unsigned 32-bit, little-endian)."""
    return b"".join(v.to_bytes(4, "little") for v in values)


def insert_raw(store_factory, url: str, snap: Snapshot) -> None:
    """A snapshot row written with plain SQL, as someone with database access would."""
    blob = BLOB[store_factory.name].format(hex=snap.state.hex())
    store_factory.raw_execute(url, (
        "INSERT INTO snapshots (name, code_version, position, event_hash, state, hash) VALUES "
        f"('{snap.name}', '{snap.code_version}', {snap.position}, '{snap.event_hash}', {blob}, '{snap.hash}')"
    ))


def two_jobs(store_factory):
    from ledger.events import NewEvent

    store = store_factory()
    submitted = {"spec": {}, "spec_hash": "ab" * 8, "commit": "c1"}
    store.append("alice/a", [NewEvent("submitted", {**submitted, "path": "jobs/alice/a.yaml"})])
    store.append("bob/b", [NewEvent("submitted", {**submitted, "path": "jobs/bob/b.yaml"})])
    return store


def insert_encoded(store_factory, store, encoded: Encoded, position: int = 2) -> None:
    """A job-state snapshot and its parts written with plain SQL, each sealed (what a forger
    with database access can write)."""
    for name, data in [*((f"ledger.{p}", d) for p, d in encoded.parts.items()), ("ledger", encoded.manifest)]:
        insert_raw(store_factory, store.url, Snapshot.seal(name, code_version(), position, store.hash_at(position), data))


def finished(state: fold.LedgerState, job_id: str) -> Encoded:
    """`state` encoded with `job_id` claimed finished: what a forger would write."""
    lie = fold.LedgerState(state.position, dict(state.jobs))
    lie.jobs[job_id] = dataclasses.replace(lie.jobs[job_id], state=fold.FINISHED)
    return encode_state(lie)


def test_a_forged_snapshot_is_ignored_by_replay_and_named_by_verify(store_factory, caplog):
    store = two_jobs(store_factory)
    real = load_state(store)
    forged = Snapshot("ledger", code_version(), 2, store.hash_at(2), finished(real, "alice/a").manifest, "0" * 64)
    insert_raw(store_factory, store.url, forged)
    with caplog.at_level(logging.WARNING, logger="ledger.replay"):
        assert load_state(store).jobs["alice/a"].state == "pending"
    assert "ignoring snapshot 'ledger' at seq 2" in caplog.text and "does not match its hash" in caplog.text
    [verdict] = verify_snapshots(store)
    assert verdict.snapshot.position == 2 and "does not match its hash" in verdict.problem
    assert maybe_snapshot(store, real, every=10**6)  # a bad newest snapshot is replaced at once
    assert [v.problem for v in verify_snapshots(store)] == [None, None, None]
    assert load_state(store).jobs["alice/a"].state == "pending"


def test_a_snapshot_forged_with_consistent_hashes_is_caught_by_verify(store_factory):
    store = two_jobs(store_factory)
    real = load_state(store)
    # Everything a forger can recompute: the event hash from the chain, its own hash.
    insert_encoded(store_factory, store, finished(real, "alice/a"))
    verdict = verify_snapshots(store)[0]
    assert verdict.rebuilt and verdict.snapshot.name == "ledger"
    assert verdict.problem == "job alice/a: state is 'finished' in it, 'pending' from the events"


def test_a_snapshot_from_another_chain_is_not_used(store_factory, caplog):
    ours = two_jobs(store_factory)
    theirs = two_jobs(store_factory)  # the same jobs, but other event ids and times: another chain
    save_snapshot(theirs, load_state(theirs))
    snaps = theirs.list_snapshots()
    snap = next(s for s in snaps if s.name == "ledger")
    assert snap.intact and snap.event_hash == theirs.hash_at(2) != ours.hash_at(2)
    for each in snaps:
        insert_raw(store_factory, ours.url, each)
    with caplog.at_level(logging.WARNING, logger="ledger.replay"):
        assert as_data(load_state(ours)) == as_data(load_state(ours, use_snapshot=False))
    assert "made from another event at seq 2" in caplog.text
    past = Snapshot.seal("ledger", code_version(), 9, "ab" * 32, snap.state)  # past the head
    insert_raw(store_factory, ours.url, past)
    assert [v.problem for v in verify_snapshots(ours)] == [
        *["it was made from another event at seq 2 than the ledger holds"] * 3,
        "it folds up to seq 9, past the ledger's head",
    ]


def test_sound_snapshots_verify_and_other_codes_are_checked_by_hash_only(store_factory):
    store = two_jobs(store_factory)
    save_snapshot(store, load_state(store, until=1))
    save_snapshot(store, load_state(store))
    store.save_snapshot(Snapshot.seal("ledger", "other-code", 1, store.hash_at(1), b"opaque to this code"))
    verdicts = verify_snapshots(store)
    # By position, then code version (this code's is hex, so before "other-code").
    assert [(v.snapshot.position, v.rebuilt, v.problem) for v in verdicts] == [
        (1, True, None), (1, False, None), (1, False, None), (1, False, None), (2, True, None), (2, False, None),
        (2, False, None),
    ]


def test_a_detached_copy_never_sees_later_folds(store_factory):
    """The reconciler hands a detached copy to its snapshot saver and folds on: the copy must
    stay the state at its position (a job the state owns is changed in place otherwise)."""
    store = store_factory()
    store.append("alice/a", [fold_event("submitted", spec={"x": 1}, spec_hash="ab" * 4, commit="c", path="p")])
    state = fold_into(fold.LedgerState(), fold_rows(store, 0))  # owns alice/a: it made it
    copy = state.detached()
    before = as_data(copy)
    store.append("alice/a", [fold_event("queued", reason="waiting for capacity")])
    fold_into(state, fold_rows(store, copy.position))
    assert state.jobs["alice/a"].state == fold.QUEUED
    assert as_data(copy) == before


def test_holders_and_releases_are_read_from_the_columns_and_the_tail(store_factory):
    """`ledger tpus` chooses from `holders` and `releasing` (the snapshot's sparse columns,
    overridden by what the events after it say): they agree with the full replay's index
    before and after jobs take, release and share TPUs past the snapshot."""
    store = store_factory()
    own = {"name": "t-a1", "zone": "z"}
    pool = {"name": "pool", "zone": "z", "shared": True}
    shared_spec = {"spec": {"tpu": {"name": "pool", "shared": True}}, "spec_hash": "ab" * 8, "commit": "c", "path": "p"}
    plain_spec = {"spec": {}, "spec_hash": "ab" * 8, "commit": "c", "path": "p"}
    store.append("alice/a", [fold_event("submitted", **plain_spec), fold_event("provisioning", attempt=1, tpu=own)])
    store.append("bob/b", [fold_event("submitted", **shared_spec), fold_event("provisioning", attempt=1, tpu=pool)])
    store.append("carol/c", [fold_event("submitted", **plain_spec), fold_event("provisioning", attempt=1, tpu={"name": "t-c1"}),
                             fold_event("released", tpu={"name": "t-c1"}), fold_event("finished")])
    store.append("dave/d", [fold_event("submitted", **shared_spec)])  # waits for the pool
    save_snapshot(store, load_state(store))
    for tail in ([], [("alice/a", [fold_event("released", tpu=own), fold_event("finished")]),
                      ("bob/b", [fold_event("released", tpu=pool)]),
                      ("dave/d", [fold_event("provisioning", attempt=1, tpu=pool)]),
                      ("erin/e", [fold_event("submitted", **shared_spec)])]):
        for stream, events in tail:
            store.append(stream, events)
        full, lazy = load_state(store, use_snapshot=False), load_lazy(store)
        assert list(lazy._c.ids) == ["alice/a", "bob/b", "carol/c", "dave/d"]  # read from the snapshot
        entries = [JobIndex.of(j) for j in full.jobs.values()]
        key = operator.attrgetter("id")
        assert sorted(lazy.holders(), key=key) == sorted(
            (x for x in entries if x.held is not None or x.wants_shared is not None), key=key)
        for names in ({"pool"}, {"t-c1", "t-a1"}, {"nothing"}):
            assert lazy.releasing(names) == {x.id for x in entries if names.intersection(x.released)}
        assert_lazy_is(lazy, full)



def test_a_lazy_read_decodes_only_the_jobs_the_tail_touches(store_factory, monkeypatch):
    """load_lazy looks up each job the events after the snapshot touch where the snapshot
    keeps it (bisecting its ids), never by making every job's index: that made a read of
    118,956 jobs with 50 jobs in the tail take 12 s (stop 40's load_lazy)."""
    plain_spec = {"spec": {}, "spec_hash": "ab" * 8, "commit": "c", "path": "p"}
    store = store_factory()
    for n in range(40):
        store.append(f"alice/j{n:02d}", [fold_event("submitted", **plain_spec)])
    save_snapshot(store, load_state(store))
    store.append("alice/j07", [fold_event("provisioning", attempt=1, tpu={"name": "t-7"})])
    store.append("alice/new", [fold_event("submitted", **plain_spec)])
    decoded: list[str] = []
    real_job = LazyState.job

    def job(self, job_id):
        decoded.append(job_id)
        return real_job(self, job_id)

    def whole_index(self):
        raise AssertionError("load_lazy made every job's index")

    monkeypatch.setattr(LazyState, "job", job)
    monkeypatch.setattr(LazyState, "index", property(whole_index))
    lazy = load_lazy(store)
    assert decoded == ["alice/j07"]  # the one snapshot job the tail touches; the new job is folded from nothing
    assert lazy.holds("alice/new") and lazy.holds("alice/j39") and not lazy.holds("alice/nobody")
    monkeypatch.undo()
    assert_lazy_is(lazy, load_state(store, use_snapshot=False))


def test_releases_out_of_place_order_are_refused(store_factory):
    """`holders` finds a job's latest releases by bisecting the places they are listed by:
    a manifest listing them out of order is not read at all."""
    import pickle

    encoded = encode_state(load_state(two_jobs(store_factory)))
    position, names, columns, digests = pickle.loads(encoded.manifest[4:])
    for by in ((0, 1), (1, 0)):
        manifest = b"TLS4" + pickle.dumps((position, names, (*columns[:9], *Names.packed(["t-1", "t-2"]), _codes(*by)), digests), protocol=5)
        lazy = decode_lazy(manifest, encoded.parts.get)
        assert (lazy is not None) == (by == (0, 1))
    assert lazy is None


@given(codes=st.lists(st.integers(0, 2**32 - 1) | st.integers(0, 300), max_size=40), n=st.integers(0, 400))
def test_codes_are_checked_below_their_count_as_max_would(codes, n):
    """The manifest's owner and state codes are checked at C speed (`_codes_below`): it says
    what max() over them says, for a lab's few values and for more than 256."""
    assert codes_below(_codes(*codes), n) == (not codes or max(codes) < n)


@given(names=st.lists(st.text(st.characters(blacklist_characters="\0")), max_size=20))
def test_names_kept_as_one_text_read_back_as_a_list(names):
    """A snapshot's ids and releases are one text and the places they start (`_Names`):
    read back by place, by slice and whole they are the list they were."""
    kept = Names.unpacked(*Names.packed(names))
    assert kept is not None and len(kept) == len(names) and list(kept) == names
    assert [kept[i] for i in range(len(names))] == names == kept[:] and kept[1:3] == names[1:3]
    if names:
        assert kept[-1] == names[-1]
    with pytest.raises(IndexError):
        kept[len(names)]


def test_names_holding_a_nul_are_refused_and_a_bad_packing_is_not_read():
    with pytest.raises(ValueError, match="NUL"):
        Names.packed(["a/b", "c\0d"])
    text, starts = Names.packed(["a/b", "c/d"])
    assert Names.unpacked(text, starts) is not None
    for bad in ((text[:-1], starts), (text, starts[:-4]), (text, starts + b"\0"), (b"a/b", starts), (text, _codes(1, 4, 8))):
        assert Names.unpacked(*bad) is None


def test_ids_out_of_order_are_caught_by_verify_s_decoding(store_factory):
    """Lazy readers bisect the snapshot's ids without checking their order at every load:
    the check decode (`ledger verify`) refuses ids out of order, rows in the same order."""
    import pickle

    import lz4.block

    encoded = encode_state(load_state(two_jobs(store_factory)))
    lazy = decode_lazy(encoded.manifest, encoded.parts.get)
    rows = load_plain(lz4.block.decompress(encoded.parts[ROWS]))
    backwards = lz4.block.compress(pickle.dumps(rows[::-1], protocol=5))
    lie = LazyState(lazy.position, lazy._c._replace(ids=list(lazy._c.ids)[::-1]), lazy._chunks, lambda: backwards)
    assert list(lie.decoded().jobs) == ["bob/b", "alice/a"]  # what a reader without the check takes
    with pytest.raises(ValueError, match="not in order"):
        lie.decoded(check=True)


def test_names_read_by_place_many_times_are_split_once_and_read_the_same(monkeypatch):
    monkeypatch.setattr(Names, "_SPLIT_AFTER", 3)
    names = [f"u/j{i:02d}" for i in range(10)]
    kept = Names.unpacked(*Names.packed(names))
    assert [kept[i] for i in range(10)] == names and kept._list == names  # split after the third
    assert kept[-1] == "u/j09" and kept[2:4] == names[2:4] and list(kept) == names


def test_names_whose_starts_disagree_with_their_text_are_caught_by_verify_s_decoding(store_factory):
    """A name looked up by place is cut where its start says, a listing splits the text: a
    manifest where the two disagree is refused by the check decode (`ledger verify`)."""
    import pickle

    encoded = encode_state(load_state(two_jobs(store_factory)))
    position, names, columns, digests = pickle.loads(encoded.manifest[4:])
    assert decode_state(encoded.manifest, encoded.parts.get, check=True) is not None
    skewed = (columns[0], _codes(0, 7, 14), *columns[2:])  # "alice/a\0" is 8 long: the second id read as "\0bob/b"
    lie = b"TLS4" + pickle.dumps((position, names, skewed, digests), protocol=5)
    lazy = decode_lazy(lie, encoded.parts.get)
    assert lazy is not None and lazy._c.ids[1] == "\0bob/b" and list(lazy._c.ids) == ["alice/a", "bob/b"]
    assert decode_state(lie, encoded.parts.get, check=True) is None
    assert not lazy._c.ids.consistent()


def test_the_collector_is_off_while_any_thread_folds_and_back_on_when_the_last_leaves():
    """Two threads in no_cyclic_gc, leaving in the order they came: the first one's exit
    used to turn the collector on under the second, or the second's to leave it off."""
    import gc
    import threading

    from ledger.snapshots.plain import no_cyclic_gc

    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def second() -> None:
        with no_cyclic_gc():
            inside.set()
            leave.wait(10)

    with no_cyclic_gc():
        other = threading.Thread(target=second)
        other.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread still folds
    leave.set()
    other.join(10)
    assert gc.isenabled()
