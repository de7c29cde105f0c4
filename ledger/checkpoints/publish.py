"""Sign the ledger's head and publish it outside the ledger: a git ref and Pub/Sub.

`Checkpointer.publish()` makes one checkpoint when the head moved since the last one it
published, and hands it to every sink. `CheckpointThread` does that every N seconds beside
a long-running command, and once more when it stops, so the last events a reconciler wrote
before shutting down are covered too. A sink that fails (the hub unreachable) is logged and
retried at the next interval: publishing checkpoints never stops the reconciler.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from ledger.checkpoints.gitref import CheckpointRepo
from ledger.checkpoints.note import Checkpoint, Signed, pubsub_message, sign
from ledger.checkpoints.sshsig import SigningKey
from ledger.fanout import pubsub
from ledger.store import open_store
from ledger.store.base import Reader

log = logging.getLogger("tpu_ledger.checkpoints")


class Sink(Protocol):
    name: str

    def send(self, signed: Signed, checkpoint: Checkpoint) -> str:
        """Publish; returns where it went (a commit id, a message id)."""
        ...

    def close(self) -> None: ...


class GitSink:
    """To a ref of the jobs repository (`refs/ledger/checkpoints` by default)."""

    def __init__(self, url: str, ref: str) -> None:
        self.repo = CheckpointRepo(url, ref)
        self.name = f"git {ref} at {self.repo.shown}"

    def send(self, signed: Signed, checkpoint: Checkpoint) -> str:
        return self.repo.publish(signed, f"checkpoint: seq {checkpoint.seq} by {checkpoint.signer}\n")

    def close(self) -> None:
        self.repo.close()


class PubSubSink:
    """To the events' Pub/Sub topic, as a message with attribute kind=checkpoint."""

    def __init__(self, config: pubsub.PubSubConfig) -> None:
        self.config = config
        self.name = f"Pub/Sub {config.topic_path}"
        self._client: Any = None

    def send(self, signed: Signed, checkpoint: Checkpoint) -> str:
        if self._client is None:
            self._client = pubsub.publisher_client(self.config)
            pubsub.ensure_topic(self._client, self.config)
        pubsub.publish_batch(self._client, self.config, [pubsub_message(signed, checkpoint)])
        return self.config.topic_path

    def close(self) -> None:
        if self._client is not None:
            self._client.transport.close()
            self._client = None


@dataclass
class Outcome:
    signed: Signed
    checkpoint: Checkpoint
    sent: dict[str, str] = field(default_factory=dict)  # sink name -> where it went
    failed: dict[str, str] = field(default_factory=dict)  # sink name -> why not

    def to_dict(self) -> dict:
        return {**self.checkpoint.to_dict(), "sent": self.sent, "failed": self.failed}


class Checkpointer:
    """Signs `store`'s head as `signer` with `key` and sends it to `sinks`."""

    def __init__(self, store: Reader, key: SigningKey, signer: str, sinks: Sequence[Sink],
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.store, self.key, self.signer, self.sinks, self.clock = store, key, signer, list(sinks), clock
        self.last: tuple[int, str] | None = None  # the head every sink has received

    def make(self) -> tuple[Signed, Checkpoint] | None:
        """A signed checkpoint of the head now; None for an empty ledger (nothing to vouch for)."""
        head = self.store.head()
        hash_ = self.store.hash_at(head) if head else None
        if not head or hash_ is None:
            return None
        signed = sign(self.key, seq=head, hash=hash_, signer=self.signer, when=self.clock())
        return signed, Checkpoint.parse(signed.body)

    def publish(self, *, force: bool = False) -> Outcome | None:
        """Sign and send the head, unless every sink already has it (`force`: anyway)."""
        made = self.make()
        if made is None:
            return None
        signed, checkpoint = made
        if not force and self.last == (checkpoint.seq, checkpoint.hash):
            return None
        outcome = Outcome(signed, checkpoint)
        for sink in self.sinks:
            try:
                outcome.sent[sink.name] = sink.send(signed, checkpoint)
            except Exception as exc:  # noqa: BLE001 - one sink down must not stop the others
                outcome.failed[sink.name] = str(exc)
        if not outcome.failed:
            self.last = (checkpoint.seq, checkpoint.hash)
        return outcome

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class CheckpointThread:
    """Publishes a checkpoint every `every` seconds (when the head moved) and at `close()`.

    The thread opens its own store (connections stay in the thread that made them)."""

    def __init__(self, store_url: str, make: Callable[[Reader], Checkpointer], every: float) -> None:
        self._stop = threading.Event()
        self._every = every
        self._store_url, self._make = store_url, make
        self.outcomes: list[Outcome] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="checkpoints", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            store = open_store(self._store_url)
            checkpointer = self._make(store)
        except Exception as exc:  # noqa: BLE001 - reported by close(); the reconciler goes on
            self.error = exc
            log.error("checkpoints disabled: %s", exc)
            return
        try:
            while not self._stop.wait(self._every if self._every > 0 else None):
                self._publish(checkpointer)
            self._publish(checkpointer)  # at shutdown: after the last events were written
        finally:
            checkpointer.close()
            store.close()

    def _publish(self, checkpointer: Checkpointer) -> None:
        try:
            outcome = checkpointer.publish()
        except Exception as exc:  # noqa: BLE001 - the store or the key failed: try again next time
            log.warning("no checkpoint made: %s", exc)
            return
        if outcome is not None:
            self.outcomes.append(outcome)
            for name, why in outcome.failed.items():  # retried at the next interval
                log.warning("checkpoint at seq %d not published to %s: %s", outcome.checkpoint.seq, name, why)

    def close(self, timeout: float = 60.0) -> Outcome | None:
        """Stop, after one last checkpoint; the last outcome (None if nothing was published)."""
        self._stop.set()
        self._thread.join(timeout)
        return self.outcomes[-1] if self.outcomes else None
