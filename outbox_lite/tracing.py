"""Trace context across the outbox (SPEC §11), with OpenTelemetry: the only module that imports
``opentelemetry`` (the ``[otel]`` extra, ``opentelemetry-api``), and only when it is installed.

Three places take part, and the trace of a service's request goes on through all of them:

* **writing**: :func:`capture` adds the W3C ``traceparent`` (and ``tracestate``) of the span
  current in the service to the event's headers, unless the caller gave them;
  :meth:`~outbox_lite.OutboxRepository.create_in_transaction` calls it, so the context is
  the one of the service's transaction, not of the relay that publishes minutes later.
* **publishing**: :class:`PublishTracer` records, per batch, a ``publish <destination>`` span
  (kind CLIENT, ``messaging.operation.type`` ``send``) with a link to each event's creating
  context, and per event a ``create <destination>`` span (kind PRODUCER), a child of that
  event's creating context (of the publish span when the event has none) with a link to the
  publish span. The message carries the create span's ``traceparent``: the consumer's span
  becomes a child of the event's own publish, in the service's trace. This follows the
  OpenTelemetry semantic conventions for messaging (a batch publish, "create" spans per
  message, the creation context propagated in the message).
* **consuming**: :func:`consume` starts the consumer's ``process <destination>`` span (kind
  CONSUMER) as a child of the message's ``traceparent``, with a link to it, beside
  :meth:`outbox_lite.Inbox.accept`.

Only ``traceparent`` and ``tracestate`` travel (the W3C Trace Context propagator, not the
global one: W3C baggage could carry anything a service put in it). Without the extra every
function here does nothing and nothing is imported; with the API but no SDK configured the
spans are no-ops and the headers are what the service stored.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Any, Iterator, Mapping, Sequence

from ._version import __version__
from .payload import MAX_HEADERS, MAX_HEADERS_BYTES, headers_size

logger = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_INSTRUMENTATION = "outbox_lite"
_UNSET: Any = object()
_api: Any = _UNSET  # the opentelemetry modules, None when not installed (read once)


def _otel() -> Any:
    """``opentelemetry``'s trace API and the W3C propagator, or None without the extra."""
    global _api
    if _api is _UNSET:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            _api = None
        else:
            _api = (trace, TraceContextTextMapPropagator())
    return _api


def available() -> bool:
    """Whether ``opentelemetry-api`` is installed (the ``[otel]`` extra)."""
    return _otel() is not None


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------

