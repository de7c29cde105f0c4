"""Canonical encoding, ids, and the event schema generated from the event classes."""

from __future__ import annotations

import functools
import json
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from ledger.events import (
    EVENT_TYPES,
    GENESIS_HASH,
    EventDataError,
    NewEvent,
    body_text,
    canonical,
    dumps,
    event_id,
    format_time,
    now,
    parse_time,
    random_id,
    row_hash,
    seal,
)
from ledger.events.schema import RowChecker, event_schema, schema_text, validate_event
from ledger.resources import load_schema, schema_file
from ledger.store.postgres.recorder import splice_parts
from tests.ledger.strategies import data_for, json_value, text


@given(value=st.dictionaries(text, json_value, max_size=4), stream=text.filter(bool), type_=st.sampled_from(EVENT_TYPES),
       causation=st.none() | text, seq=st.integers(1, 2**40), version=st.integers(1, 2**40))
def test_body_text_is_the_canonical_encoding(value, stream, type_, causation, seq, version):
    envelope = {"seq": seq, "stream": stream, "version": version, "type": type_, "time": "2026-01-01T00:00:00.000000Z",
                "actor": {"kind": "cli", "name": stream}, "id": random_id(), "causation": causation, "data": value,
                "prev_hash": GENESIS_HASH}
    columns = (stream, type_, envelope["time"], dumps(envelope["actor"]), envelope["id"], causation, dumps(value))
    body = body_text(seq, stream, version, type_, envelope["time"], columns[3], envelope["id"], causation, columns[6], GENESIS_HASH)
    assert body.encode() == canonical(envelope)
    assert json.loads(body) == envelope
    assert dumps(json.loads(dumps(value))) == dumps(value)  # stable through storage
    # What PostgreSQL splices together under its lock is the same text.
    pre, post = splice_parts(*columns)
    assert f'{pre}{GENESIS_HASH}","seq":{seq}{post}{version}}}' == body


def test_seal_hash_is_the_chained_body_and_is_sensitive():
    e = seal(NewEvent("note", {"text": "x"}), seq=1, stream="a/b", version=1, prev_hash=GENESIS_HASH, event_id_=random_id())
    assert e.hash == e.expected_hash() == row_hash(GENESIS_HASH, canonical({k: v for k, v in e.to_dict().items() if k != "hash"}).decode())
    assert seal(NewEvent("note", {"text": "y"}, time=e.time), seq=1, stream="a/b", version=1, prev_hash=GENESIS_HASH,
                event_id_=e.id).hash != e.hash


def test_ids_are_deterministic_uuids():
    a = event_id("alice/a", "commit:1")
    assert a == event_id("alice/a", "commit:1") != event_id("alice/b", "commit:1")
    assert uuid.UUID(a).version == 5 and str(uuid.UUID(a)) == a
    r = random_id()
    assert uuid.UUID(r).version == 4 and str(uuid.UUID(r)) == r and r != random_id()


def test_an_id_is_spelled_as_every_earlier_version_spelled_it():
    # Stored ids are what makes a retried append a no-op: the same key must give the same
    # id across releases (these were made by the strftime-era code, before the faster spelling).
    assert event_id("s0/j", "k0") == "93172b9d-ab73-545f-8cb8-5ad015e92072"
    assert event_id("s1/j", "k1") == "c02ec549-28f7-5902-b466-cd98704f1a93"
    assert event_id("s2999/j", "k2999") == "2c8a0ca1-576f-5ac9-a224-c9dd571b8d02"


@settings(max_examples=300, deadline=None)
@given(stream=st.text(min_size=1, max_size=40), key=st.text(max_size=40))
def test_ids_are_rfc_4122_and_keep_the_streams_prefix(stream, key):
    keyed, fresh = uuid.UUID(event_id(stream, key)), uuid.UUID(random_id(stream))
    assert (keyed.version, fresh.version) == (5, 4)
    assert keyed.variant == fresh.variant == uuid.RFC_4122
    assert str(keyed)[:9] == str(fresh)[:9]  # the stream's 4 bytes lead both (ids of a stream sit together)
    assert uuid.UUID(random_id()).variant == uuid.RFC_4122


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7))])))
def test_times_are_spelled_as_strftime_spelled_them(moment):
    assert format_time(moment) == moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert parse_time(format_time(moment)) == moment
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", now())


def test_the_published_schema_is_the_one_generated_from_the_classes():
    # If this fails, run `make schemas` and commit the file.
    assert schema_file("event").read_text(encoding="utf-8") == schema_text()


def test_schema_is_valid_2020_12_and_covers_every_type():
    schema = load_schema("event")
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")
    assert set(schema["properties"]["type"]["enum"]) == set(EVENT_TYPES)
    assert {f"data_{t}" for t in EVENT_TYPES} <= set(schema["$defs"])
    assert schema["additionalProperties"] is False and set(schema["required"]) == set(schema["properties"])


def test_verify_is_strict_on_envelope_and_key_fields():
    good = seal(NewEvent("failed", {"kind": "grpc", "message": "DEADLINE_EXCEEDED"}),
                seq=1, stream="alice/a", version=1, prev_hash=GENESIS_HASH, event_id_=random_id()).to_dict()
    assert validate_event(good) == []
    assert validate_event({**good, "data": {**good["data"], "from_a_newer_writer": 1}}) == []  # read leniently
    assert validate_event({**good, "surprise": 1})
    assert validate_event({**good, "data": {"kind": "gremlins"}})
    assert validate_event({**good, "time": "2026-01-01 00:00"})
    assert validate_event({**good, "type": "exploded"})
    assert validate_event({**good, "type": "provisioning", "data": {"attempt": -1}})
    assert validate_event({**good, "type": "action_outcome", "data": {"action_id": "a", "ok": False}})
    assert validate_event({k: v for k, v in good.items() if k != "prev_hash"})


