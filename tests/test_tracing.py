"""The trace crossing the outbox (SPEC §11), with the OpenTelemetry SDK and its in-memory
exporter: the context captured at the write, the relay's publish span (linked to each
creating context) and create spans (children of it), a consumer with the broker's own client
whose span continues the service's trace, a relay in a process of its own, and nothing
imported without the extra."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from outbox_lite import OutboxRepository, tracing
from outbox_lite.payload import MAX_HEADERS_BYTES
from outbox_lite.publishers import message_id
from outbox_lite.relay import Relay

from _brokers import SHARED_NATS, SHARED_RABBITMQ, amqp_channel, on_jetstream

HERE = Path(__file__).resolve().parent


@pytest.fixture
def spans():
    """A tracer provider of the test's own (never the global one) and its exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _traceparent(span: Any) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _create(repo: OutboxRepository, n: int = 0, **fields: Any) -> Any:
    with repo.database.atomic():
        return repo.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                          aggregate_id=f"o-{n}", payload={"n": n}, **fields)


class Keeper:
    """A publisher that keeps the headers of what it was given; fails those in ``fail``."""

    def __init__(self) -> None:
        self.headers: dict[int, dict[str, str]] = {}
        self.fail: dict[int, BaseException] = {}

    def publish(self, events):
        self.headers.update({e.id: dict(e.headers) for e in events})
        return {e.id: self.fail[e.id] for e in events if e.id in self.fail}

    def close(self):
        pass


class Refused(Exception):
    error_code = "refused"
    retryable = False


# ---------------------------------------------------------------------------
# Captured at the write
# ---------------------------------------------------------------------------

def test_the_current_span_is_stored_with_the_event(repo, fetch, spans):
    provider, _ = spans
    tracer = provider.get_tracer("service")
    with tracer.start_as_current_span("POST /orders") as span:
        event = _create(repo, 0, headers={"x-request-id": "r-1"})
    outside = _create(repo, 1)
    assert event.headers == {"x-request-id": "r-1", "traceparent": _traceparent(span)}
    assert outside.headers == {}
    stored = json.loads(fetch("SELECT headers FROM outbox_event WHERE id = %s",
                              event.id)[0]["headers"])
    assert stored == event.headers
    # The SDK's own propagator reads the stored context back as the service span's.
    context = TraceContextTextMapPropagator().extract(stored)
    assert trace.get_current_span(context).get_span_context().span_id == (
        span.get_span_context().span_id)


def test_tracestate_travels_and_a_given_context_wins(repo, spans):
    provider, _ = spans
    parent = trace.NonRecordingSpan(trace.SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
        trace_flags=trace.TraceFlags(1),
        trace_state=TraceState([("rojo", "00f067aa0ba902b7"), ("congo", "t61rcWkgMzE")])))
    with trace.use_span(parent):
        with provider.get_tracer("service").start_as_current_span("handler") as span:
            event = _create(repo, 0)
            given = _create(repo, 1, headers={"Traceparent": "00-" + "1" * 32 + "-"
                                                             + "2" * 16 + "-01"})
    assert event.headers == {"traceparent": _traceparent(span),
                             "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"}
    assert given.headers == {"Traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}


def test_no_room_left_drops_tracestate_then_traceparent(spans):
    provider, _ = spans
    state = TraceState([("vendor", "x" * 200)])
    parent = trace.NonRecordingSpan(trace.SpanContext(1, 2, True, trace.TraceFlags(1), state))
    full = {"big": "y" * (MAX_HEADERS_BYTES - 3 - 100)}  # room for traceparent (66), no more
    with trace.use_span(parent):
        assert set(tracing.capture(full)) == {"big", "traceparent"}
        assert tracing.capture({"big": "y" * (MAX_HEADERS_BYTES - 3)}) == {
            "big": "y" * (MAX_HEADERS_BYTES - 3)}
        assert set(tracing.capture({})) == {"traceparent", "tracestate"}


def test_without_the_extra_nothing_is_imported(db_url):
    """A process where opentelemetry cannot be imported: the write, the relay and the
    consumer's helper work, store no context and import nothing of it."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if the [otel] extra were not installed
        from outbox_lite import OutboxRepository, tracing
        from outbox_lite.relay import Relay
        from outbox_lite._families.url import DatabaseUrl
        db = DatabaseUrl.parse({db_url.secret_text()!r}).database()
        repo = OutboxRepository(db)
        with db.atomic():
            event = repo.create_in_transaction(event_type="t", aggregate_type="a",
                                               aggregate_id="1", payload={{}},
                                               headers={{"x": "1"}})
        class Keep:
            def publish(self, events):
                self.seen = [dict(e.headers) for e in events]
                return {{}}
            def close(self):
                pass
        keep = Keep()
        relay = Relay(repo, keep, progress_every=0)
        assert relay.tracer is None and relay.run_once().published == 1
        with tracing.consume({{"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}}) as s:
            assert s is None
        assert event.headers == {{"x": "1"}} and keep.seen == [{{"x": "1"}}]
        assert [m for m in sys.modules if m.startswith("opentelemetry")] == ["opentelemetry"]
        print("ok")
    """)
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=HERE)
    assert ran.stdout.strip() == "ok", ran.stderr