def capture(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the current span's ``traceparent`` (and ``tracestate``) added, unless
    a header of that name (in any case) is there already; as given without the extra or a
    valid current span. Added only within the headers' bounds (SPEC §11): ``tracestate``
    is left out first, then ``traceparent``, each with a debug line."""
    api = _otel()
    if api is None:
        return headers
    context = api[0].get_current_span().get_span_context()
    if not context.is_valid:
        return headers
    if headers and any(name.lower() in (TRACEPARENT, TRACESTATE) for name in headers):
        return headers
    added = dict(headers)
    added[TRACEPARENT] = (f"00-{context.trace_id:032x}-{context.span_id:016x}-"
                          f"{context.trace_flags:02x}")
    state = context.trace_state.to_header() if context.trace_state else ""
    if state:
        added[TRACESTATE] = state
    while len(added) > MAX_HEADERS or headers_size(added) > MAX_HEADERS_BYTES:
        dropped = TRACESTATE if TRACESTATE in added else TRACEPARENT
        logger.debug("no room left in the event's headers for %s: not stored", dropped)
        del added[dropped]
        if dropped == TRACEPARENT:
            break
    return added


# ---------------------------------------------------------------------------
# Publishing
# ---------------------------------------------------------------------------

def publisher_target(publisher: Any) -> tuple[str, str]:
    """(``messaging.system``, destination) a publisher says of itself (its
    ``messaging_system`` and ``destination`` attributes), else ("outbox_lite", its class)."""
    system = getattr(publisher, "messaging_system", None)
    destination = getattr(publisher, "destination", None)
    return (system if isinstance(system, str) else "outbox_lite",
            destination if isinstance(destination, str) else type(publisher).__name__)


class PublishTracer:
    """The relay's spans (see the module docstring), from ``tracer_provider`` (None: the
    global one the service or ``opentelemetry-instrument`` set up). Needs the extra."""

    def __init__(self, publisher: Any, tracer_provider: Any = None) -> None:
        api = _otel()
        if api is None:
            raise ImportError("tracing needs the opentelemetry-api package; install it with "
                              "pip install 'outbox-lite[otel]'")

        self._trace, self._propagator = api
        self._tracer = self._trace.get_tracer(_INSTRUMENTATION, __version__, tracer_provider)
        self.system, self.destination = publisher_target(publisher)
        self._common = {"messaging.system": self.system,
                        "messaging.destination.name": self.destination}

    @contextlib.contextmanager
    def publish(self, events: Sequence[Any]) -> Iterator[_Batch]:
        """Spans around one batch's publish: yields a :class:`_Batch` whose ``events`` are
        copies of ``events`` carrying their create span's context; give its ``finish`` the
        publisher's failures (a publish that raises ends every span with that error). When
        the batch span does not record (no SDK, or not sampled), nothing more is done: the
        events go as they are, with the context their service stored."""
        trace = self._trace
        batch_span = self._tracer.start_span(
            f"publish {self.destination}", kind=trace.SpanKind.CLIENT,
            attributes={**self._common, "messaging.operation.type": "send",
                        "messaging.operation.name": "publish",
                        "messaging.batch.message_count": len(events)},
            record_exception=False, set_status_on_exception=False)
        batch = _Batch(trace, batch_span)
        if not batch_span.is_recording():
            batch.events = list(events)
            try:
                yield batch
            finally:
                batch_span.end()
            return
        batch_link = [trace.Link(batch_span.get_span_context())]
        try:
            for event in events:
                creating = self._creating_context(event)
                if creating is not None:
                    batch_span.add_link(creating, {"outbox.event_id": event.id})
                parent = trace.set_span_in_context(
                    trace.NonRecordingSpan(creating) if creating is not None else batch_span)
                span = self._tracer.start_span(
                    f"create {self.destination}", context=parent,
                    kind=trace.SpanKind.PRODUCER, links=batch_link, attributes={
                        **self._common, "messaging.operation.type": "create",
                        "messaging.message.id": _message_id(event),
                        "outbox.event_id": event.id},
                    record_exception=False, set_status_on_exception=False)
                batch.add(event, span, self._outgoing(event, span))
            yield batch
        except BaseException as exc:
            batch.finish_all(exc)
            raise
        finally:
            batch.end()

    def _creating_context(self, event: Any) -> Any:
        """The span context stored with ``event`` at its write, or None (the W3C
        propagator's reading of its ``traceparent`` and ``tracestate``)."""
        headers = event.headers
        if not headers or TRACEPARENT not in headers:
            return None
        context = self._propagator.extract(headers)
        span_context = self._trace.get_current_span(context).get_span_context()
        return span_context if span_context.is_valid else None

    def _outgoing(self, event: Any, span: Any) -> Any:
        """A copy of ``event`` whose headers carry ``span``'s context (``event`` itself when
        the span is a no-op: the stored context then travels as it is)."""
        if not span.get_span_context().is_valid:
            return event
        headers = {name: value for name, value in event.headers.items()
                   if name.lower() not in (TRACEPARENT, TRACESTATE)}
        self._propagator.inject(headers, context=self._trace.set_span_in_context(span))
        outgoing = copy.copy(event)
        outgoing.__data__ = {**event.__data__, "headers": headers}
        return outgoing


class _Batch:
    """The spans of one batch being published."""

    def __init__(self, trace: Any, span: Any) -> None:
        self._trace = trace
        self._span = span
        self._spans: dict[int, Any] = {}
        #: What the publisher is given: the events with their messages' trace context.
        self.events: list[Any] = []

    def add(self, event: Any, span: Any, outgoing: Any) -> None:
        self._spans[event.id] = span
        self.events.append(outgoing)

    def finish(self, failures: Mapping[int, BaseException]) -> None:
        """Mark the events that failed (their error code), and the batch when any did."""
        for event_id, exc in failures.items():
            span = self._spans.get(event_id)
            if span is not None:
                _failed(self._trace, span, exc)
        if failures:
            self._span.set_attribute("outbox.failed_count", len(failures))
            self._span.set_status(self._trace.Status(
                self._trace.StatusCode.ERROR, f"{len(failures)} of {len(self._spans)} failed"))

    def finish_all(self, exc: BaseException) -> None:
        """The whole publish raised."""
        for span in self._spans.values():
            _failed(self._trace, span, exc)
        _failed(self._trace, self._span, exc)

    def end(self) -> None:
        for span in self._spans.values():
            span.end()
        self._span.end()


def _failed(trace: Any, span: Any, exc: BaseException) -> None:
    code = getattr(exc, "error_code", None)
    span.set_attribute("error.type", code if isinstance(code, str) else type(exc).__name__)
    span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))


def _message_id(event: Any) -> str:
    from .publishers import message_id

    return message_id(event)


# ---------------------------------------------------------------------------
# Consuming
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def consume(headers: Mapping[str, Any] | None, destination: str = "outbox", *,
            system: str | None = None, message_id: str | None = None,
            tracer_provider: Any = None) -> Iterator[Any]:
    """Continue the trace of a message on the consumer's side: a ``process <destination>``
    span (kind CONSUMER), a child of the message's ``traceparent`` with a link to it, made
    current inside the ``with``; yields it (None without the extra). ``headers`` are the
    message's (AMQP headers, NATS headers, or
    :func:`outbox_lite.publishers.bullmq.job_headers`; bytes values are read as UTF-8);
    without a ``traceparent`` the span starts where the consumer is. Use it around the
    consumer's transaction, the one that calls :meth:`~outbox_lite.Inbox.accept`::

        with outbox_lite.tracing.consume(message.headers, "orders"):
            with db.atomic():
                if inbox.accept(message_id):
                    apply(message)
    """
    api = _otel()
    if api is None:
        yield None
        return
    trace, propagator = api
    carrier: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if isinstance(name, str) and name.lower() in (TRACEPARENT, TRACESTATE):
            if isinstance(value, (bytes, bytearray)):
                value = bytes(value).decode("utf-8", "replace")
            if isinstance(value, str):
                carrier[name.lower()] = value
    parent = propagator.extract(carrier) if carrier else None
    linked = trace.get_current_span(parent).get_span_context() if parent is not None else None
    links = [trace.Link(linked)] if linked is not None and linked.is_valid else []
    attributes: dict[str, Any] = {"messaging.operation.type": "process",
                                  "messaging.operation.name": "process",
                                  "messaging.destination.name": destination}
    if system:
        attributes["messaging.system"] = system
    if message_id:
        attributes["messaging.message.id"] = message_id
    tracer = trace.get_tracer(_INSTRUMENTATION, None, tracer_provider)
    with tracer.start_as_current_span(f"process {destination}", context=parent,
                                      kind=trace.SpanKind.CONSUMER, links=links,
                                      attributes=attributes) as span:
        yield span
