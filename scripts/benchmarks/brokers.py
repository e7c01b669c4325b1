"""RabbitMQPublisher and NATSPublisher against their raw clients, and the relay into each
broker beside BullMQ, side by side in one run.

Publish (``--only publish``, no database): ``--workers`` fresh processes each publish their
share of ``--events`` messages in batches of ``--batch``, every batch's confirms (acks) awaited
before the next, the sides taking turns round by round:

* ``rabbitmq``: ``RabbitMQPublisher.publish``; ``aiormq``: the same confirmed, mandatory,
  persistent messages (properties, headers, body) with aiormq alone, the batch's
  ``basic_publish`` calls gathered; ``pika``: pika's BlockingConnection with
  ``confirm_delivery()``, one confirm per message (the synchronous client, for reference);
* ``nats``: ``NATSPublisher.publish``; ``nats-py``: the same JetStream publishes (subject,
  headers, data) with nats-py alone, the batch's acks gathered; ``nats-py-encoding``: the same,
  but each message's JSON body encoded as it is published, as any publisher given events must
  (the other raw sides are handed ready bytes); ``nats-py-thread``: that, with nats-py on an
  event loop in a thread of its own and each batch handed to it from the main thread, as a
  synchronous publisher must (what is left between it and ``nats`` is the publisher's code).

The clock runs from a common start (after every process has connected) to the last one done;
each side is checked (the queue or stream holds every message). publisher / raw client is the
publisher's own cost (target >= 0.9).

Relay (``--only relay``): ``--workers`` fresh ``outbox-lite relay --until-empty`` processes
drain ``--events`` events into BullMQ, RabbitMQ and NATS in turn (start-up counted, as in
``relay``, whose seeding this reuses), each checked: every event published,
the broker holds one message per event.

Usage: python scripts/bench.py brokers [--database-url URL] [--rounds 3] [--events 20000]
       [--batch 100] [--workers 4] [--only publish|relay] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from ._setup import PAYLOAD, add_database_option, add_sizes, scratch_database, server_url
from .relay import ENTRY, ROOT

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
NATS_URL = "nats://127.0.0.1:4222"
REDIS_URL = "redis://127.0.0.1:6379/0"
PUBLISH_SIDES = ("rabbitmq", "aiormq", "pika", "nats", "nats-py", "nats-py-encoding",
                 "nats-py-thread")


# ---------------------------------------------------------------------------
# The publishing processes (``python bench.py brokers _publish SIDE …``)
# ---------------------------------------------------------------------------

def _messages(first: int, count: int, run: str) -> list[dict[str, Any]]:
    """What each message carries, spelled out so the raw sides need not import outbox_lite
    (checked against the publishers' own in ``_check_mapping``)."""
    return [{"id": n, "type": "job.created", "aggregate_type": "ai_job", "aggregate_id": str(n),
             "message_id": f"outbox-{run}-{n}", "payload": {**PAYLOAD, "job_id": n},
             "body": json.dumps({**PAYLOAD, "job_id": n}, ensure_ascii=False,
                                separators=(",", ":")).encode()}
            for n in range(first, first + count)]


def _publish_main(side: str, target: str, first: int, count: int, batch: int, run: str,
                  start_at: float) -> None:
    messages = _messages(first, count, run)
    batches = [messages[i:i + batch] for i in range(0, len(messages), batch)]
    if side in ("rabbitmq", "nats"):
        _publisher_side(side, target, batches, run, start_at)
    elif side == "aiormq":
        asyncio.run(_aiormq_side(target, batches, start_at))
    elif side == "pika":
        _pika_side(target, batches, start_at)
    elif side == "nats-py-thread":
        _nats_py_thread_side(target, batches, start_at)
    else:
        asyncio.run(_nats_py_side(target, batches, start_at, encode=side == "nats-py-encoding"))
    print(time.time())


def _wait(start_at: float) -> None:
    time.sleep(max(0.0, start_at - time.time()))


def _publisher_side(side: str, target: str, batches: list[list[dict[str, Any]]], run: str,
                    start_at: float) -> None:
    from outbox_lite.models import OutboxEvent
    from outbox_lite.publishers.nats import NATSPublisher
    from outbox_lite.publishers.rabbitmq import RabbitMQPublisher

    events = [[OutboxEvent(id=m["id"], event_type=m["type"], aggregate_type=m["aggregate_type"],
                           aggregate_id=m["aggregate_id"], dedupe_key=f"{run}-{m['id']}",
                           payload=json.loads(m["body"])) for m in b] for b in batches]
    publisher: Any = (RabbitMQPublisher(RABBITMQ_URL, target) if side == "rabbitmq"
                      else NATSPublisher(NATS_URL, target))
    publisher.ping()
    _wait(start_at)
    for b in events:
        if publisher.publish(b):
            raise RuntimeError(f"{side}: a publish failed")
    publisher.close()


async def _aiormq_side(exchange: str, batches: list[list[dict[str, Any]]],
                       start_at: float) -> None:
    import aiormq

    connection = await aiormq.connect(RABBITMQ_URL)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    _wait(start_at)
    for b in batches:
        await asyncio.gather(*(channel.basic_publish(
            m["body"], exchange=exchange, routing_key=m["type"], mandatory=True,
            properties=aiormq.spec.Basic.Properties(
                message_id=m["message_id"], message_type=m["type"],
                content_type="application/json", delivery_mode=2,
                headers={"outbox-event-id": m["id"], "outbox-aggregate-type":
                         m["aggregate_type"], "outbox-aggregate-id": m["aggregate_id"]}))
            for m in b))
    await connection.close()


def _pika_side(exchange: str, batches: list[list[dict[str, Any]]], start_at: float) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    channel = connection.channel()
    channel.confirm_delivery()
    _wait(start_at)
    for b in batches:
        for m in b:
            channel.basic_publish(exchange, m["type"], m["body"], pika.BasicProperties(
                message_id=m["message_id"], type=m["type"], content_type="application/json",
                delivery_mode=2, headers={"outbox-event-id": m["id"], "outbox-aggregate-type":
                                          m["aggregate_type"],
                                          "outbox-aggregate-id": m["aggregate_id"]}),
                mandatory=True)
    connection.close()


async def _nats_py_side(prefix: str, batches: list[list[dict[str, Any]]],
                        start_at: float, encode: bool) -> None:
    import nats

    client = await nats.connect(NATS_URL)
    js = client.jetstream()
    _wait(start_at)
    for b in batches:
        await asyncio.gather(*(js.publish(
            f"{prefix}.{m['type']}", json.dumps(m["payload"], ensure_ascii=False,
                                                separators=(",", ":")).encode()
            if encode else m["body"], timeout=10, headers={
                "Nats-Msg-Id": m["message_id"], "Outbox-Event-Id": str(m["id"]),
                "Outbox-Event-Type": m["type"], "Outbox-Aggregate-Type": m["aggregate_type"],
                "Outbox-Aggregate-Id": m["aggregate_id"]}) for m in b))
    await client.close()


def _nats_py_thread_side(prefix: str, batches: list[list[dict[str, Any]]],
                         start_at: float) -> None:
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started = asyncio.run_coroutine_threadsafe(_nats_py_connect(), loop).result(30)
    client, js = started
    _wait(start_at)
    for b in batches:
        asyncio.run_coroutine_threadsafe(_nats_py_batch(js, prefix, b), loop).result(30)
    asyncio.run_coroutine_threadsafe(client.close(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


async def _nats_py_connect() -> Any:
    import nats

    client = await nats.connect(NATS_URL)
    return client, client.jetstream()


async def _nats_py_batch(js: Any, prefix: str, batch: list[dict[str, Any]]) -> None:
    await asyncio.gather(*(js.publish(
        f"{prefix}.{m['type']}", json.dumps(m["payload"], ensure_ascii=False,
                                            separators=(",", ":")).encode(), timeout=10,
        headers={"Nats-Msg-Id": m["message_id"], "Outbox-Event-Id": str(m["id"]),
                 "Outbox-Event-Type": m["type"], "Outbox-Aggregate-Type": m["aggregate_type"],
                 "Outbox-Aggregate-Id": m["aggregate_id"]}) for m in batch))


# ---------------------------------------------------------------------------
# The parent: targets, timing, checking
# ---------------------------------------------------------------------------

class _Targets:
    """A fresh exchange with its queue, or stream, per round; counted and deleted after."""

    def __init__(self) -> None:
        import pika

        self._pika = pika
        self.connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
        self.channel = self.connection.channel()

    def close(self) -> None:
        self.connection.close()

    def new(self, broker: str, tag: str) -> str:
        if broker == "rabbitmq":
            self.channel.exchange_declare(f"bench-{tag}", "topic", durable=True)
            self.channel.queue_declare(f"bench-{tag}", durable=True)
            self.channel.queue_bind(f"bench-{tag}", f"bench-{tag}", "#")
            return f"bench-{tag}"
        asyncio.run(_jetstream(lambda js: js.add_stream(name=f"BENCH_{tag}",
                                                        subjects=[f"bench-{tag}.>"])))
        return f"bench-{tag}"

    def count_and_delete(self, broker: str, tag: str) -> int:
        if broker == "rabbitmq":
            count = self.channel.queue_declare(f"bench-{tag}", passive=True).method.message_count
            self.channel.queue_delete(f"bench-{tag}")
            self.channel.exchange_delete(f"bench-{tag}")
            return int(count)

        async def call(js: Any) -> int:
            info = await js.stream_info(f"BENCH_{tag}")
            await js.delete_stream(f"BENCH_{tag}")
            return int(info.state.messages)
        return int(asyncio.run(_jetstream(call)))


async def _jetstream(call: Any) -> Any:
    import nats

    client = await nats.connect(NATS_URL)
    try:
        return await call(client.jetstream())
    finally:
        await client.close()


def _broker_of(side: str) -> str:
    return "rabbitmq" if side in ("rabbitmq", "aiormq", "pika") else "nats"


def publish_once(targets: _Targets, side: str, *, events: int, batch: int,
                 workers: int) -> float:
    """One round of ``side``: messages/s from the common start to the last process done."""
    tag = uuid.uuid4().hex[:12]
    broker = _broker_of(side)
    target = targets.new(broker, tag)
    share = -(-events // workers)
    start_at = time.time() + 3.0  # every process imports and connects before it
    try:
        procs = [subprocess.Popen(
            [sys.executable, str(ENTRY), "brokers", "_publish", side, target, str(i * share),
             str(min(share, events - i * share)), str(batch), tag, repr(start_at)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(workers)]
        outputs = [p.communicate(timeout=600) for p in procs]
        failed = [err for p, (_, err) in zip(procs, outputs) if p.returncode != 0]
        if failed:
            raise RuntimeError(f"{side} failed: {failed[0][-2000:]}")
        if time.time() > start_at + 600 or any(float(out) < start_at for out, _ in outputs):
            raise RuntimeError(f"{side}: a process started late")
        elapsed = max(float(out) for out, _ in outputs) - start_at
    finally:
        held = targets.count_and_delete(broker, tag)
    if held != events:
        raise AssertionError(f"{side}: the broker holds {held} messages, not {events}")
    return events / elapsed


def compare_publish(*, events: int, batch: int, workers: int, rounds: int) -> dict[str, Any]:
    _check_mapping()
    targets = _Targets()
    rates: dict[str, list[float]] = {side: [] for side in PUBLISH_SIDES}
    try:
        for r in range(rounds):
            for side in (PUBLISH_SIDES if r % 2 == 0 else PUBLISH_SIDES[::-1]):
                rates[side].append(publish_once(targets, side, events=events, batch=batch,
                                                workers=workers))
    finally:
        targets.close()
    result: dict[str, Any] = {side: statistics.median(v) for side, v in rates.items()}
    for a, b in (("rabbitmq", "aiormq"), ("pika", "aiormq"), ("nats", "nats-py"),
                 ("nats", "nats-py-encoding"), ("nats-py-encoding", "nats-py"),
                 ("nats", "nats-py-thread"), ("nats-py-thread", "nats-py-encoding")):
        result[f"{a}/{b}"] = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
    result["rounds"] = {side: [round(v) for v in values] for side, values in rates.items()}
    return result


def _check_mapping() -> None:
    """The raw sides send what the publishers send (same body, ids and headers)."""
    from outbox_lite.models import OutboxEvent
    from outbox_lite.publishers import message_body, message_id

    [m] = _messages(7, 1, "run")
    event = OutboxEvent(id=7, event_type="job.created", aggregate_type="ai_job",
                        aggregate_id="7", dedupe_key="run-7", payload=json.loads(m["body"]))
    assert message_body(event) == m["body"] and message_id(event) == m["message_id"]


def relay_once(sides: Any, broker: str, targets: _Targets, *, events: int, batch: int,
               workers: int) -> float:
    """Fresh relays drain the outbox into ``broker``; events/s, start-up counted."""
    if broker == "bullmq":
        seconds, _ = sides.run("relay")  # relay's own round, checks and all
        return events / seconds
    tag = uuid.uuid4().hex[:12]
    target = targets.new(broker, tag)
    flags = (["--rabbitmq-url", RABBITMQ_URL, "--exchange", target] if broker == "rabbitmq"
             else ["--nats-url", NATS_URL, "--subject-prefix", target])
    try:
        sides.seed(tag)
        started = time.perf_counter()
        procs = [subprocess.Popen(
            [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
             sides.url.secret_text(), *flags, "--batch-size", str(batch), "--until-empty",
             "--progress-every", "3600"], env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(workers)]
        errors = [p.communicate(timeout=600)[1] for p in procs]
        elapsed = time.perf_counter() - started
        failed = [e for p, e in zip(procs, errors) if p.returncode != 0]
        if failed:
            raise RuntimeError(f"relay to {broker} failed: {failed[0][-2000:]}")
        [(published,)] = sides.sql("SELECT COUNT(*) FROM outbox_event"
                                   " WHERE status = 'published'")
        if published != events:
            raise AssertionError(f"relay to {broker}: {published} published of {events}")
    finally:
        held = targets.count_and_delete(broker, tag)
    if held != events:
        raise AssertionError(f"relay to {broker}: the broker holds {held}, not {events}")
    return events / elapsed


def compare_relay(url: Any, *, events: int, batch: int, workers: int,
                  rounds: int) -> dict[str, Any]:
    from . import relay as bench_relay

    sides = bench_relay._Sides(url, REDIS_URL, events=events, batch=batch, workers=workers)
    targets = _Targets()
    order = ["bullmq", "rabbitmq", "nats"]
    rates: dict[str, list[float]] = {b: [] for b in order}
    try:
        for r in range(rounds):
            for broker in (order if r % 2 == 0 else order[::-1]):
                rates[broker].append(relay_once(sides, broker, targets, events=events,
                                                batch=batch, workers=workers))
    finally:
        sides.close()
        targets.close()
    result: dict[str, Any] = {b: statistics.median(v) for b, v in rates.items()}
    for b in ("rabbitmq", "nats"):
        result[f"{b}/bullmq"] = statistics.median(
            x / y for x, y in zip(rates[b], rates["bullmq"]))
    result["rounds"] = {b: [round(v) for v in values] for b, values in rates.items()}
    return result


def format_report(report: dict[str, Any]) -> str:
    lines = []
    if "publish" in report:
        p = report["publish"]
        lines += [
            f"confirmed publishes/s (no database): RabbitMQPublisher {p['rabbitmq']:,.0f},"
            f" aiormq {p['aiormq']:,.0f}, pika blocking {p['pika']:,.0f}; NATSPublisher"
            f" {p['nats']:,.0f}, nats-py {p['nats-py']:,.0f}, nats-py encoding each body"
            f" {p['nats-py-encoding']:,.0f}, and on a loop thread {p['nats-py-thread']:,.0f}",
            f"  RabbitMQPublisher / aiormq {p['rabbitmq/aiormq']:.3f} (target >= 0.9),"
            f" NATSPublisher / nats-py {p['nats/nats-py']:.3f} (target >= 0.9),"
            f" pika / aiormq {p['pika/aiormq']:.3f}",
            f"  NATSPublisher / nats-py encoding each body {p['nats/nats-py-encoding']:.3f},"
            f" nats-py encoding / given bytes {p['nats-py-encoding/nats-py']:.3f};"
            f" NATSPublisher / nats-py on a loop thread {p['nats/nats-py-thread']:.3f},"
            f" loop thread / same loop {p['nats-py-thread/nats-py-encoding']:.3f}",
            f"  rounds: {p['rounds']}"]
    if "relay" in report:
        r = report["relay"]
        lines += [
            f"relay events/s on {r['server']} (start-up counted): BullMQ {r['bullmq']:,.0f}, RabbitMQ"
            f" {r['rabbitmq']:,.0f}, NATS {r['nats']:,.0f}",
            f"  RabbitMQ / BullMQ {r['rabbitmq/bullmq']:.3f}, NATS / BullMQ"
            f" {r['nats/bullmq']:.3f}",
            f"  rounds: {r['rounds']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["_publish"]:  # a fresh publishing process
        a = given[1:]
        _publish_main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), a[5], float(a[6]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_brokers")
    parser.add_argument("--only", choices=("publish", "relay"), action="append",
                        help="run only this measure (default: both)")
    add_sizes(parser, rounds=3, events=20_000, batch=100, workers=4)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    only = set(args.only or ("publish", "relay"))
    sizes = {"events": args.events, "batch": args.batch, "workers": args.workers,
             "rounds": args.rounds}
    report: dict[str, Any] = {}
    if "publish" in only:
        report["publish"] = compare_publish(**sizes)
    if "relay" in only:
        with scratch_database(args.database_url, "bench_brokers") as url:
            report["relay"] = compare_relay(url, **sizes)
        base = server_url(args.database_url)
        report["relay"]["server"] = f"{base.host}:{base.port}"
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
