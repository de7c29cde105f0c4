"""Fan-out: every ledger event to Pub/Sub (outbox publisher), subscribers over Pub/Sub or
the store, the reconciler's wake-up, and notifications."""

from ledger.fanout.envelope import Deduper, decode, encode
from ledger.fanout.publisher import (
    OutboxPublisher,
    PublishStats,
    cursor_name,
    drain,
    publishing,
    run_publisher,
    start_publisher_thread,
)
from ledger.fanout.pubsub import PubSubConfig, config_from_env
from ledger.fanout.subscriber import (
    PubSubSubscriber,
    StoreSubscriber,
    Subscriber,
    iter_events,
    open_subscriber,
    wait_for_event,
)

__all__ = [
    "Deduper", "decode", "encode", "OutboxPublisher", "PublishStats", "cursor_name", "drain", "publishing",
    "run_publisher", "start_publisher_thread", "PubSubConfig", "config_from_env",
    "PubSubSubscriber", "StoreSubscriber", "Subscriber", "iter_events", "open_subscriber",
    "wait_for_event",
]
