"""The outbox publisher: store -> Pub/Sub topic, at least once, cursor beside the events.

Guarantees:
- Every event after the cursor `fanout:<topic>` is published, each job's events in order
  (ordering key = stream).
- Events go out in batches of up to `batch_size`, one Publish RPC at a time; the next batch
  is read and encoded while the current one is in flight, and sent only after the current
  one was acknowledged. So the acknowledged events are always a prefix of the ledger, the
  cursor moves to the end of each acknowledged batch, and a crash (even kill -9)
  republishes at most one batch and skips nothing; subscribers drop the duplicates by id.
- Memory is bounded by two batches whatever the backlog (100,000 events drain in chunks).
- A failed batch is retried whole, in order, with backoff (0.1 s doubling to 2 s), before
  anything after it is sent: no ordering key is ever left paused or overtaken. NOT_FOUND
  (an emulator restart forgets topics) re-creates the topic and the named subscriptions
  first, so no subscriber misses the backlog. Configuration errors raise LedgerError.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from ledger.errors import LedgerError
from ledger.events import Event
from ledger.fanout import pubsub
from ledger.fanout.envelope import Message, encode
from ledger.store import Store, open_store

log = logging.getLogger("ledger.fanout")


def cursor_name(topic: str) -> str:
    return f"fanout:{topic}"


@dataclass(slots=True)
class PublishStats:
    published: int = 0  # events acknowledged by Pub/Sub in this run
    batches: int = 0
    retries: int = 0  # failed batch attempts, each retried
    position: int = 0  # the cursor: every seq <= position is acknowledged

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Batch:
    last_seq: int
    messages: list[Message]


class OutboxPublisher:
    """Publishes one store's events to one topic. Drive it from one thread."""

    def __init__(
        self,
        store: Store,
        config: pubsub.PubSubConfig,
        *,
        subscriptions: tuple[str, ...] = (),
        batch_size: int = 1000,
        rpc_timeout: float = 30.0,
    ) -> None:
        self.store = store
        self.config = config
        self.subscriptions = subscriptions
        self.batch_size = batch_size
        self.rpc_timeout = rpc_timeout
        self.cursor = cursor_name(config.topic)
        self.stats = PublishStats(position=store.get_cursor(self.cursor))
        self._client = pubsub.publisher_client(config)
        self._rpc = ThreadPoolExecutor(1, thread_name_prefix="ledger-fanout-rpc")
        self._needs_setup = True
        self._backoff = 0.0

    def run(
        self, stop: threading.Event, *, until_caught_up: bool = False, idle_wait: float = 0.5,
        deadline: float | None = None,
    ) -> PublishStats:
        """Publish until `stop` is set, or with until_caught_up until the head is acknowledged.
        Passing `deadline` (time.monotonic()) raises LedgerError when it is not done by then."""
        read_pos = self.stats.position
        in_flight: tuple[_Batch, Future[Any]] | None = None
        ready: _Batch | None = None
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise LedgerError(
                    f"fan-out did not drain in time: acknowledged up to seq {self.stats.position}, "
                    f"head is {self.store.head()}",
                    hint="is Pub/Sub reachable (PUBSUB_EMULATOR_HOST / credentials)?",
                )
            acked: _Batch | None = None
            if in_flight is not None:
                batch, future = in_flight
                if not self._wait(future, stop):
                    break  # stopping: the batch may or may not be delivered; the cursor says not
                if future.exception() is not None:
                    self._failed(future.exception(), stop)
                    in_flight = None if stop.is_set() else (batch, self._send(batch))
                    continue
                acked, in_flight = batch, None
            if not stop.is_set() and not (self._needs_setup and not self._setup(stop)):
                if ready is None:
                    ready = self._read(read_pos)
                if ready is not None:
                    read_pos = ready.last_seq
                    in_flight, ready = (ready, self._send(ready)), None
            if acked is not None:
                self._acknowledged(acked)  # the cursor's fsync overlaps the next batch's RPC
            if in_flight is not None:
                if ready is None:
                    ready = self._read(read_pos)  # encode the next batch while this one flies
                continue
            if stop.is_set():
                break
            if self._needs_setup:
                continue
            if until_caught_up and self.store.head() <= read_pos:
                break
            self.store.wait_for_append(read_pos, idle_wait)
        return self.stats

    def close(self) -> None:
        self._rpc.shutdown(wait=False, cancel_futures=True)
        self._client.transport.close()

    # -- steps ----------------------------------------------------------------------------
    def _read(self, after: int) -> _Batch | None:
        events: list[Event] = list(self.store.read_all(after=after, limit=self.batch_size))
        if not events:
            return None
        return _Batch(events[-1].seq, [encode(e) for e in events])

    def _send(self, batch: _Batch) -> Future[Any]:
        return self._rpc.submit(pubsub.publish_batch, self._client, self.config, batch.messages, self.rpc_timeout)

    @staticmethod
    def _wait(future: Future[Any], stop: threading.Event) -> bool:
        while not future.done():
            if stop.is_set():
                return False
            try:
                future.exception(timeout=0.1)
            except TimeoutError:
                continue
        return True

    def _acknowledged(self, batch: _Batch) -> None:
        self.store.set_cursor(self.cursor, batch.last_seq)
        self.stats.position = batch.last_seq
        self.stats.published += len(batch.messages)
        self.stats.batches += 1
        self._backoff = 0.0

    def _failed(self, exc: BaseException, stop: threading.Event) -> None:
        from google.api_core.exceptions import NotFound

        if (error := pubsub.fatal(exc)) is not None:
            raise error from exc
        self.stats.retries += 1
        log.warning("fan-out: publish to %s failed (%s); retrying", self.config.topic_path, exc)
        self._sleep_backoff(stop)
        if isinstance(exc, NotFound):
            self._needs_setup = True
            while not stop.is_set() and not self._setup(stop):
                pass

    def _setup(self, stop: threading.Event) -> bool:
        try:
            pubsub.ensure_all(self.config, self.subscriptions)
        except Exception as exc:  # noqa: BLE001 - any transport error: wait and retry
            if (error := pubsub.fatal(exc)) is not None:
                raise error from exc
            self.stats.retries += 1
            log.warning("fan-out: cannot reach topic %s (%s); retrying", self.config.topic_path, exc)
            self._sleep_backoff(stop)
            return False
        self._needs_setup = False
        return True

    def _sleep_backoff(self, stop: threading.Event) -> None:
        self._backoff = min(max(self._backoff * 2, 0.1), 2.0)
        stop.wait(self._backoff)


