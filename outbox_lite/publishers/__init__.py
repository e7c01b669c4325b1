"""Publishers: broker clients that the relay hands claimed events to.

Each publisher lives in a module of its own and imports its broker's client only there, so
``import outbox_lite`` never needs an optional dependency: ``outbox_lite.publishers.bullmq``
(the ``[bullmq]`` extra), ``.rabbitmq`` (``[rabbitmq]``) and ``.nats`` (``[nats]``).

What every publisher shares lives here, so there is one definition of each:

* :func:`message_id`: the id of the one message an event becomes, whichever broker carries it
  (BullMQ's job id, AMQP's ``message_id``, JetStream's ``Nats-Msg-Id``): ``"outbox-"``
  followed by the event's ``dedupe_key`` percent-encoded as UTF-8 (every byte except
  ``A-Z a-z 0-9 - . _ ~`` becomes ``%XX``, upper-case hex), e.g. ``order 42:paid`` →
  ``outbox-order%2042%3Apaid``. Deterministic, so a republished event carries the id of its
  first publication and a consumer dedupes on it; injective (``%`` itself is encoded), so two
  events never share an id, and :func:`dedupe_key_of` gives the key back. At most
  7 + 255 × 12 characters; printable ASCII without ``:``, white space or quotes, which every
  broker takes as an id as it is.
* :func:`message_body`: the payload's JSON text as the outbox writes it (UTF-8, compact,
  non-ASCII as it is).
* :func:`cloudevent_attributes`: the CloudEvents 1.0 context attributes of an event, for the
  binary content mode of the AMQP and NATS bindings (``RabbitMQPublisher`` and
  ``NATSPublisher`` with ``cloudevents=True``): ``id`` the message id, ``type`` the
  ``event_type``, ``source`` (default :data:`DEFAULT_CLOUDEVENTS_SOURCE`), ``subject``
  ``<aggregate_type>/<aggregate_id>``, ``time`` the event's ``created_at`` (RFC 3339, UTC,
  microseconds); ``datacontenttype`` is the message's content type, ``application/json``,
  and the body is the payload unchanged.

Every publisher also sends every header of the event (``event.headers``, SPEC §11) with its
message, as the broker carries headers (see each module). Its errors subclass
:class:`PublishError` (``error_code``, ``retryable``: what the relay records), and the one that
means the broker could not be reached or did not answer, :class:`BrokerUnavailableError` too.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from ..errors import OutboxError

if TYPE_CHECKING:
    from ..models import OutboxEvent

__all__ = ["DEFAULT_CLOUDEVENTS_SOURCE", "MESSAGE_ID_PREFIX", "BrokerUnavailableError",
           "PublishError", "cloudevent_attributes",
           "cloudevents_source", "dedupe_key_of", "message_body", "message_id",
           "message_id_of_key"]

MESSAGE_ID_PREFIX = "outbox-"
#: The CloudEvents ``source`` when none is given: a URI reference naming the library, the same
#: for every service; give each service its own (``--cloudevents-source``), e.g.
#: ``https://shop.example.com/orders`` or ``urn:shop:orders``.
DEFAULT_CLOUDEVENTS_SOURCE = "/outbox-lite"
CLOUDEVENTS_SPECVERSION = "1.0"
_MAX_SOURCE_LENGTH = 1024
#: What percent-encoding leaves as it is (RFC 3986's unreserved characters).
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]+")
#: The outbox's own encoding of a payload (``JSONTextField``): compact, UTF-8 as it is.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class PublishError(OutboxError):
    """A publisher could not publish; ``error_code`` (the class's ``code`` unless given) and
    ``retryable`` say what the relay records."""

    code = "publish_error"

    def __init__(self, message: str, *, error_code: str | None = None,
                 retryable: bool = True) -> None:
        super().__init__(message)
        self.error_code = error_code or self.code
        self.retryable = retryable


class BrokerUnavailableError(PublishError):
    """The broker was unreachable, lost the connection or did not answer in time: what it had
    not taken failed (retryable)."""


def message_id(event: OutboxEvent) -> str:
    """The message id of ``event`` on every broker: :func:`message_id_of_key` of its
    ``dedupe_key`` (see the module docstring)."""
    return message_id_of_key(event.dedupe_key)


def message_id_of_key(dedupe_key: str) -> str:
    """The message id of the event whose ``dedupe_key`` this is."""
    if _UNRESERVED.fullmatch(dedupe_key):  # the common case (generated keys): 3x faster
        return MESSAGE_ID_PREFIX + dedupe_key
    return MESSAGE_ID_PREFIX + quote(dedupe_key, safe="")


def dedupe_key_of(message_id: str) -> str:
    """The dedupe key a :func:`message_id` was made from; ``ValueError`` for other ids."""
    if not message_id.startswith(MESSAGE_ID_PREFIX):
        raise ValueError(f"{message_id!r} is not an outbox message id")
    return unquote(message_id[len(MESSAGE_ID_PREFIX):], errors="strict")


def message_body(event: OutboxEvent) -> bytes:
    """The body of ``event``'s message: its payload as JSON text, UTF-8."""
    payload: Any = event.payload
    return _ENCODER.encode(payload).encode("utf-8")


def cloudevents_source(source: Any) -> str:
    """``source`` checked as a CloudEvents ``source`` (a non-empty URI reference without white
    space or control characters, at most 1,024 characters); None gives the default."""
    from ..errors import InvalidEventError

    if source is None:
        return DEFAULT_CLOUDEVENTS_SOURCE
    if not isinstance(source, str):
        raise InvalidEventError(f"cloudevents_source must be a str, not {type(source).__name__}")
    if not source or len(source) > _MAX_SOURCE_LENGTH or any(
            c.isspace() or not c.isprintable() for c in source):
        raise InvalidEventError(
            "cloudevents_source must be a URI reference of 1-1024 characters without white "
            "space, e.g. https://shop.example.com/orders or urn:shop:orders")
    return source


def cloudevent_attributes(event: OutboxEvent, source: str) -> dict[str, str]:
    """The CloudEvents context attributes of ``event`` (see the module docstring), by name,
    all strings; ``datacontenttype`` is left to the message's content type."""
    created = event.created_at
    time = created.isoformat(timespec="microseconds").replace("+00:00", "Z")
    return {"specversion": CLOUDEVENTS_SPECVERSION, "id": message_id(event), "source": source,
            "type": event.event_type, "subject": f"{event.aggregate_type}/{event.aggregate_id}",
            "time": time}