# ---------------------------------------------------------------------------
# The relay's spans
# ---------------------------------------------------------------------------

def test_the_publish_span_links_each_creating_context_and_each_message_continues_it(
        repo, spans):
    provider, exporter = spans
    service = provider.get_tracer("service")
    with service.start_as_current_span("POST /orders") as first:
        a = _create(repo, 0)
    with service.start_as_current_span("POST /refunds") as second:
        b = _create(repo, 1)
    c = _create(repo, 2)  # written outside any trace
    exporter.clear()
    keeper = Keeper()
    keeper.fail[b.id] = Refused("no")
    relay = Relay(repo, keeper, progress_every=0, tracer_provider=provider)
    assert relay.run_once().claimed == 3
    finished = exporter.get_finished_spans()
    [publish] = [s for s in finished if s.kind == SpanKind.CLIENT]
    creates = {s.attributes["outbox.event_id"]: s for s in finished
               if s.kind == SpanKind.PRODUCER}
    assert publish.name == "publish Keeper" and set(creates) == {a.id, b.id, c.id}
    assert publish.attributes["messaging.batch.message_count"] == 3
    assert publish.attributes["messaging.operation.type"] == "send"
    # One link per event written in a trace, to the span that wrote it.
    assert {(link.context.trace_id, link.context.span_id) for link in publish.links} == {
        (s.get_span_context().trace_id, s.get_span_context().span_id)
        for s in (first, second)}
    for event, writer in ((a, first), (b, second)):
        create = creates[event.id]
        assert create.name == "create Keeper"
        assert create.context.trace_id == writer.get_span_context().trace_id
        assert create.parent.span_id == writer.get_span_context().span_id
        assert [link.context.span_id for link in create.links] == [publish.context.span_id]
        assert create.attributes["messaging.message.id"] == message_id(event)
        # The message carries the create span: the consumer's span becomes its child.
        assert keeper.headers[event.id] == {"traceparent": _traceparent_of(create)}
    assert creates[c.id].parent.span_id == publish.context.span_id  # no context: the batch's
    assert keeper.headers[c.id] == {"traceparent": _traceparent_of(creates[c.id])}
    assert creates[b.id].status.status_code == StatusCode.ERROR
    assert creates[b.id].attributes["error.type"] == "refused"
    assert creates[a.id].status.status_code == StatusCode.UNSET
    assert publish.status.status_code == StatusCode.ERROR
    # What is stored is what the service wrote: the relay only changes what it sends.
    assert [e.headers for e in repo.model.select().order_by(repo.model.id)][:1] == [
        {"traceparent": _traceparent(first)}]


def _traceparent_of(span: Any) -> str:
    return (f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-"
            f"{span.context.trace_flags:02x}")


def test_a_publish_that_raises_ends_every_span_with_its_error(repo, spans):
    provider, exporter = spans

    class Down:
        def publish(self, events):
            raise ConnectionError("broker down")

        def close(self):
            pass

    _create(repo, 0)
    relay = Relay(repo, Down(), progress_every=0, tracer_provider=provider,
                  reconnect_pause=0.01)
    assert relay.run_once().publish_errors == 1
    finished = exporter.get_finished_spans()
    assert len(finished) == 2
    assert {s.status.status_code for s in finished} == {StatusCode.ERROR}
    assert {s.attributes["error.type"] for s in finished} == {"ConnectionError"}


