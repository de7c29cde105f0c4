"""Checkpoints on the events' topic (the official Pub/Sub emulator): an auditor's subscription
receives them signed and checkable; the ledger's own subscribers pass over them quietly."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.checkpoints import NAMESPACE, AllowedSigners, Signed, SigningKey, check, signers
from ledger.checkpoints.check import SOUND
from ledger.events import NewEvent
from ledger.fanout import pubsub
from ledger.fanout.publisher import drain
from ledger.fanout.subscriber import PubSubSubscriber
from ledger.store import open_store
from reconciler.keys import ensure_key


def test_a_checkpoint_on_the_topic_is_for_auditors_not_for_event_subscribers(emulator, names, store_url, tmp_path: Path,
                                                                              caplog) -> None:
    topic, sub_name = names
    config = pubsub.config_from_env(None, topic)
    store = open_store(store_url, create=True)
    store.append("alice/a", [NewEvent("note", {"text": f"n{i}"}) for i in range(3)])
    events = PubSubSubscriber(sub_name, topic=topic)
    audit = sub_name + "-audit"
    pubsub.ensure_all(config, (audit,))
    key = tmp_path / "id_ecdsa"
    ensure_key(key)
    try:
        result = CliRunner().invoke(cli, ["--store", store_url, "checkpoint", "--topic", topic, "--ssh-key", str(key),
                                          "--signer", "recon-a"])
        assert result.exit_code == 0, result.output
        assert f"published to Pub/Sub {config.topic_path}" in result.stdout
        drain(store, topic=topic)

        # The event subscriber gets the three events and nothing else, without a warning.
        got: list = []
        with caplog.at_level(logging.WARNING, logger="ledger.fanout"):
            for _ in range(30):
                got += events.receive(1.0)
                if len(got) >= 3 and events.received >= 3:
                    break
        assert [e.data["text"] for e in got] == ["n0", "n1", "n2"]
        assert "foreign message" not in caplog.text

        # The auditor's subscription holds the checkpoint, which verifies against the ledger.
        client = pubsub.subscriber_client(config)
        path = config.subscription_path(audit)
        messages = []
        for _ in range(10):
            response = client.pull(request={"subscription": path, "max_messages": 10}, timeout=30)
            messages += [m.message for m in response.received_messages]
            if response.received_messages:
                client.acknowledge(request={"subscription": path,
                                            "ack_ids": [m.ack_id for m in response.received_messages]})
            if any(m.attributes.get("kind") == "checkpoint" for m in messages):
                break
        client.close()
        (message,) = [m for m in messages if m.attributes.get("kind") == "checkpoint"]
        assert dict(message.attributes) == {"kind": "checkpoint", "seq": "3", "signer": "recon-a"}
        signed = Signed.from_json(json.loads(message.data), "pubsub")
        allowed = signers.parse(AllowedSigners(()).line_for("recon-a", SigningKey.load(key).public_key, NAMESPACE))
        verdict = check(signed, head=store.head(), hash_at=store.hash_at, allowed=allowed)
        assert verdict.kind == SOUND and verdict.checkpoint.seq == 3
    finally:
        events.close()
        store.close()
