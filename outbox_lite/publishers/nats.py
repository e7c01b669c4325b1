"""NATS JetStream publisher: one JetStream message per outbox event (the ``[nats]`` extra,
the ``nats-py`` client).

The message is a contract, because consumers rely on it:

* **subject**: ``<subject_prefix>.<event_type>``;
* **data**: the payload's JSON text, UTF-8 (:func:`outbox_lite.publishers.message_body`);
* **headers**: every header of the event (``event.headers``: a ``traceparent`` among them when
  the service wrote it in a trace, SPEC §11; a NATS header name cannot hold ``:``, so each
  ``:`` of a name travels as ``%3A``, which no header name holds otherwise), then
  ``Nats-Msg-Id`` =
  :func:`outbox_lite.publishers.message_id` (the same on every publish of the event, so the
  stream's duplicate window drops a republish), ``Outbox-Event-Id`` (the event's id, in
  decimal), ``Outbox-Event-Type``, ``Outbox-Aggregate-Type``, ``Outbox-Aggregate-Id``;
* with ``cloudevents=True``, the binary content mode of the CloudEvents NATS binding (since
  NATS 2.2, as the HTTP binding does it): the context attributes
  (:func:`outbox_lite.publishers.cloudevent_attributes`) as headers ``ce-specversion``,
  ``ce-id``, ``ce-source``, ``ce-type``, ``ce-subject``, ``ce-time``, each value
  percent-encoded where the binding says (space, ``"``, ``%`` and anything outside printable
  ASCII), ``datacontenttype`` as ``content-type: application/json``, and the data unchanged.

An event counts as published only once the stream acknowledged it (its ``PubAck``); the acks of
a batch are awaited together, not one round trip per event. An ack that says ``duplicate``
(the stream had the message id within its duplicate window: a republish) counts as published.
Per event: an ``event_type`` that makes no valid subject (white space, an empty token, ``*`` or
``>``) is a non-retryable failure ``invalid_subject``; a subject no stream captures is a
retryable ``no_stream``; a message the stream refuses (its limits) a retryable
``jetstream_rejected``; data larger than the server's ``max_payload`` a non-retryable
``too_large``. A lost connection, or acks that do not come within ``timeout``, fail the whole
batch (``publish`` raises); ``ping()`` connects again. The publisher does not let the client
reconnect on its own behind its back: it connects when asked, so a broker that is down fails
at once, with its reason.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from .. import _checks
from ..errors import InvalidEventError
from ..models import OutboxEvent
from . import BrokerUnavailableError, PublishError, cloudevent_attributes, message_body, message_id
from . import cloudevents_source as _cloudevents_source
from ._binding import Binding, Flag
from ._loop import ConnectionPublisher, timeout_option
from ._url import mask_url, password_of, scrub

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0
_SCHEMES = ("nats", "tls", "ws", "wss")
_INSTALL_HINT = "pip install 'outbox-lite[nats]'"
#: What a subject token must not contain besides white space and control characters.
_NOT_IN_TOKEN = frozenset(".*>")


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

class NATSPublishError(PublishError):
    """Publishing to JetStream failed; ``error_code`` and ``retryable`` say what the relay
    records."""

    code = "nats_error"


class NATSUnavailableError(NATSPublishError, BrokerUnavailableError):
    """The server was unreachable, the connection was lost, or the acks did not come in time:
    the whole batch failed (retryable)."""


class NATSConfigurationError(NATSUnavailableError):
    """The server refused the login, has no JetStream, or no stream captures the subjects: no
    publish can succeed until someone changes the server or the settings."""


class NATSMessageError(NATSPublishError):
    """JetStream did not take one message (see the module docstring for the codes)."""


@functools.lru_cache(maxsize=4096)  # a service has few event types: checked once each
def subject_error(subject: str) -> str | None:
    """Why ``subject`` is not a subject one can publish to, or None when it is one."""
    if not subject:
        return "it is empty"
    for token in subject.split("."):
        if not token:
            return "it has an empty token (a leading, trailing or double '.')"
        if any(c in _NOT_IN_TOKEN or c.isspace() or not c.isprintable() for c in token):
            return "it holds white space, a control character, '*' or '>'"
    return None


# ---------------------------------------------------------------------------
# The publisher
# ---------------------------------------------------------------------------

class NATSPublisher(ConnectionPublisher):
    """Publishes outbox events to NATS JetStream at ``servers`` (``nats://[user:password@]
    host:port``, several in a list or separated by commas), on subjects
    ``<subject_prefix>.<event_type>``.

    ``publish(events)`` publishes one message per event (see the module docstring), awaits all
    their acks and returns the failures by event id (empty: all stored); it raises
    :class:`NATSUnavailableError` when the connection is lost or the acks take longer than
    ``timeout`` seconds. ``ping()`` connects if needed and checks that a stream captures
    ``<subject_prefix>.>`` (:class:`NATSConfigurationError` when none does).

    The asyncio client runs on one event loop, in a daemon thread the publisher owns. Calls from
    several threads go one batch at a time: give each relay thread a publisher of its own. Use
    it as a context manager, or call :meth:`close`.
    """

    broker = "NATS"
    code = "nats"
    messaging_system = "nats"  # OpenTelemetry's name (outbox_lite.tracing)
    unavailable = NATSUnavailableError

    def __init__(self, servers: str | Sequence[str], subject_prefix: str, *,
                 timeout: float = DEFAULT_TIMEOUT, cloudevents: bool = False,
                 cloudevents_source: str | None = None) -> None:
        self.cloudevents = _checks.flag("cloudevents", cloudevents)
        self.cloudevents_source = _cloudevents_source(cloudevents_source)
        self._servers = _server_urls(servers)
        self.subject_prefix = _checks.name("subject_prefix", subject_prefix)
        why = subject_error(self.subject_prefix)
        if why:
            raise InvalidEventError(f"subject_prefix {subject_prefix!r} is not a subject: {why}")
        self.destination = self.subject_prefix
        self.timeout = timeout_option(timeout)
        self._passwords = [password_of(url) for url in self._servers]
        # Safe to show: passwords (and tokens) masked.
        self.servers = ",".join(mask_url(url, "NATS") for url in self._servers)
        self._nats = _import_client()
        self._start(f"outbox-nats-{self.subject_prefix}", _close)  # state: [client, jetstream]

    def __repr__(self) -> str:
        return f"<NATSPublisher subjects='{self.subject_prefix}.>' servers={self.servers!r}>"

    # -- the Publisher protocol ---------------------------------------------

    def publish(self, events: Sequence[OutboxEvent]) -> Mapping[int, BaseException]:
        """Publish one message per event and await every ack; return the failures by event id
        (empty: all stored). Raises :class:`NATSUnavailableError` (retryable) when the
        connection is lost or an ack does not come within ``timeout``."""
        if not events:
            return {}
        failures: dict[int, BaseException] = {}
        messages = []
        for e in events:
            subject = f"{self.subject_prefix}.{e.event_type}"
            why = subject_error(e.event_type)
            if why:
                failures[e.id] = NATSMessageError(
                    f"event_type {e.event_type!r} makes no valid NATS subject: {why}",
                    error_code="invalid_subject", retryable=False)
                continue
            messages.append((e, subject, message_body(e), self._headers(e)))
        if messages:
            failures.update(self._run(lambda: self._publish(messages)))
        return failures

    def _headers(self, event: OutboxEvent) -> dict[str, str]:
        """The message's headers (see the module docstring)."""
        headers = {name.replace(":", "%3A") if ":" in name else name: value
                   for name, value in event.headers.items()}
        headers.update({
            "Nats-Msg-Id": message_id(event), "Outbox-Event-Id": str(event.id),
            "Outbox-Event-Type": event.event_type, "Outbox-Aggregate-Type": event.aggregate_type,
            "Outbox-Aggregate-Id": event.aggregate_id})
        if self.cloudevents:
            for name, value in cloudevent_attributes(event, self.cloudevents_source).items():
                headers["ce-" + name] = _percent_encoded(value)
            headers["content-type"] = "application/json"
        return headers

    def ping(self) -> None:
        """Connect if needed and check that a stream captures ``<subject_prefix>.>``: raises
        :class:`NATSConfigurationError` for a refused login, no JetStream or no stream,
        :class:`NATSUnavailableError` when the server cannot be reached."""
        self._run(self._ping)

    def _client_errors(self) -> tuple[type[BaseException], ...]:
        return (self._nats.errors.Error,)

    # -- inside the event loop ------------------------------------------------

    async def _jetstream(self) -> Any:
        """The JetStream context, connecting first when there is no open connection."""
        client, jetstream = self._state
        if client is not None and client.is_connected:
            return jetstream
        self._state[:] = [None, None]
        if client is not None:
            await _close([client, None])
        seen: list[BaseException] = []

        async def note(exc: Exception) -> None:
            # The client's own callback logs a traceback at ERROR; the publisher reports
            # failures itself, with the reason noted here.
            seen.append(exc)
            logger.debug("NATS client error: %s", type(exc).__name__)

        try:
            # One try per server (max_reconnect_attempts=1 allows two, 0.1 s apart): a server
            # that is down fails at once; the relay's ping() loop does the waiting.
            client = await self._nats.connect(
                servers=self._servers, connect_timeout=max(1, round(self.timeout)),
                allow_reconnect=False, max_reconnect_attempts=1, reconnect_time_wait=0.1,
                error_cb=note, name="outbox-lite")
        except self._nats.errors.NoServersError:
            if seen:
                raise seen[-1] from None
            raise
        self._state[:] = [client, client.jetstream(timeout=self.timeout)]
        return self._state[1]

    async def _ping(self) -> None:
        jetstream = await self._jetstream()
        subjects = f"{self.subject_prefix}.>"
        errors = self._nats.js.errors
        try:
            await jetstream.find_stream_name_by_subject(subjects)
        except errors.NotFoundError:
            raise NATSConfigurationError(
                f"{self._where()}: no JetStream stream captures subjects {subjects!r} (add "
                f"one, e.g. nats stream add --subjects '{subjects}')",
                error_code="nats_no_stream") from None
        except (self._nats.errors.NoRespondersError, errors.ServiceUnavailableError):
            raise NATSConfigurationError(
                f"{self._where()}: JetStream is not enabled on the server (nats-server -js)",
                error_code="nats_no_jetstream") from None

    async def _publish(self, messages: list[tuple[OutboxEvent, str, bytes, dict[str, str]]],
                       ) -> dict[int, BaseException]:
        nats = self._nats
        jetstream = await self._jetstream()
        results = await asyncio.gather(
            *(jetstream.publish(subject, body, timeout=self.timeout, headers=headers)
              for _, subject, body, headers in messages),
            return_exceptions=True)
        failures: dict[int, BaseException] = {}
        for (event, subject, _, _), result in zip(messages, results):
            if isinstance(result, nats.js.api.PubAck):
                continue  # stored, or a duplicate of a stored one
            if isinstance(result, nats.js.errors.NoStreamResponseError):
                failures[event.id] = NATSMessageError(
                    f"{self._where()}: no JetStream stream captures subject {subject!r}",
                    error_code="no_stream")
            elif isinstance(result, nats.js.errors.APIError):
                failures[event.id] = NATSMessageError(
                    f"{self._where()}: the stream refused the message on {subject!r}: "
                    f"{scrub(result.description or type(result).__name__, *self._passwords)}"
                    f" (JetStream error {result.err_code})", error_code="jetstream_rejected")
            elif isinstance(result, nats.errors.MaxPayloadError):
                failures[event.id] = NATSMessageError(
                    f"{self._where()}: the message is larger than the server's max_payload",
                    error_code="too_large", retryable=False)
            elif isinstance(result, BaseException):  # the connection is gone, or no ack
                raise self._error(result)
            else:
                failures[event.id] = NATSMessageError(
                    f"{self._where()}: no ack for the message ({type(result).__name__})",
                    error_code="unacknowledged")
        return failures

    # -- helpers --------------------------------------------------------------

    def _where(self) -> str:
        return f"NATS at {self.servers}"

    def _error(self, exc: BaseException) -> NATSPublishError:
        errors = self._nats.errors
        text = scrub(str(exc) or type(exc).__name__, *self._passwords)
        if isinstance(exc, (errors.AuthorizationError, errors.InvalidUserCredentialsError)) or (
                "authorization violation" in str(exc).lower()):  # how nats-py 2.x says it
            return NATSConfigurationError(
                f"{self._where()} refused the login (check the user and password, or token)",
                error_code="nats_access_refused")
        if isinstance(exc, (asyncio.TimeoutError, errors.TimeoutError)):
            return NATSUnavailableError(f"{self._where()}: no ack within {self.timeout:g} s",
                                        error_code="nats_timeout")
        return NATSUnavailableError(
            f"{self._where()} is unavailable: {type(exc).__name__}: {text}",
            error_code="nats_unavailable")