@pytest.mark.parametrize("how", ["tracing off", "API without an SDK"])
def test_without_recorded_spans_the_stored_context_travels(repo, spans, how):
    provider, exporter = spans
    with provider.get_tracer("service").start_as_current_span("POST /orders") as span:
        event = _create(repo, 0)
    exporter.clear()
    keeper = Keeper()
    options = ({"tracing": False, "tracer_provider": provider} if how == "tracing off" else
               {"tracer_provider": trace.NoOpTracerProvider()})
    relay = Relay(repo, keeper, progress_every=0, **options)
    assert (relay.tracer is None) == (how == "tracing off")
    relay.run_once()
    assert keeper.headers == {event.id: {"traceparent": _traceparent(span)}}
    assert exporter.get_finished_spans() == ()


# ---------------------------------------------------------------------------
# Across processes and brokers
# ---------------------------------------------------------------------------

def _relay_process(db_url, out: Path, *broker: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HERE / "_traced_relay.py"), str(out), "relay",
                           "--database-url", db_url.secret_text(), *broker, "--until-empty"], capture_output=True, text=True,
                          timeout=120, cwd=HERE)


def _spans_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _hex(value: str) -> int:
    return int(value, 16)


@pytest.mark.parametrize("broker", ["rabbitmq", "nats"])
def test_the_trace_crosses_the_outbox_to_a_consumer(repo, db_url, spans, exchange, stream,
                                                    tmp_path, broker):
    """A service span writes the event; a relay in another process publishes it; a consumer
    with the broker's own client continues the trace: its span's trace id is the service
    span's, its parent the event's create span; the publish span links to the service span."""
    provider, exporter = spans
    with provider.get_tracer("service").start_as_current_span("POST /orders") as service:
        event = _create(repo, 0)
    service_context = service.get_span_context()
    out = tmp_path / "relay-spans.jsonl"
    flags = (["--rabbitmq-url", SHARED_RABBITMQ, "--exchange", exchange.name]
             if broker == "rabbitmq" else
             ["--nats-url", SHARED_NATS, "--subject-prefix", stream.prefix])
    ran = _relay_process(db_url, out, *flags)
    assert ran.returncode == 0, ran.stderr
    headers = _received_headers(broker, exchange, stream)
    exporter.clear()
    with tracing.consume(headers, "orders", system=broker, message_id=message_id(event),
                         tracer_provider=provider):
        pass
    [consumer] = exporter.get_finished_spans()
    assert consumer.kind == SpanKind.CONSUMER and consumer.name == "process orders"
    assert consumer.context.trace_id == service_context.trace_id
    relay_spans = _spans_of(out)
    [publish] = [s for s in relay_spans if s["kind"] == "SpanKind.CLIENT"]
    [create] = [s for s in relay_spans if s["kind"] == "SpanKind.PRODUCER"]
    assert _hex(create["context"]["trace_id"]) == service_context.trace_id
    assert _hex(create["parent_id"]) == service_context.span_id
    assert consumer.parent.span_id == _hex(create["context"]["span_id"])
    assert [link.context.span_id for link in consumer.links] == [consumer.parent.span_id]
    assert [(_hex(link["context"]["trace_id"]), _hex(link["context"]["span_id"]))
            for link in publish["links"]] == [(service_context.trace_id,
                                              service_context.span_id)]
    assert publish["attributes"]["messaging.system"] == broker


def _received_headers(broker: str, exchange: Any, stream: Any) -> dict[str, Any]:
    if broker == "rabbitmq":  # pika, RabbitMQ's own Python client
        connection, channel = amqp_channel()
        try:
            for _ in range(100):
                method, props, _ = channel.basic_get(exchange.queue, auto_ack=True)
                if method is not None:
                    return dict(props.headers)
                time.sleep(0.05)
        finally:
            connection.close()
        raise AssertionError("no message")

    async def read(js):  # nats-py, NATS's own Python client
        sub = await js.pull_subscribe(f"{stream.prefix}.>", stream=stream.name)
        [msg] = await sub.fetch(1, timeout=10)
        await msg.ack()
        await sub.unsubscribe()
        return dict(msg.headers)

    return on_jetstream(SHARED_NATS, read)
