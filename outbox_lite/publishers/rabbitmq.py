"""RabbitMQ publisher: one AMQP 0-9-1 message per outbox event, with publisher confirms (the
``[rabbitmq]`` extra).

The message is a contract, because consumers rely on it:

* published to ``exchange`` with routing key ``routing_key``, else the event's ``event_type``;
  ``mandatory``, so a message no queue takes comes back instead of vanishing;
* **body**: the payload's JSON text, UTF-8 (:func:`outbox_lite.publishers.message_body`);
* **properties**: ``message_id`` = :func:`outbox_lite.publishers.message_id` (the same on every
  publish of the event), ``type`` = ``event_type``, ``content_type`` = ``application/json``,
  ``delivery_mode`` = 2 (persistent);
* **headers**: every header of the event (``event.headers``: a ``traceparent`` among them when
  the service wrote it in a trace, SPEC §11), then ``outbox-event-id`` (the event's id, an
  integer), ``outbox-aggregate-type``, ``outbox-aggregate-id``;
* with ``cloudevents=True``, the binary content mode of the CloudEvents AMQP binding: the
  context attributes (:func:`outbox_lite.publishers.cloudevent_attributes`) as headers
  ``cloudEvents_specversion``, ``cloudEvents_id``, ``cloudEvents_source``,
  ``cloudEvents_type``, ``cloudEvents_subject``, ``cloudEvents_time`` (strings; the binding's
  ``cloudEvents_`` prefix, which JMS takes too), ``datacontenttype`` as ``content_type``,
  and the body unchanged.

An event counts as published only once the broker confirmed it (``basic.ack``): for a
persistent message routed to durable queues, RabbitMQ confirms once they have written it. A
``basic.nack`` is that event's retryable failure (``error_code`` ``nacked``); a message
returned because no queue is bound for its routing key is that event's retryable failure
``unroutable`` (never a silent success). A lost connection or channel, or confirms that do not
come within ``timeout``, fail the whole batch (``publish`` raises); ``ping()`` connects again.
RabbitMQ keeps no dedupe of its own: a republished event (a relay that died after the confirm
and before recording it) arrives again with the same ``message_id``, and consumers dedupe on it
(:class:`outbox_lite.Inbox`).

The client is aiormq, the asyncio AMQP client under aio-pika: a batch is written at once and its
confirms are awaited together, each matched to its message (a return by its ``message_id``).
pika's BlockingConnection, the synchronous alternative, waits for each confirm before the next
publish: about a third of the throughput here (see ``scripts/bench.py brokers``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping, Sequence
from urllib.parse import unquote, urlsplit

from .. import _checks
from ..errors import InvalidEventError
from ..models import MAX_NAME_LENGTH, OutboxEvent
from . import BrokerUnavailableError, PublishError, cloudevent_attributes, message_body, message_id
from . import cloudevents_source as _cloudevents_source
from ._binding import Binding, Flag
from ._loop import ConnectionPublisher, timeout_option
from ._url import mask_url, password_of, scrub

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0
CONTENT_TYPE = "application/json"
#: The CloudEvents AMQP binding's prefix of an attribute's application property.
CLOUDEVENTS_PREFIX = "cloudEvents_"
PERSISTENT = 2
_INSTALL_HINT = "pip install 'outbox-lite[rabbitmq]'"


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

class RabbitMQPublishError(PublishError):
    """Publishing to RabbitMQ failed; ``error_code`` and ``retryable`` say what the relay
    records."""

    code = "rabbitmq_error"


class RabbitMQUnavailableError(RabbitMQPublishError, BrokerUnavailableError):
    """The broker was unreachable, dropped the connection or channel, or did not confirm in
    time: the whole batch failed (retryable)."""


class RabbitMQConfigurationError(RabbitMQUnavailableError):
    """The broker refused the login or the virtual host, or the exchange does not exist: no
    publish can succeed until someone changes the broker or the settings."""


class RabbitMQMessageError(RabbitMQPublishError):
    """The broker did not take one message: returned as unroutable, or nacked (retryable)."""


# ---------------------------------------------------------------------------
# The publisher
# ---------------------------------------------------------------------------

class RabbitMQPublisher(ConnectionPublisher):
    """Publishes outbox events as persistent, confirmed AMQP messages to ``exchange`` of the
    broker at ``url`` (``amqp://user:password@host:port/vhost``; ``amqps://`` for TLS).

    ``publish(events)`` writes one message per event (see the module docstring), awaits all
    their confirms and returns the failures by event id (empty: all confirmed); it raises
    :class:`RabbitMQUnavailableError` when the connection or channel is lost or the confirms
    take longer than ``timeout`` seconds. ``ping()`` connects if needed and checks that the
    exchange exists (:class:`RabbitMQConfigurationError` when it does not).

    The asyncio client runs on one event loop, in a daemon thread the publisher owns. Calls from
    several threads go one batch at a time: give each relay thread a publisher of its own. Use
    it as a context manager, or call :meth:`close`.
    """

    broker = "RabbitMQ"
    code = "rabbitmq"
    messaging_system = "rabbitmq"  # OpenTelemetry's name (outbox_lite.tracing)
    unavailable = RabbitMQUnavailableError

    def __init__(self, url: str, exchange: str, *, routing_key: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, cloudevents: bool = False,
                 cloudevents_source: str | None = None) -> None:
        self.exchange = _checks.name("exchange", exchange)
        self.destination = self.exchange
        self.cloudevents = _checks.flag("cloudevents", cloudevents)
        self.cloudevents_source = _cloudevents_source(cloudevents_source)
        self.routing_key = _routing_key(routing_key)
        self.timeout = timeout_option(timeout)
        self._url = _amqp_url(url)
        self._password = password_of(url)
        self.url = mask_url(url, "AMQP")  # safe to show: the password is masked
        self._aiormq = _import_client()
        self._start(f"outbox-rabbitmq-{self.exchange}", _close)  # state: [connection, channel]

    def __repr__(self) -> str:
        key = "" if self.routing_key is None else f" routing_key={self.routing_key!r}"
        return f"<RabbitMQPublisher exchange={self.exchange!r}{key} url={self.url!r}>"

    # -- the Publisher protocol ---------------------------------------------

    def publish(self, events: Sequence[OutboxEvent]) -> Mapping[int, BaseException]:
        """Publish one message per event and await every confirm; return the failures by event
        id (empty: all confirmed). Raises :class:`RabbitMQUnavailableError` (retryable) when
        the connection or channel is lost or a confirm does not come within ``timeout``."""
        if not events:
            return {}
        spec = self._aiormq.spec
        messages = [(self.routing_key if self.routing_key is not None else e.event_type,
                     message_body(e),
                     spec.Basic.Properties(
                         message_id=message_id(e), message_type=e.event_type,
                         content_type=CONTENT_TYPE, delivery_mode=PERSISTENT,
                         headers=self._headers(e)))
                    for e in events]
        failures: Mapping[int, BaseException] = self._run(
            lambda: self._publish(events, messages))
        return failures

    def _headers(self, event: OutboxEvent) -> dict[str, Any]:
        """The message's headers (see the module docstring)."""
        headers: dict[str, Any] = dict(event.headers)
        headers["outbox-event-id"] = event.id
        headers["outbox-aggregate-type"] = event.aggregate_type
        headers["outbox-aggregate-id"] = event.aggregate_id
        if self.cloudevents:
            for name, value in cloudevent_attributes(event, self.cloudevents_source).items():
                headers[CLOUDEVENTS_PREFIX + name] = value
        return headers

    def ping(self) -> None:
        """Connect if needed and check that the exchange exists (a passive declare): raises
        :class:`RabbitMQConfigurationError` for a refused login or a missing exchange,
        :class:`RabbitMQUnavailableError` when the broker cannot be reached."""
        self._run(self._ping)

    def _client_errors(self) -> tuple[type[BaseException], ...]:
        errors = self._aiormq.exceptions
        return errors.AMQPError, errors.ChannelInvalidStateError

    # -- inside the event loop ------------------------------------------------

    async def _channel(self) -> Any:
        """The confirming channel, connecting first when there is no open connection."""
        connection, channel = self._state
        if channel is not None and not channel.is_closed:
            return channel
        if connection is None or connection.is_closed:
            self._state[:] = [None, None]
            if connection is not None:
                await _close([connection, None])
            connection = await self._aiormq.connect(self._url)
            self._state[0] = connection
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        self._state[1] = channel
        return channel

    async def _ping(self) -> None:
        channel = await self._channel()
        await channel.exchange_declare(exchange=self.exchange, passive=True)

    async def _publish(self, events: Sequence[OutboxEvent],
                       messages: list[tuple[str, bytes, Any]]) -> dict[int, BaseException]:
        aiormq = self._aiormq
        channel = await self._channel()
        results = await asyncio.gather(
            *(channel.basic_publish(body, exchange=self.exchange, routing_key=key,
                                    properties=properties, mandatory=True)
              for key, body, properties in messages),
            return_exceptions=True)
        failures: dict[int, BaseException] = {}
        for event, (key, _, _), result in zip(events, messages, results):
            if isinstance(result, aiormq.spec.Basic.Ack):
                continue
            if isinstance(result, aiormq.exceptions.PublishError):  # a basic.return
                failures[event.id] = RabbitMQMessageError(
                    f"{self._where()}: unroutable: no queue is bound to exchange "
                    f"{self.exchange!r} for routing key {key!r} ({_reply_text(result)})",
                    error_code="unroutable")
            elif isinstance(result, aiormq.exceptions.DeliveryError):  # a basic.nack
                failures[event.id] = RabbitMQMessageError(
                    f"{self._where()}: the broker nacked the message (it could not take it)",
                    error_code="nacked")
            elif isinstance(result, BaseException):  # the channel or connection is gone
                raise result
            else:
                failures[event.id] = RabbitMQMessageError(
                    f"{self._where()}: no confirm for the message ({type(result).__name__})",
                    error_code="unconfirmed")
        return failures

    # -- helpers --------------------------------------------------------------

    def _where(self) -> str:
        return f"RabbitMQ at {self.url}"

    def _error(self, exc: BaseException) -> RabbitMQPublishError:
        errors = self._aiormq.exceptions
        text = scrub(str(exc) or type(exc).__name__, self._password)
        if isinstance(exc, (errors.AuthenticationError, errors.ProbableAuthenticationError)) or (
                isinstance(exc, errors.ConnectionClosed) and "ACCESS_REFUSED" in str(exc)):
            return RabbitMQConfigurationError(
                f"{self._where()} refused the login of user {self._user()!r} (check the user "
                "and password)", error_code="rabbitmq_access_refused")
        if isinstance(exc, errors.ConnectionNotAllowed) or (
                isinstance(exc, errors.InvalidFrameError) and "Connection.Close" in str(exc)):
            # aiormq reports a vhost refused at Connection.Open as an unexpected frame.
            return RabbitMQConfigurationError(
                f"{self._where()} refused to open the virtual host of the URL for user "
                f"{self._user()!r} (it may not exist, or the user may not use it)",
                error_code="rabbitmq_vhost_refused")
        if isinstance(exc, errors.ChannelNotFoundEntity):
            return RabbitMQConfigurationError(
                f"{self._where()}: exchange {self.exchange!r} does not exist (declare it, "
                "with the queues bound to it, before the relay starts)",
                error_code="rabbitmq_no_exchange")
        if isinstance(exc, errors.ChannelAccessRefused):
            return RabbitMQConfigurationError(
                f"{self._where()}: user {self._user()!r} may not publish to exchange "
                f"{self.exchange!r}: {text}", error_code="rabbitmq_access_refused")
        return RabbitMQUnavailableError(
            f"{self._where()} is unavailable: {type(exc).__name__}: {text}",
            error_code="rabbitmq_unavailable")

    def _user(self) -> str:
        return unquote(urlsplit(self._url).username or "guest")


# ---------------------------------------------------------------------------
# Module helpers
# ---------------------------------------------------------------------------

def _import_client() -> Any:
    try:
        import aiormq  # type: ignore[import-not-found,unused-ignore]
        import aiormq.exceptions  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise ImportError(
            f"RabbitMQPublisher needs the aiormq package ({exc}); install it with "
            f"{_INSTALL_HINT}") from exc
    return aiormq


async def _close(state: list[Any]) -> None:
    connection = state[0]
    if connection is None:
        return
    try:
        await asyncio.wait_for(connection.close(), 5)
    except BaseException as exc:  # noqa: BLE001 - closing must not fail on a dead broker
        logger.debug("closing a RabbitMQ connection failed: %s", type(exc).__name__)


def _reply_text(exc: BaseException) -> str:
    frame = getattr(exc, "frame", None)
    return str(getattr(frame, "reply_text", None) or "returned")


def _amqp_url(url: Any) -> str:
    if not isinstance(url, str):
        raise InvalidEventError(f"url must be a str, not {type(url).__name__}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise InvalidEventError(
            f"url {mask_url(url, 'AMQP')!r} is not an AMQP URL"
            " (amqp://user:password@host:port/vhost)") from None
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise InvalidEventError(
            f"url {mask_url(url, 'AMQP')!r} is not an AMQP URL"
            " (amqp://user:password@host:port/vhost, or amqps://)")
    return url


def _routing_key(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEventError(f"routing_key must be a str, not {type(value).__name__}")
    if len(value.encode("utf-8")) > MAX_NAME_LENGTH:
        raise InvalidEventError(f"routing_key is longer than {MAX_NAME_LENGTH} bytes")
    return value


# ---------------------------------------------------------------------------
# Its flags on `outbox-lite relay` (outbox_lite.publishers._binding)
# ---------------------------------------------------------------------------

def _from_flags(url: str, args: Any) -> RabbitMQPublisher:
    return RabbitMQPublisher(url, args.exchange, routing_key=args.routing_key,
                             cloudevents=args.cloudevents,
                             cloudevents_source=args.cloudevents_source)


CLI = Binding(
    "RabbitMQ",
    Flag("--rabbitmq-url", "URL",
         "publish to RabbitMQ with publisher confirms, amqp://user:password@"
         "host:port/vhost (default: $OUTBOX_RABBITMQ_URL); needs "
         "outbox-lite[rabbitmq] and --exchange"),
    "OUTBOX_RABBITMQ_URL",
    (Flag("--exchange", "NAME", "the RabbitMQ exchange to publish to (it must exist)"),
     Flag("--routing-key", "KEY",
          "the routing key of every message (default: the event's event_type)")),
    _from_flags, rank=20, cloudevents=True)
