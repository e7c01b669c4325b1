"""BullMQ carries the headers and the trace (SPEC §11) to a Node worker: the README's snippet
(tests/node/bullmq_worker.js, BullMQ for Node with its own OpenTelemetry support, bullmq-otel)
reads every header in ``job.opts.outboxHeaders``, and its ``process`` span continues the
service's trace from ``opts.tm``. Node and its packages come from tests/node (``npm ci``
there, which this test runs once when they are missing)."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from outbox_lite.publishers import message_id
from outbox_lite.publishers.bullmq import BullMQPublisher
from outbox_lite.relay import Relay

from _redis import SHARED_REDIS

NODE = Path(__file__).resolve().parent / "node"


def _node_modules() -> None:
    """``npm ci`` in tests/node once, however many test runs start together (CI runs two)."""
    with open(NODE / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (NODE / "node_modules" / ".package-lock.json").is_file():
            npm = shutil.which("npm")
            assert npm, "npm is needed (Node 20+): the test runs the README's Node worker"
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE, check=True,
                           capture_output=True, timeout=600)


def _node_worker(queue: str, count: int) -> dict:
    _node_modules()
    ran = subprocess.run(["node", "bullmq_worker.js", queue, SHARED_REDIS, str(count)],
                         cwd=NODE, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr + ran.stdout
    return json.loads(ran.stdout.strip().splitlines()[-1])


def test_a_node_worker_reads_every_header_and_continues_the_trace(repo, queue):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("service").start_as_current_span("POST /orders") as service:
        with repo.database.atomic():
            traced = repo.create_in_transaction(
                event_type="order.paid", aggregate_type="order", aggregate_id="o-1",
                payload={"n": 1, "text": "naïve ☕"}, headers={"x-request-id": "r-1"})
    with repo.database.atomic():
        plain = repo.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                           aggregate_id="o-2", payload=[2])
    with BullMQPublisher(SHARED_REDIS, queue) as publisher:
        relay = Relay(repo, publisher, progress_every=0, tracer_provider=provider)
        assert relay.run_once().published == 2
    provider.shutdown()
    [create] = [s for s in exporter.get_finished_spans()
                if s.kind == SpanKind.PRODUCER and s.attributes["outbox.event_id"] == traced.id]

    out = _node_worker(queue, 2)
    seen = {job["id"]: job for job in out["seen"]}
    job = seen[message_id(traced)]
    assert (job["name"], job["data"]) == ("order.paid", {"n": 1, "text": "naïve ☕"})
    assert job["headers"] == {
        "x-request-id": "r-1",
        "traceparent": f"00-{create.context.trace_id:032x}-{create.context.span_id:016x}-"
                       f"{create.context.trace_flags:02x}"}
    # BullMQ's process span is in the service's trace, a child of the event's create span.
    service_trace = f"{service.get_span_context().trace_id:032x}"
    assert job["traceId"] == service_trace
    in_trace = [s for s in out["spans"] if s["traceId"] == service_trace]
    [process] = [s for s in in_trace if s["name"].startswith("process")]
    assert process["parentSpanId"] == f"{create.context.span_id:016x}", in_trace
    assert seen[message_id(plain)]["headers"] == {
        "traceparent": seen[message_id(plain)]["headers"]["traceparent"]}
