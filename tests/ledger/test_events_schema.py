"""Canonical encoding, ids, and the event schema (plus its fast compiled checker)."""

from __future__ import annotations

import json
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from ledger.events import (
    EVENT_TYPES,
    GENESIS_HASH,
    NewEvent,
    body_text,
    canonical,
    chain_hash,
    dumps,
    event_id,
    random_id,
    seal,
)
from ledger.schema import RowChecker, _fast_part, compile_schema, load_schema, validate_event
from tests.ledger.strategies import data_for, json_value, text


@given(value=st.dictionaries(text, json_value, max_size=4), stream=text.filter(bool), type_=st.sampled_from(EVENT_TYPES),
       causation=st.none() | text, seq=st.integers(1, 2**40))
def test_body_text_is_the_canonical_encoding(value, stream, type_, causation, seq):
    envelope = {"seq": seq, "stream": stream, "version": 3, "type": type_, "time": "2026-01-01T00:00:00.000000Z",
                "actor": {"kind": "cli", "name": stream}, "id": random_id(), "causation": causation, "data": value,
                "prev_hash": GENESIS_HASH}
    body = body_text(seq, stream, 3, type_, envelope["time"], dumps(envelope["actor"]), envelope["id"], causation, dumps(value), GENESIS_HASH)
    assert body.encode() == canonical(envelope)
    assert json.loads(body) == envelope
    assert dumps(json.loads(dumps(value))) == dumps(value)  # stable through storage


def test_seal_hash_matches_chain_hash_and_is_sensitive():
    e = seal(NewEvent("note", {"text": "x"}), seq=1, stream="a/b", version=1, prev_hash=GENESIS_HASH, event_id_=random_id())
    assert e.hash == chain_hash(GENESIS_HASH, e.unhashed()) == e.expected_hash()
    assert chain_hash(GENESIS_HASH, {**e.unhashed(), "data": {"text": "y"}}) != e.hash


def test_ids_are_deterministic_uuids():
    a = event_id("alice/a", "commit:1")
    assert a == event_id("alice/a", "commit:1") != event_id("alice/b", "commit:1")
    assert uuid.UUID(a).version == 5 and str(uuid.UUID(a)) == a
    r = random_id()
    assert uuid.UUID(r).version == 4 and str(uuid.UUID(r)) == r and r != random_id()


def test_schema_is_valid_2020_12_and_covers_every_type():
    schema = load_schema("event")
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")
    assert set(schema["properties"]["type"]["enum"]) == set(EVENT_TYPES)
    assert {f"data_{t}" for t in EVENT_TYPES} <= set(schema["$defs"])


def test_schema_strict_on_envelope_and_key_fields():
    good = seal(NewEvent("failed", {"kind": "grpc", "message": "DEADLINE_EXCEEDED", "extra": 1}),
                seq=1, stream="alice/a", version=1, prev_hash=GENESIS_HASH, event_id_=random_id()).to_dict()
    assert validate_event(good) == []
    assert validate_event({**good, "surprise": 1})
    assert validate_event({**good, "data": {"kind": "gremlins"}})
    assert validate_event({**good, "time": "2026-01-01 00:00"})
    assert validate_event({**good, "type": "exploded"})
    assert validate_event({**good, "type": "provisioning", "data": {"attempt": -1}})
    assert validate_event({**good, "type": "action_outcome", "data": {"action_id": "a", "ok": False}})
    assert validate_event({k: v for k, v in good.items() if k != "prev_hash"})


@settings(max_examples=300)
@given(type_=st.sampled_from(EVENT_TYPES), data=st.data())
def test_compiled_checker_agrees_with_jsonschema(type_, data):
    schema = load_schema("event")
    validator = Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/data_{type_}"})
    valid = data.draw(data_for(type_))
    mutated = data.draw(st.dictionaries(st.sampled_from(["attempt", "kind", "tpu", "ok", "action_id", "reason", "spec", "restarts", "old_head"]),
                                        json_value, max_size=3))
    for value in (valid, {**valid, **mutated}, mutated, data.draw(json_value)):
        assert (_fast_part("data", type_)(value) is None) == validator.is_valid(value), (type_, value)


def test_compile_schema_refuses_keywords_it_does_not_know():
    import pytest

    from ledger.schema import Unsupported

    with pytest.raises(Unsupported):
        compile_schema({"oneOf": [{"type": "string"}]}, {})


def test_row_checker_names_the_field():
    checker = RowChecker()
    row = (1, "alice/a", 1, "failed", "2026-01-01T00:00:00.000000Z", '{"kind":"cli","name":"x"}', random_id(), None,
           '{"kind":"grpc"}', GENESIS_HASH, "a" * 64)
    assert checker.check(row) is None
    assert "kind" in checker.check(row[:8] + ('{"kind":"oops"}',) + row[9:])
    assert checker.check(row[:1] + ("no-slash",) + row[2:]).startswith("stream")
    assert checker.check(row[:4] + ("yesterday",) + row[5:]).startswith("time")
    assert checker.check(row[:5] + ('{"kind":"robot","name":"x"}',) + row[6:]).startswith("actor")
