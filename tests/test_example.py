"""The example service (``examples/orders``) end to end, on each broker, as examples/README.md
runs it: the Flask app served by ``flask run`` on a real port and called over HTTP, ``outbox-lite
relay``, and the example's own consumer process for the broker, all on a migrated database of
the test's own and a queue, exchange or stream of its own on the shared broker.

Asserted in the database and the broker: the order row and its event written together (and
nothing for a refused request), the event published and on the broker under its message id,
one shipment and one inbox record; then the message arrives again, as a relay that died between
its publish and its record makes it arrive, and changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pika
import pytest
import redis
from bullmq import Job, Queue

from outbox_lite.publishers import message_id_of_key

from _brokers import SHARED_NATS, SHARED_RABBITMQ, amqp_channel, on_jetstream
from _helpers import FAMILY
from _redis import SHARED_REDIS, delete_queue, free_port

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "orders"
ORDER = {"customer": "ada", "item": "book", "quantity": 2}
DEAD_RELAY = "relay-that-died"


class Process:
    """A process of the example, its stdout lines collected by a thread as they come."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=EXAMPLE.parent.parent)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, line: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.lines:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail(f"waited in vain for {line!r}; stdout: {self.lines}; stderr: "
                            + self.stop()[-2000:])
            time.sleep(0.02)

    def stop(self) -> str:
        """SIGTERM, as Ctrl-C would; returns stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self._reader.join(5)
        return err


@pytest.fixture
def processes() -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(command: list[str], env: dict[str, str]) -> Process:
        started.append(Process(command, env))
        return started[-1]

    yield start
    for process in started:
        process.stop()


# ---------------------------------------------------------------------------
# The brokers: the relay's flags, what the broker holds, and how a message comes again
# ---------------------------------------------------------------------------

class _BullMQ:
    name = "bullmq"

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def flags(self) -> list[str]:
        return ["--bullmq-url", SHARED_REDIS, "--queue", self.topic]

    def _job(self, message_id: str) -> tuple[Any, str]:
        async def read() -> tuple[Any, str]:
            queue = Queue(self.topic, {"connection": SHARED_REDIS})
            try:
                job = await Job.fromId(queue, message_id)
                return job, await queue.getJobState(message_id)
            finally:
                await queue.close()
        return asyncio.run(read())

    def holds(self, message_id: str, payload: dict[str, Any]) -> None:
        """The job, completed: BullMQ records that once ``process`` has returned, just
        after the consumer's line."""
        deadline = time.monotonic() + 10
        job, state = self._job(message_id)
        while state == "active" and time.monotonic() < deadline:
            time.sleep(0.02)
            job, state = self._job(message_id)
        assert (job.name, job.data, state) == ("order.placed", payload, "completed")

    def before_republish(self, message_id: str) -> None:
        """BullMQ keeps a completed job (a day, by the publisher's default) and drops a job
        added again under its id; once the job is removed (removeOnComplete's age), the
        event published again is a new job of the same id."""
        async def remove() -> None:
            queue = Queue(self.topic, {"connection": SHARED_REDIS})
            try:
                await (await Job.fromId(queue, message_id)).remove()
            finally:
                await queue.close()
        asyncio.run(remove())

    def again(self, consumer: Process, restart: Callable[[], Process], message_id: str,
              payload: dict[str, Any]) -> Process:
        return consumer

    def delete(self) -> None:
        client = redis.Redis.from_url(SHARED_REDIS)
        try:
            delete_queue(client, self.topic)
        finally:
            client.close()


class _RabbitMQ:
    name = "rabbitmq"

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.queue = f"{topic}.shipping"  # as consume_rabbitmq.py declares it

    def flags(self) -> list[str]:
        return ["--rabbitmq-url", SHARED_RABBITMQ, "--exchange", self.topic]

    def holds(self, message_id: str, payload: dict[str, Any]) -> None:
        """RabbitMQ keeps nothing once acked: the consumer's line said which message id
        arrived; the queue is empty (acked after the commit)."""
        connection, channel = amqp_channel()
        try:
            assert channel.queue_declare(self.queue, passive=True).method.message_count == 0
        finally:
            connection.close()

    def before_republish(self, message_id: str) -> None:
        pass  # RabbitMQ keeps no dedupe: the message arrives again as it is

    def again(self, consumer: Process, restart: Callable[[], Process], message_id: str,
              payload: dict[str, Any]) -> Process:
        return consumer

    def delete(self) -> None:
        connection, channel = amqp_channel()
        try:
            channel.queue_delete(self.queue)
            channel.exchange_delete(self.topic)
        except pika.exceptions.AMQPError:
            pass  # the consumer never declared them: the test failed before
        finally:
            if connection.is_open:
                connection.close()


