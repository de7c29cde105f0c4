"""One subscriber interface over two transports, and the reconciler's wake-up.

- `StoreSubscriber` tails the store (the embedded default: no topic configured). Nothing is
  lost: its position is a seq, and it can resume from any cursor.
- `PubSubSubscriber` reads an ordered Pub/Sub subscription over StreamingPull. A message is
  acknowledged once it is in this process's memory (the client delivers a key's next
  message only after the previous one is acknowledged, so acknowledging later would serialise
  every job's stream); a crash can lose what was buffered but not yet consumed. A consumer
  that must see every event after a crash tails the store with its own cursor (as the
  notifier does); Pub/Sub is for reacting within moments.

Both drop duplicates by event id (see `Deduper`) and filter by type and job.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from ledger.events import Event
from ledger.fanout import pubsub
from ledger.fanout.envelope import CHECKPOINT_KIND, KIND_ATTRIBUTE, Deduper, decode, matches
from ledger.store import Store, open_store

log = logging.getLogger("ledger.fanout")


class Subscriber(Protocol):
    def receive(self, timeout: float, max_events: int = 1000) -> list[Event]:
        """New events (deduplicated, filtered, per-job order), waiting up to `timeout`
        seconds for the first; [] when none arrived."""
        ...

    def close(self) -> None: ...


def _frozen(values: Iterable[str] | None) -> frozenset[str] | None:
    values = frozenset(values or ())
    return values or None


class StoreSubscriber:
    """Tails a store from `after` (None = its current head: only events appended from now)."""

    def __init__(
        self,
        store: Store | str,
        *,
        after: int | None = None,
        types: Iterable[str] | None = None,
        streams: Iterable[str] | None = None,
    ) -> None:
        self._owned = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.position = self.store.head() if after is None else after
        self.types, self.streams = _frozen(types), _frozen(streams)
        self.dedup = Deduper()

    def receive(self, timeout: float, max_events: int = 1000) -> list[Event]:
        deadline = time.monotonic() + timeout
        while True:
            if self.store.head() <= self.position:
                self.store.wait_for_append(self.position, max(0.0, deadline - time.monotonic()))
            out: list[Event] = []
            for event in self.store.read_all(after=self.position, limit=max_events):
                self.position = event.seq
                if matches(event, self.types, self.streams) and self.dedup.is_new(event):
                    out.append(event)
            if out or time.monotonic() >= deadline:
                return out

    def close(self) -> None:
        if self._owned:
            self.store.close()


class PubSubSubscriber:
    """Reads an ordered subscription; re-creates topic and subscription when they vanish
    (an emulator restart) and reconnects with backoff."""

    def __init__(
        self,
        subscription: str,
        *,
        project: str | None = None,
        topic: str | None = None,
        emulator_host: str | None = None,
        types: Iterable[str] | None = None,
        streams: Iterable[str] | None = None,
        create: bool = True,
        max_outstanding: int = 5000,
    ) -> None:
        self.config = pubsub.config_from_env(project, topic, emulator_host)
        self.path = self.config.subscription_path(subscription)
        self.subscription = subscription
        self.types, self.streams = _frozen(types), _frozen(streams)
        self.create = create
        self.dedup = Deduper()
        self.received = 0  # messages, duplicates included
        self._max_outstanding = max_outstanding
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._client = pubsub.subscriber_client(self.config)
        self._future: Any = None
        self._next_attempt = 0.0
        self._backoff = 0.0
        self._connect()

    def _callback(self, message: Any) -> None:
        if (message.attributes or {}).get(KIND_ATTRIBUTE) == CHECKPOINT_KIND:
            message.ack()  # a signed checkpoint of the head, not an event: for auditors
            return
        try:
            event = decode(message.data, message.attributes)
        except ValueError as exc:
            log.warning("subscriber %s: dropping a foreign message: %s", self.subscription, exc)
            message.ack()
            return
        self._queue.put(event)
        message.ack()

    def _connect(self) -> bool:
        from google.cloud.pubsub_v1.types import FlowControl

        if time.monotonic() < self._next_attempt:
            return False
        try:
            if self.create:
                pubsub.ensure_all(self.config, (self.subscription,))
            self._future = self._client.subscribe(
                self.path, self._callback, flow_control=FlowControl(max_messages=self._max_outstanding)
            )
        except Exception as exc:  # noqa: BLE001 - unreachable service: try again later
            if (error := pubsub.fatal(exc)) is not None:
                raise error from exc
            self._backoff = min(max(self._backoff * 2, 0.2), 5.0)
            self._next_attempt = time.monotonic() + self._backoff
            log.warning("subscriber %s: cannot subscribe (%s); retrying in %.1fs", self.subscription, exc, self._backoff)
            return False
        self._backoff = 0.0
        return True

    def _watch(self) -> None:
        """A streaming pull that ended (NOT_FOUND after an emulator restart, ...) is renewed."""
        if self._future is not None and not self._future.done():
            return
        if self._future is not None:
            exc = self._future.exception()
            log.warning("subscriber %s: stream ended (%s); reconnecting", self.subscription, exc)
            self._future = None
        self._connect()

    def receive(self, timeout: float, max_events: int = 1000) -> list[Event]:
        deadline = time.monotonic() + timeout
        out: list[Event] = []
        while not out:
            self._watch()
            remaining = deadline - time.monotonic()
            try:
                event = self._queue.get(timeout=max(0.0, min(remaining, 0.25)))
            except queue.Empty:
                if remaining <= 0:
                    return out
                continue
            while True:
                self.received += 1
                if matches(event, self.types, self.streams) and self.dedup.is_new(event):
                    out.append(event)
                if len(out) >= max_events:
                    break
                try:
                    event = self._queue.get_nowait()
                except queue.Empty:
                    break
        return out

    def close(self) -> None:
        if self._future is not None:
            self._future.cancel()
            with contextlib.suppress(Exception):
                self._future.result(timeout=10)
        self._client.close()


def open_subscriber(
    store: Store | str | None = None,
    *,
    subscription: str | None = None,
    project: str | None = None,
    topic: str | None = None,
    after: int | None = None,
    types: Iterable[str] | None = None,
    streams: Iterable[str] | None = None,
) -> Subscriber:
    """Pub/Sub when a subscription is named, else tail the store (the embedded default)."""
    if subscription:
        return PubSubSubscriber(subscription, project=project, topic=topic, types=types, streams=streams)
    return StoreSubscriber(store if store is not None else open_store(None), after=after, types=types, streams=streams)


def wait_for_event(source: Subscriber, timeout: float) -> bool:
    """Sleep until a new event arrives (True) or `timeout` seconds pass (False).

    For the reconciler: `while not stop: wait_for_event(sub, interval); reconcile()`. The
    events themselves are consumed: the reconciler reads its state from the store.
    """
    return bool(source.receive(timeout))


def iter_events(source: Subscriber, *, follow: bool, idle: float = 0.5) -> Iterator[Event]:
    """Events as they come; without follow, stops at the first quiet `idle` seconds."""
    while True:
        batch = source.receive(idle if not follow else 1.0)
        if not batch and not follow:
            return
        yield from batch
