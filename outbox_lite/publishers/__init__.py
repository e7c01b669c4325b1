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
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

if TYPE_CHECKING:
    from ..models import OutboxEvent

__all__ = ["MESSAGE_ID_PREFIX", "message_id", "message_id_of_key", "dedupe_key_of",
           "message_body"]

MESSAGE_ID_PREFIX = "outbox-"
#: What percent-encoding leaves as it is (RFC 3986's unreserved characters).
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]+")
#: The outbox's own encoding of a payload (``JSONTextField``): compact, UTF-8 as it is.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


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
