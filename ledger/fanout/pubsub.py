"""Thin adapter over google-cloud-pubsub: configuration, clients, topics, subscriptions.

`PUBSUB_EMULATOR_HOST` is read by the client library when a client is created, so
`configure()` sets it (when asked to) before any client exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ledger import defaults
from ledger.errors import LedgerError
from ledger.fanout.envelope import Message

DEFAULT_TOPIC = "ledger-events"


@dataclass(frozen=True, slots=True)
class PubSubConfig:
    project: str
    topic: str
    emulator_host: str | None = None  # host:port; None = whatever PUBSUB_EMULATOR_HOST says

    @property
    def topic_path(self) -> str:
        return f"projects/{self.project}/topics/{self.topic}"

    def subscription_path(self, subscription: str) -> str:
        if subscription.startswith("projects/"):
            return subscription
        return f"projects/{self.project}/subscriptions/{subscription}"


def config_from_env(
    project: str | None = None, topic: str | None = None, emulator_host: str | None = None
) -> PubSubConfig:
    """Explicit values first, then LEDGER_PROJECT / LEDGER_PUBSUB_TOPIC, then the defaults."""
    return PubSubConfig(
        project=project or os.environ.get("LEDGER_PROJECT") or defaults.PROJECT,
        topic=topic or os.environ.get("LEDGER_PUBSUB_TOPIC") or DEFAULT_TOPIC,
        emulator_host=emulator_host,
    )


def configure(config: PubSubConfig) -> None:
    if config.emulator_host:
        os.environ["PUBSUB_EMULATOR_HOST"] = config.emulator_host


def publisher_client(config: PubSubConfig) -> Any:
    from google.cloud import pubsub_v1

    configure(config)
    return _client(pubsub_v1.PublisherClient)


def publish_batch(client: Any, config: PubSubConfig, messages: list[Message], timeout: float = 30.0) -> None:
    """One Publish RPC carrying messages of many ordering keys, in order; raises on failure.

    The service keeps the order of messages within a request and across requests in the
    order it receives them, so sending the next batch only after this one returned keeps
    every key in order without pausing keys (the high-level client batches per key and
    spends a thread per batch: a few hundred events/s with a thousand jobs on 2 cores).
    """
    from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisher
    from google.pubsub_v1.types import PublishRequest, PubsubMessage

    raw_message, raw_request = PubsubMessage.pb(), PublishRequest.pb()
    request = raw_request(
        topic=config.topic_path,
        messages=[raw_message(data=m.data, attributes=m.attributes, ordering_key=m.ordering_key) for m in messages],
    )
    # The generated (GAPIC) method of the same client: the high-level one overrides `publish`.
    GapicPublisher.publish(client, request=PublishRequest.wrap(request), timeout=timeout, retry=None)


def subscriber_client(config: PubSubConfig) -> Any:
    from google.cloud import pubsub_v1

    configure(config)
    return _client(pubsub_v1.SubscriberClient)


def _client(factory: Any) -> Any:
    try:
        return factory()
    except Exception as exc:
        if (error := fatal(exc)) is not None:
            raise error from exc
        raise


def ensure_topic(client: Any, config: PubSubConfig) -> bool:
    """Create the topic if missing; True when it was created."""
    from google.api_core.exceptions import AlreadyExists

    try:
        client.create_topic(request={"name": config.topic_path}, timeout=10.0)
        return True
    except AlreadyExists:
        return False


def ensure_subscription(client: Any, config: PubSubConfig, subscription: str) -> bool:
    """Create an ordered subscription to the topic if missing; True when it was created."""
    from google.api_core.exceptions import AlreadyExists

    try:
        client.create_subscription(
            request={
                "name": config.subscription_path(subscription),
                "topic": config.topic_path,
                "enable_message_ordering": True,
                "ack_deadline_seconds": 60,
            },
            timeout=10.0,
        )
        return True
    except AlreadyExists:
        return False


def fatal(exc: BaseException) -> LedgerError | None:
    """A configuration error that retrying cannot fix, as a LedgerError; None if transient."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.InvalidArgument | gexc.PermissionDenied | gexc.Unauthenticated):
        return LedgerError(
            f"Pub/Sub refused the request: {exc.message}",  # type: ignore[attr-defined]
            hint="check --project / LEDGER_PROJECT, --topic / LEDGER_PUBSUB_TOPIC (3-255 chars, "
            "starting with a letter) and credentials",
        )
    from google.auth.exceptions import DefaultCredentialsError

    if isinstance(exc, DefaultCredentialsError):
        return LedgerError(
            "no Google Cloud credentials for Pub/Sub",
            hint="set PUBSUB_EMULATOR_HOST for the emulator, or run `gcloud auth application-default login`",
        )
    return None


def ensure_all(config: PubSubConfig, subscriptions: tuple[str, ...] = ()) -> None:
    """Topic and subscriptions exist (the emulator forgets them when it restarts)."""
    from google.cloud import pubsub_v1

    configure(config)
    pub = _client(pubsub_v1.PublisherClient)
    try:
        ensure_topic(pub, config)
    finally:
        pub.transport.close()
    if subscriptions:
        sub = subscriber_client(config)
        try:
            for name in subscriptions:
                ensure_subscription(sub, config, name)
        finally:
            sub.close()