class _NATS:
    name = "nats"

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.stream = topic.upper()  # as consume_nats.py names it

    def flags(self) -> list[str]:
        return ["--nats-url", SHARED_NATS, "--subject-prefix", self.topic]

    def _messages(self) -> list[Any]:
        async def read(js: Any) -> list[Any]:
            count = (await js.stream_info(self.stream)).state.messages
            return [await js.get_msg(self.stream, seq) for seq in range(1, count + 1)]
        result: list[Any] = on_jetstream(SHARED_NATS, read)
        return result

    def holds(self, message_id: str, payload: dict[str, Any]) -> None:
        [msg] = self._messages()
        assert msg.subject == f"{self.topic}.order.placed"
        assert msg.headers["Nats-Msg-Id"] == message_id
        assert json.loads(msg.data) == payload

    def before_republish(self, message_id: str) -> None:
        pass

    def again(self, consumer: Process, restart: Callable[[], Process], message_id: str,
              payload: dict[str, Any]) -> Process:
        """JetStream's duplicate window dropped the second copy (the stream holds one
        message still), so the message comes again the other way JetStream sends one again:
        the consumer's durable is deleted (the consumer stopped first) and made afresh by
        the consumer started again, which delivers the stream from its start."""
        self.holds(message_id, payload)
        consumer.stop()
        on_jetstream(SHARED_NATS, lambda js: js.delete_consumer(self.stream, "shipping"))
        return restart()

    def delete(self) -> None:
        try:
            on_jetstream(SHARED_NATS, lambda js: js.delete_stream(self.stream))
        except Exception:  # noqa: BLE001 - the consumer never made it: the test failed before
            pass


@pytest.fixture(params=["bullmq", "rabbitmq", "nats"])
def broker(request: pytest.FixtureRequest) -> Iterator[Any]:
    topic = f"outbox-example-{uuid.uuid4().hex[:12]}"
    target = {"bullmq": _BullMQ, "rabbitmq": _RabbitMQ, "nats": _NATS}[request.param](topic)
    yield target
    target.delete()


# ---------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------

def _http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_for_port(port: int, app: Process) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), 0.5):
                return
        except OSError:
            if time.monotonic() > deadline or app.proc.poll() is not None:
                pytest.fail("the Flask app did not start: " + app.stop()[-2000:])
            time.sleep(0.02)


def _relay(env: dict[str, str], broker: Any, *flags: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "outbox_lite.cli", "relay", *broker.flags(), "--until-empty",
         *flags], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]


