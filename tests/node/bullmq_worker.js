// The README's Node worker for jobs the outbox's BullMQPublisher added: BullMQ's own
// OpenTelemetry support (bullmq-otel) continues the trace from the job's options (opts.tm),
// and job.opts.outboxHeaders holds every header of the event.
//
//   node bullmq_worker.js QUEUE REDIS_URL COUNT
//
// It processes COUNT jobs, then prints one JSON line: what each job saw, and the spans the
// worker's SDK recorded (an in-memory exporter, for the test that runs it).
'use strict';
const { Worker } = require('bullmq');
const { BullMQOtel } = require('bullmq-otel');
const { context, propagation, trace } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const { W3CTraceContextPropagator } = require('@opentelemetry/core');
const {
  BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor,
} = require('@opentelemetry/sdk-trace-base');

const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(
  new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
propagation.setGlobalPropagator(new W3CTraceContextPropagator());
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

const [queue, redisUrl, count] = process.argv.slice(2);
const url = new URL(redisUrl);
const seen = [];

// --- the snippet -------------------------------------------------------------------------
const worker = new Worker(queue, async (job) => {
  const headers = job.opts.outboxHeaders ?? {};  // every header of the outbox event
  const span = trace.getActiveSpan();             // BullMQ's "process" span, in the trace
  seen.push({ id: job.id, name: job.name, data: job.data, headers,
              traceId: span?.spanContext().traceId });
}, {
  connection: { host: url.hostname, port: Number(url.port || 6379) },
  telemetry: new BullMQOtel('orders-worker'),
});
// ------------------------------------------------------------------------------------------

const deadline = setTimeout(() => finish(1), 20000);
worker.on('completed', () => { if (seen.length >= Number(count)) finish(0); });

async function finish(code) {
  clearTimeout(deadline);
  await worker.close();
  const spans = exporter.getFinishedSpans().map((s) => ({
    name: s.name, kind: s.kind, traceId: s.spanContext().traceId,
    parentSpanId: s.parentSpanContext?.spanId ?? s.parentSpanId ?? null,
  }));
  process.stdout.write(JSON.stringify({ seen, spans }) + '\n');
  process.exit(code);
}
