"""``outbox-lite relay`` in a process of its own with the OpenTelemetry SDK set up, as a
service would with ``opentelemetry-instrument``: every span it ends is written as one line of
JSON to the file named first; the rest of the arguments are the command's."""

from __future__ import annotations

import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from outbox_lite.cli import main

if __name__ == "__main__":
    out = open(sys.argv[1], "a", encoding="utf-8", buffering=1)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=out, formatter=lambda span: span.to_json(indent=None) + "\n")))
    trace.set_tracer_provider(provider)
    try:
        code = main(sys.argv[2:])
    finally:
        provider.shutdown()
        out.close()
    sys.exit(code)