def test_an_order_placed_over_http_is_shipped_once_however_often_its_message_comes(
        broker, db_url, fetch, processes):
    # The example's Peewee database is playhouse.db_url's, which hands every URL option to
    # the driver: not outbox_lite's own driver= (PostgreSQL), which picks that driver.
    url = dataclasses.replace(db_url, options=tuple(
        (name, value) for name, value in db_url.options if name != "driver"))
    env = {**os.environ, "OUTBOX_DATABASE_URL": url.secret_text(),
           "ORDERS_TOPIC": broker.topic, "OUTBOX_BULLMQ_URL": SHARED_REDIS,
           "OUTBOX_RABBITMQ_URL": SHARED_RABBITMQ, "OUTBOX_NATS_URL": SHARED_NATS}
    made = subprocess.run([sys.executable, str(EXAMPLE / "store.py")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr[-2000:]
    port = free_port()
    app = processes([sys.executable, "-m", "flask", "--app", str(EXAMPLE / "app.py"), "run",
                     "--port", str(port)], env)

    def consumer() -> Process:
        started = processes([sys.executable, str(EXAMPLE / f"consume_{broker.name}.py")], env)
        started.wait_for(f"shipping: consuming {_consuming(broker)}")
        return started

    shipping = consumer()  # first: it declares the exchange or makes the stream
    _wait_for_port(port, app)
    base = f"http://127.0.0.1:{port}"

    # A request the service refuses writes nothing.
    status, body = _http("POST", f"{base}/orders", {"customer": "ada", "quantity": 0})
    assert status == 400 and "error" in body
    assert fetch("SELECT COUNT(*) AS n FROM orders") == [{"n": 0}]
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]

    # The order and its event, committed together.
    status, body = _http("POST", f"{base}/orders", ORDER)
    assert status == 201, body
    order_id, event_id = body["id"], body["event_id"]
    payload = {"order_id": order_id, **ORDER}
    assert fetch("SELECT id, customer, item, quantity FROM orders") == [
        {"id": order_id, **ORDER}]
    [event] = fetch("SELECT id, event_type, aggregate_type, aggregate_id, dedupe_key, status,"
                    " payload FROM outbox_event")
    assert {**event, "payload": json.loads(event["payload"])} == {
        "id": event_id, "event_type": "order.placed", "aggregate_type": "order",
        "aggregate_id": str(order_id), "dedupe_key": event["dedupe_key"],
        "status": "pending", "payload": payload}
    assert re.fullmatch(r"[0-9a-f]{32}", event["dedupe_key"])  # generated: none was given
    message_id = message_id_of_key(event["dedupe_key"])  # what every broker carries

    # The relay publishes it; the consumer ships it once.
    _relay(env, broker)
    assert fetch("SELECT status, attempt_count FROM outbox_event") == [
        {"status": "published", "attempt_count": 1}]
    shipping.wait_for(f"order {order_id}: shipped [{message_id}]")
    broker.holds(message_id, payload)
    assert fetch("SELECT order_id, item, quantity FROM shipment") == [
        {"order_id": order_id, "item": "book", "quantity": 2}]
    assert fetch("SELECT consumer, message_id FROM inbox_message") == [
        {"consumer": "shipping", "message_id": message_id}]
    assert _http("GET", f"{base}/orders/{order_id}") == (
        200, {"id": order_id, **ORDER, "shipments": 1})

    # A relay that died between its publish and its record: its claim expired (set through
    # SQL on the server's clock), and the next relay publishes the event again.
    broker.before_republish(message_id)
    fetch("UPDATE outbox_event SET status = 'processing', locked_by = %s,"
          f" locked_at = {FAMILY.UTC_NOW} - {FAMILY.interval('1 HOUR')}, published_at = NULL",
          DEAD_RELAY)
    _relay(env, broker, "--lock-timeout", "60")
    assert fetch("SELECT status, attempt_count, locked_by FROM outbox_event") == [
        {"status": "published", "attempt_count": 2, "locked_by": None}]
    first = shipping
    shipping = broker.again(shipping, consumer, message_id, payload)
    shipping.wait_for(f"order {order_id}: skipped (handled before) [{message_id}]")
    broker.holds(message_id, payload)

    # It came again and changed nothing.
    shipped = [f"order {order_id}: shipped [{message_id}]"]
    assert [line for line in first.lines + (shipping.lines if shipping is not first else [])
            if "shipped" in line] == shipped
    assert fetch("SELECT order_id, item, quantity FROM shipment") == [
        {"order_id": order_id, "item": "book", "quantity": 2}]
    assert fetch("SELECT consumer, message_id FROM inbox_message") == [
        {"consumer": "shipping", "message_id": message_id}]
    assert _http("GET", f"{base}/orders/{order_id}")[1]["shipments"] == 1
    assert "Traceback" not in shipping.stop()
    assert app.stop().count("POST /orders HTTP/1.1") == 2


def _consuming(broker: Any) -> str:
    return {"bullmq": f"BullMQ queue {broker.topic}",
            "rabbitmq": f"RabbitMQ queue {broker.topic}.shipping",
            "nats": f"JetStream stream {broker.topic.upper()}"}[broker.name]