def _open(store: Store | str) -> tuple[Store, bool]:
    if isinstance(store, str):
        return open_store(store), True
    return store, False


def run_publisher(
    store: Store | str,
    project: str | None,
    topic: str | None,
    stop_event: threading.Event,
    *,
    subscriptions: tuple[str, ...] = (),
    emulator_host: str | None = None,
    batch_size: int = 1000,
) -> PublishStats:
    """Publish until stop_event is set; for `ledger fanout` and background threads.

    In a thread, pass the store URL: the thread then opens its own connection.
    """
    config = pubsub.config_from_env(project, topic, emulator_host)
    opened, owned = _open(store)
    publisher = OutboxPublisher(opened, config, subscriptions=subscriptions, batch_size=batch_size)
    try:
        return publisher.run(stop_event)
    finally:
        publisher.close()
        if owned:
            opened.close()


def drain(
    store: Store | str,
    project: str | None = None,
    topic: str | None = None,
    *,
    subscriptions: tuple[str, ...] = (),
    emulator_host: str | None = None,
    timeout: float | None = 300.0,
    batch_size: int = 1000,
) -> PublishStats:
    """Publish everything up to the head and wait for Pub/Sub to acknowledge it; one shot."""
    config = pubsub.config_from_env(project, topic, emulator_host)
    opened, owned = _open(store)
    publisher = OutboxPublisher(opened, config, subscriptions=subscriptions, batch_size=batch_size)
    deadline = time.monotonic() + timeout if timeout is not None else None
    try:
        return publisher.run(threading.Event(), until_caught_up=True, deadline=deadline)
    finally:
        publisher.close()
        if owned:
            opened.close()


def start_publisher_thread(
    store_url: str, project: str | None, topic: str | None, **kwargs: Any
) -> tuple[threading.Thread, threading.Event]:
    """run_publisher in a daemon thread; set the returned event and join to stop it.

    The thread outlives failures (a store briefly locked, Pub/Sub away): it logs, waits and
    starts again from the cursor, which only ever moved past acknowledged events."""
    stop = threading.Event()

    def supervised() -> None:
        backoff = 0.5
        while not stop.is_set():
            try:
                run_publisher(store_url, project, topic, stop, **kwargs)
                return
            except Exception as exc:  # keep fanning out: a background thread has no one to tell
                log.warning("fan-out to %s stopped (%s); restarting in %.1f s", topic, exc, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    thread = threading.Thread(target=supervised, name="ledger-fanout", daemon=True)
    thread.start()
    return thread, stop


@contextlib.contextmanager
def publishing(store_url: str, project: str | None, topic: str | None) -> Iterator[None]:
    """Run the outbox publisher beside a long-running command when a topic is configured."""
    if not topic:
        yield
        return
    thread, stop = start_publisher_thread(store_url, project, topic)
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