# ---------------------------------------------------------------------------
# Module helpers
# ---------------------------------------------------------------------------

def _import_client() -> Any:
    try:
        import nats  # type: ignore[import-not-found,unused-ignore]
        import nats.errors  # type: ignore[import-not-found,unused-ignore]
        import nats.js.api  # type: ignore[import-not-found,unused-ignore]
        import nats.js.errors  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise ImportError(
            f"NATSPublisher needs the nats-py package ({exc}); install it with {_INSTALL_HINT}"
        ) from exc
    return nats


def _percent_encoded(value: str) -> str:
    """A CloudEvents attribute as a header value: space, '"', '%' and every character outside
    printable ASCII percent-encoded as UTF-8 (the HTTP binding's rule, which the NATS
    binding's binary mode follows)."""
    if all("!" <= c <= "~" and c not in '"%' for c in value):
        return value
    return "".join(c if "!" <= c <= "~" and c not in '"%' else
                   "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in value)


async def _close(state: list[Any]) -> None:
    client = state[0]
    if client is None or client.is_closed:
        return
    try:
        await asyncio.wait_for(client.close(), 5)
    except BaseException as exc:  # noqa: BLE001 - closing must not fail on a dead server
        logger.debug("closing a NATS connection failed: %s", type(exc).__name__)


def _server_urls(servers: Any) -> list[str]:
    if isinstance(servers, str):
        urls = [s.strip() for s in servers.split(",")]
    elif isinstance(servers, Sequence) and all(isinstance(s, str) for s in servers):
        urls = [s.strip() for s in servers]
    else:
        raise InvalidEventError(
            f"servers must be a URL or a list of URLs, not {type(servers).__name__}")
    if not urls or not all(urls):
        raise InvalidEventError("servers must name at least one NATS URL, none empty")
    for url in urls:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
            ok = parts.scheme in _SCHEMES and bool(parts.hostname)
        except ValueError:
            ok = False
        if not ok:
            raise InvalidEventError(
                f"{mask_url(url, 'NATS')!r} is not a NATS URL (nats://[user:password@]host:port;"
                " tls://, ws:// or wss:// too)")
    return urls


# ---------------------------------------------------------------------------
# Its flags on `outbox-lite relay` (outbox_lite.publishers._binding)
# ---------------------------------------------------------------------------

def _from_flags(url: str, args: Any) -> NATSPublisher:
    return NATSPublisher(url, args.subject_prefix, cloudevents=args.cloudevents,
                         cloudevents_source=args.cloudevents_source)


CLI = Binding(
    "NATS",
    Flag("--nats-url", "URL",
         "publish to NATS JetStream, nats://[user:password@]host:port, several "
         "separated by commas (default: $OUTBOX_NATS_URL); needs "
         "outbox-lite[nats] and --subject-prefix"),
    "OUTBOX_NATS_URL",
    (Flag("--subject-prefix", "PREFIX",
          "publish each event to PREFIX.<event_type> (a JetStream stream must "
          "capture PREFIX.>)"),),
    _from_flags, rank=30, cloudevents=True)
