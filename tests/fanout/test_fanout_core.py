"""Pure parts of the fan-out: envelope encoding, duplicate detection, notification plans."""

from __future__ import annotations

import pytest

from ledger.events import GENESIS_HASH, Event, NewEvent, seal
from ledger.fanout.envelope import Deduper, decode, encode, matches
from ledger.fanout.notify_plan import plan, slack_payload
from ledger.spec.policy import parse_policy


def make(seq: int, stream: str = "alice/train", version: int | None = None, type_: str = "note", **data) -> Event:
    return seal(NewEvent(type_, data, key=f"k{seq}"), seq=seq, stream=stream, version=version or seq,
                prev_hash=GENESIS_HASH, event_id_=f"id-{stream}-{seq}")


def test_envelope_round_trips_with_attributes_and_ordering_key() -> None:
    event = make(7, type_="action_intent", action_id="a1", action="provision", params={"value": 1.5, "name": "ü"})
    msg = encode(event)
    assert msg.ordering_key == "alice/train"
    assert msg.attributes == {"type": "action_intent", "stream": "alice/train", "seq": "7", "id": event.id}
    back = decode(msg.data, msg.attributes)
    assert back == event and back.expected_hash() == back.hash


def test_decode_refuses_foreign_messages() -> None:
    with pytest.raises(ValueError):
        decode(b'{"hello": 1}')
    msg = encode(make(1))
    with pytest.raises(ValueError):
        decode(msg.data, {**msg.attributes, "id": "other"})


def test_deduper_drops_repeated_ids_and_republished_suffixes() -> None:
    dedup = Deduper(max_ids=2)
    first = [make(i) for i in range(1, 6)]
    assert [dedup.is_new(e) for e in first] == [True] * 5
    # a publisher restarted from its cursor republishes 3..5: dropped though the ids left the LRU
    assert [dedup.is_new(e) for e in first[2:]] == [False] * 3
    assert dedup.is_new(make(6)) and dedup.is_new(make(1, stream="bob/x"))
    assert dedup.dropped == 3


def test_matches_filters_by_type_and_job() -> None:
    event = make(1, type_="failed", kind="exit")
    assert matches(event, None, None)
    assert matches(event, frozenset({"failed"}), frozenset({"alice/train"}))
    assert not matches(event, frozenset({"finished"}), None)
    assert not matches(event, None, frozenset({"bob/x"}))


POLICY = """\
notify:
  webhook: http://hooks.example/1
  owners:
    alice: {email: alice@example.org}
    bob: {email: bob@example.org, opt_out: true}
    carol: {email: carol@example.org, opt_out: [email]}
"""


def test_plan_follows_types_owners_and_opt_outs() -> None:
    policy = parse_policy(POLICY).policy.notify
    failed = make(3, stream="alice/train", type_="failed", kind="exit", exit_code=1)
    channels = [(d.channel, d.target) for d in plan(failed, policy, webhook=policy.webhook, email=True)]
    assert channels == [("webhook", "http://hooks.example/1"), ("email", "alice@example.org")]
    assert plan(make(4, stream="alice/train", type_="started"), policy, webhook=policy.webhook, email=True) == []
    assert plan(make(5, stream="bob/x", type_="preempted"), policy, webhook=policy.webhook, email=True) == []
    carol = plan(make(6, stream="carol/y", type_="finished"), policy, webhook=policy.webhook, email=True)
    assert [d.channel for d in carol] == ["webhook"]
    nobody = plan(make(7, stream="dave/z", type_="cancelled"), policy, webhook=None, email=True)
    assert nobody == []  # no address for dave, no webhook in use


def test_slack_payload_has_text_and_names_the_job() -> None:
    payload = slack_payload(make(9, stream="alice/train", type_="preempted", reason="TPU node-1 is PREEMPTED", attempt=2))
    assert payload["text"] == "[tpu-ledger] alice/train: preempted (reason: TPU node-1 is PREEMPTED, attempt: 2)"
    assert payload["blocks"][0]["type"] == "section"