@functools.cache
def _data_validator(type_: str) -> Draft202012Validator:
    schema = event_schema()
    return Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/data_{type_}"})


def _schema_verdict(type_: str, data: object) -> bool:
    return _data_validator(type_).is_valid(data)


def _no_integral_floats(value: object) -> bool:
    """JSON Schema's `integer` takes 1.0; the classes (and so verify) take only 1. Verify may
    be stricter than the schema there, never looser."""
    if isinstance(value, float):
        return not value.is_integer()
    if isinstance(value, dict):
        return all(map(_no_integral_floats, value.values()))
    if isinstance(value, list):
        return all(map(_no_integral_floats, value))
    return True


@settings(max_examples=200, deadline=None)
@given(type_=st.sampled_from(EVENT_TYPES), data=st.data())
def test_the_schema_and_verify_agree(type_, data):
    """A consumer validating with the published schema reaches verify's verdict."""
    valid = data.draw(data_for(type_))
    mutated = data.draw(st.dictionaries(st.sampled_from(["attempt", "kind", "tpu", "ok", "action_id", "reason", "spec",
                                                         "restarts", "old_head", "hosts", "rule", "error"]),
                                        json_value, max_size=3))
    checker = RowChecker()
    for i, value in enumerate((valid, {**valid, **mutated}, mutated, data.draw(json_value))):
        row = (1, "alice/a", 1, type_, "2026-01-01T00:00:00.000000Z", '{"kind":"cli","name":"x"}', random_id(), None,
               dumps(value), GENESIS_HASH, "a" * 64)
        verify_ok = checker.check(row) is None
        assert verify_ok <= _schema_verdict(type_, value), (type_, value)
        if _no_integral_floats(value):
            assert verify_ok == _schema_verdict(type_, value), (type_, value)
        if i == 0:
            assert verify_ok, (type_, value, checker.check(row))


def test_row_checker_names_the_field():
    checker = RowChecker()
    row = (1, "alice/a", 1, "failed", "2026-01-01T00:00:00.000000Z", '{"kind":"cli","name":"x"}', random_id(), None,
           '{"kind":"grpc"}', GENESIS_HASH, "a" * 64)
    assert checker.check(row) is None
    assert "kind" in checker.check(row[:8] + ('{"kind":"oops"}',) + row[9:])
    assert checker.check(row[:1] + ("no-slash",) + row[2:]).startswith("stream")
    assert checker.check(row[:4] + ("yesterday",) + row[5:]).startswith("time")
    assert checker.check(row[:4] + (row[4] + "\n",) + row[5:]).startswith("time")  # `$` is the end, as JSON Schema reads it
    assert checker.check(row[:6] + (row[6].upper(),) + row[7:]).startswith("id")
    assert checker.check(row[:5] + ('{"kind":"robot","name":"x"}',) + row[6:]).startswith("actor")
    assert checker.check(row[:8] + ("{nope",) + row[9:]).startswith("data: not JSON")
    # what replay's decoder refuses, verify refuses (json.loads would read NaN and 1e999);
    # no writer of ours makes them: its encoder writes null for both
    for bad in ('{"kind":"grpc","code":NaN}', '{"kind":"grpc","code":1e999}'):
        assert checker.check(row[:8] + (bad,) + row[9:]).startswith("data: not JSON")
    assert dumps({"code": float("nan")}) == '{"code":null}'


def test_new_event_refuses_what_verify_would_refuse():
    for type_, data in [("failed", {"kind": "exhausted", "final": True}),  # the legacy spelling: read, never written
                        ("failed", {"message": "no kind"}),
                        ("provisioned", {"hosts": [{"worker": 0, "ip": "10.0.0.1"}]}),  # undeclared, even nested
                        ("note", {"i": 1}),
                        ("action_outcome", {"action_id": "a", "ok": False}),
                        ("exploded", {}),
                        # a NUL would split a snapshot's packed names; a newline a line of `ledger tpus`
                        ("provisioning", {"attempt": 1, "tpu": {"name": "tpu\x00-1"}}),
                        ("provisioning", {"attempt": 1, "tpu": {"name": "tpu\n-1"}})]:
        with pytest.raises(EventDataError):
            NewEvent(type_, data)
    # a given time is written in the one spelling verify accepts, or refused (the store
    # stamps its own when none is given)
    for time_ in ("yesterday", "2026-01-01T00:00:00", "2026-01-01T00:00:00.000000Z\n", 1767225600):
        with pytest.raises(EventDataError, match="invalid time"):
            NewEvent("note", {"text": "x"}, time=time_)
    for time_ in ("2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:00Z", "2026-01-01T02:00:00+02:00"):
        assert NewEvent("note", {"text": "x"}, time=time_).time == "2026-01-01T00:00:00.000000Z"
    with pytest.raises(EventDataError, match="cannot carry"):
        from ledger.events.data import Queued

        NewEvent("failed", Queued(reason="x"))
