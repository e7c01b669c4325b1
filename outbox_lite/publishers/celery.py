"""Celery publisher: one task message per outbox event, for a task a Celery worker runs (the
``[celery]`` extra).

The message is a contract, because the task and its worker rely on it:

* the task named ``task`` (as the worker registered it, ``"shop.tasks.order_paid"``), sent
  with Celery's own ``send_task`` on ``queue`` (else Celery's default queue, ``celery``), in
  Celery's task protocol, JSON-serialized;
* called with the **payload** (the JSON object or array as stored) as its one argument;
* **task id** = :func:`outbox_lite.publishers.message_id` of the event (the same on every
  publish of it: ``self.request.id`` in a bound task);
* **headers**: every header of the event (``event.headers``: a ``traceparent`` and
  ``tracestate`` among them when the service wrote it in a trace, SPEC §11), then
  ``outbox-event-id`` (the event's id, an integer), ``outbox-event-type``,
  ``outbox-aggregate-type`` and ``outbox-aggregate-id``. Celery hands a message's headers to
  the task as attributes of its request: ``self.request.get("outbox-event-id")``. An event
  header that has the name of one of Celery's own (``id``, ``task``, ``eta``, ``retries``…:
  :data:`CELERY_NAMES`) would change what Celery does with the message: that event is a
  dead letter at once (``error_code`` ``celery_reserved_header``), never sent.

An event counts as published only once the broker took its message: on RabbitMQ (``amqp://``,
``amqps://``) the publish waits for the broker's publisher confirm (kombu's
``confirm_publish``; a ``basic.nack`` is that event's retryable failure, ``nacked``); on Redis
(``redis://``, ``rediss://``) the batch's ``LPUSH`` commands go in one pipeline, and the batch
counts once Redis answered it. A lost connection, or a broker that does not answer within
``timeout``, fails what had not been taken yet: the whole batch (``publish`` raises) when
nothing was; on Redis a pipeline that failed may have been applied in part, so it fails whole.

Celery keeps no dedupe of its own: a republished event (a relay that died after the broker
took the batch and before recording it) runs its task again with the same task id. A task that
must run once per event accepts the task id in an inbox inside its own transaction
(:class:`outbox_lite.Inbox`, ``docs/guides/celery.md``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from typing import Any, Mapping, Sequence
from urllib.parse import unquote, urlsplit

from .. import _checks
from ..errors import InvalidEventError
from ..models import OutboxEvent
from . import BrokerUnavailableError, PublishError, message_id
from ._binding import Binding, Flag
from ._loop import timeout_option
from ._url import mask_url, password_of, scrub

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0
#: The schemes of the brokers that confirm what they took (RabbitMQ, Redis).
SCHEMES = ("amqp", "amqps", "pyamqp", "redis", "rediss")
#: The names Celery reads from a task message's headers or its request: an event header with
#: one of them would change what Celery does with the message.
CELERY_NAMES = frozenset((
    "lang", "task", "id", "shadow", "eta", "expires", "group", "group_index", "retries",
    "timelimit", "root_id", "parent_id", "argsrepr", "kwargsrepr", "origin", "ignore_result",
    "replaced_task_nesting", "stamped_headers", "stamps", "args", "kwargs", "callbacks",
    "errbacks", "chain", "chord", "children", "called_directly", "correlation_id",
    "delivery_info", "headers", "hostname", "is_eager", "logfile", "loglevel", "properties",
    "reply_to", "soft_time_limit", "taskset", "time_limit", "utc", "get", "update", "clear",
    "as_execution_options"))
_INSTALL_HINT = "pip install 'outbox-lite[celery]'"


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

class CeleryPublishError(PublishError):
    """Sending a task message failed; ``error_code`` and ``retryable`` say what the relay
    records."""

    code = "celery_error"


class CeleryUnavailableError(CeleryPublishError, BrokerUnavailableError):
    """The broker was unreachable, dropped the connection or did not answer in time: what it
    had not taken failed (retryable)."""


class CeleryConfigurationError(CeleryUnavailableError):
    """The broker refused the login or the virtual host: no publish can succeed until someone
    changes the broker or the settings."""


class CeleryMessageError(CeleryPublishError):
    """The broker did not take one message (nacked, retryable), or the event cannot be a task
    message (a reserved header name: not retryable)."""


# ---------------------------------------------------------------------------
# The publisher
# ---------------------------------------------------------------------------

class CeleryPublisher:
    """Publishes outbox events as messages for the Celery task named ``task`` through the
    broker at ``broker_url`` (RabbitMQ ``amqp://user:password@host:port/vhost``, or Redis
    ``redis://[:password@]host:port/db``), on ``queue`` (default: Celery's ``celery``).

    ``publish(events)`` sends one task message per event (see the module docstring) and returns
    the failures by event id (empty: the broker took every message); it raises
    :class:`CeleryUnavailableError` when the broker took none of them: unreachable, or no
    answer within ``timeout`` seconds. ``ping()`` connects, to fail fast on a wrong URL or
    password. ``app`` is the Celery app it sends with, made here (never the current app);
    ``celery_config`` is more of its settings (e.g. ``{"task_serializer": "json"}``).

    Calls from several threads go one batch at a time: give each relay thread a publisher of
    its own. Use it as a context manager, or call :meth:`close`.
    """

    messaging_system = "celery"  # OpenTelemetry's name (outbox_lite.tracing)

    def __init__(self, broker_url: str, task: str, *, queue: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 celery_config: Mapping[str, Any] | None = None) -> None:
        self.task = _checks.name("task", task)
        self.queue = None if queue is None else _checks.name("queue", queue)
        self.timeout = timeout_option(timeout)
        self._url = _broker_url(broker_url)
        self._password = password_of(broker_url)
        self.broker_url = mask_url(broker_url, "broker")  # safe to show: the password is masked
        self._confirms = urlsplit(self._url).scheme.startswith(("amqp", "pyamqp"))
        celery = _import_client()
        self.app = celery.Celery("outbox-lite", broker=self._url, set_as_current=False)
        self.app.conf.update(_app_config(self.timeout, self._confirms))
        if celery_config:
            self.app.conf.update(dict(celery_config))
        self.destination: str = self.queue or self.app.conf.task_default_queue  # "celery"
        # The connection in use, in a list the finalizer shares (it must not hold self).
        self._state: list[Any] = [None, None]  # [connection, producer]
        self._lock = threading.Lock()
        self._closed = False
        state = self._state
        # close() calls it; so does the garbage collector (or exit) if close() never came.
        self._stop = weakref.finalize(self, _close, state)

    def __repr__(self) -> str:
        queue = "" if self.queue is None else f" queue={self.queue!r}"
        return f"<CeleryPublisher task={self.task!r}{queue} broker={self.broker_url!r}>"

    def __enter__(self) -> CeleryPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the Publisher protocol ---------------------------------------------

    def publish(self, events: Sequence[OutboxEvent]) -> Mapping[int, BaseException]:
        """Send one task message per event; return the failures by event id (empty: the broker
        took every message). Raises :class:`CeleryUnavailableError` (retryable) when it took
        none: the broker is unreachable or does not answer within ``timeout``."""
        if not events:
            return {}
        failures: dict[int, BaseException] = {}
        sendable = []
        for event in events:
            reserved = sorted(CELERY_NAMES.intersection(event.headers))
            if reserved:
                failures[event.id] = CeleryMessageError(
                    f"{self._where()}: header {reserved[0]!r} of the event is a name Celery "
                    "reads from a task message; rename the header",
                    error_code="celery_reserved_header", retryable=False)
            else:
                sendable.append(event)
        if sendable:
            failures.update(self._run(lambda producer: self._send(producer, sendable)))
        return failures

    def ping(self) -> None:
        """Connect to the broker if needed: raises :class:`CeleryConfigurationError` for a
        refused login or virtual host, :class:`CeleryUnavailableError` when the broker cannot
        be reached."""
        self._run(lambda producer: None)

    def close(self) -> None:
        """Close the broker connection; idempotent."""
        with self._lock:
            self._closed = True
            self._stop()

    # -- sending --------------------------------------------------------------

    def _send(self, producer: Any, events: Sequence[OutboxEvent]) -> dict[int, BaseException]:
        """Send the events' messages: on Redis in one pipeline, on RabbitMQ each confirmed.
        Once a message was taken, a lost connection fails the rest only."""
        failures: dict[int, BaseException] = {}
        # kombu 5.7+ on Redis: the batch's commands in one pipeline (confirms go one by one).
        batch = None if self._confirms else getattr(producer, "batch", None)
        pipelined = batch is not None
        with batch(max_size=4 * len(events) + 8) if batch else contextlib.nullcontext():
            for index, event in enumerate(events):
                try:
                    self._send_one(producer, event)
                except self._nacked as exc:
                    failures[event.id] = CeleryMessageError(
                        f"{self._where()}: the broker nacked the message (it could not take"
                        f" it): {self._clean(exc)}", error_code="nacked")
                except self._failed as exc:
                    if index == 0 or pipelined:
                        raise
                    error = self._error(exc)
                    for rest in events[index:]:
                        failures[rest.id] = error
                    self._drop()
                    break
        return failures

    def _send_one(self, producer: Any, event: OutboxEvent) -> None:
        headers: dict[str, Any] = dict(event.headers)
        headers["outbox-event-id"] = event.id
        headers["outbox-event-type"] = event.event_type
        headers["outbox-aggregate-type"] = event.aggregate_type
        headers["outbox-aggregate-id"] = event.aggregate_id
        self.app.send_task(
            self.task, args=[event.payload], task_id=message_id(event), headers=headers,
            queue=self.destination, producer=producer, retry=False, confirm_timeout=self.timeout,
            declare=[],  # declared once per connection (_producer): a fifth of the CPU here
            # Not the payload again in the message, nor in the worker's logs and monitors.
            argsrepr=f"(<payload of outbox event {event.id}>,)", kwargsrepr="{}")

    # -- the connection -------------------------------------------------------

    def _run(self, call: Any) -> Any:
        """``call(producer)`` on a connected producer, one call at a time; a failure drops the
        connection (the next call connects afresh) and raises the publisher's error."""
        with self._lock:
            if self._closed:
                raise CeleryUnavailableError("the Celery publisher is closed",
                                             error_code="celery_closed")
            try:
                return call(self._producer())
            except self._failed as exc:
                self._drop()
                raise self._error(exc) from None

    def _producer(self) -> Any:
        connection, producer = self._state
        if producer is not None:
            return producer
        connection = self.app.connection_for_write()
        self._state[0] = connection
        connection.ensure_connection(max_retries=0, timeout=self.timeout)
        connection.default_channel  # noqa: B018 - opens a channel: Redis answers a PING here
        producer = self.app.amqp.Producer(connection, auto_declare=False)
        # The queue, as Celery's send_task would declare it before every message (durable on
        # RabbitMQ; its binding on Redis): once, here.
        producer.maybe_declare(self.app.amqp.queues[self.destination])
        self._state[1] = producer
        return producer

    def _drop(self) -> None:
        state, self._state[:] = list(self._state), [None, None]
        _close(state)

    @property
    def _failed(self) -> tuple[type[BaseException], ...]:
        """The errors that mean the broker did not take a message (or did not say)."""
        import kombu.exceptions

        errors: tuple[type[BaseException], ...] = (kombu.exceptions.KombuError, OSError,
                                                   TimeoutError)
        connection = self._state[0] or self.app.connection_for_write()
        try:
            errors += tuple(connection.connection_errors) + tuple(connection.channel_errors)
        except Exception:  # noqa: BLE001 - a transport that cannot say: the general ones
            pass
        return errors

    @property
    def _nacked(self) -> tuple[type[BaseException], ...]:
        try:
            # py-amqp, the client of RabbitMQ's confirms
            from amqp.exceptions import (  # type: ignore[import-untyped,unused-ignore]
                MessageNacked)
        except ImportError:
            return ()
        return (MessageNacked,)

    # -- helpers --------------------------------------------------------------

    def _where(self) -> str:
        return f"Celery broker {self.broker_url}"

    def _clean(self, exc: BaseException) -> str:
        return scrub(str(exc) or type(exc).__name__, self._password)

    def _error(self, exc: BaseException) -> CeleryPublishError:
        cause = exc.__cause__ or exc.__context__ or exc
        text = self._clean(exc)
        if any(word in f"{exc} {cause}" for word in (
                "ACCESS_REFUSED", "NOAUTH", "WRONGPASS", "Authentication required",
                "invalid password", "invalid username-password")):
            return CeleryConfigurationError(
                f"{self._where()} refused the login of user {self._user()!r} (check the user "
                "and password)", error_code="celery_access_refused")
        if "NOT_ALLOWED" in text or "vhost" in text:
            return CeleryConfigurationError(
                f"{self._where()} refused to open the virtual host of the URL for user "
                f"{self._user()!r} (it may not exist, or the user may not use it)",
                error_code="celery_vhost_refused")
        return CeleryUnavailableError(
            f"{self._where()} is unavailable: {type(exc).__name__}: {text}",
            error_code="celery_unavailable")

    def _user(self) -> str:
        return unquote(urlsplit(self._url).username or "default")


# ---------------------------------------------------------------------------
# Module helpers
# ---------------------------------------------------------------------------

def _import_client() -> Any:
    try:
        import celery  # type: ignore[import-untyped,import-not-found,unused-ignore]
        import kombu.exceptions  # noqa: F401 - what _failed reads
    except ImportError as exc:
        raise ImportError(
            f"CeleryPublisher needs the celery package ({exc}); install it with "
            f"{_INSTALL_HINT}") from exc
    return celery


def _app_config(timeout: float, confirms: bool) -> dict[str, Any]:
    """The app's settings: bounded connects and answers, no retries of our own (the relay
    retries), and on RabbitMQ publisher confirms."""
    options: dict[str, Any] = {"max_retries": 0}
    if confirms:
        options.update(confirm_publish=True, read_timeout=timeout, write_timeout=timeout)
    else:
        options.update(socket_timeout=timeout, socket_connect_timeout=timeout)
    return {"broker_connection_timeout": timeout, "broker_connection_retry": False,
            "broker_connection_retry_on_startup": False, "broker_transport_options": options,
            "task_serializer": "json", "accept_content": ["json"],
            "task_create_missing_queues": True}


def _close(state: list[Any]) -> None:
    connection = state[0]
    state[:] = [None, None]
    if connection is None:
        return
    try:
        connection.release()
    except Exception as exc:  # noqa: BLE001 - closing must not fail on a dead broker
        logger.debug("closing a Celery broker connection failed: %s", type(exc).__name__)


def _broker_url(url: Any) -> str:
    if not isinstance(url, str):
        raise InvalidEventError(f"broker_url must be a str, not {type(url).__name__}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in SCHEMES or not parts.hostname:
        raise InvalidEventError(
            f"broker_url {mask_url(url, 'broker')!r} is not a RabbitMQ or Redis URL "
            "(amqp://user:password@host:port/vhost, redis://[:password@]host:port/db; "
            "amqps://, rediss:// for TLS)")
    return url


# ---------------------------------------------------------------------------
# Its flags on `outbox-lite relay` (outbox_lite.publishers._binding)
# ---------------------------------------------------------------------------

def _from_flags(url: str, args: Any) -> CeleryPublisher:
    return CeleryPublisher(url, args.celery_task, queue=args.celery_queue)


CLI = Binding(
    "Celery",
    Flag("--celery-url", "URL",
         "send each event as a Celery task message through this broker, amqp://user:"
         "password@host:port/vhost (publisher confirms) or redis://[:password@]host:port/db "
         "(default: $OUTBOX_CELERY_URL); needs outbox-lite[celery] and --celery-task"),
    "OUTBOX_CELERY_URL",
    (Flag("--celery-task", "NAME",
          "the Celery task each event calls, with its payload as the one argument"),
     Flag("--celery-queue", "NAME", "the queue of the task messages (default: celery)")),
    _from_flags, rank=40)
