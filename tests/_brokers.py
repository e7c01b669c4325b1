"""RabbitMQ and NATS for the tests: the shared servers (an exchange, queue or stream named per
test, deleted after it), servers of a test's own on free ports (stopped by their pid, never
the shared ones), and real consumers written with each broker's own client (pika, nats-py),
not with the publishers' code."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pika
from nats.js.api import StreamConfig

from _redis import free_port

SHARED_RABBITMQ = "amqp://guest:guest@127.0.0.1:5672/"
SHARED_NATS = "nats://127.0.0.1:4222"
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # the node itself, no su wrapper


@dataclass
class Message:
    """One message as a consumer received it, whichever broker carried it."""

    message_id: str
    event_id: int
    event_type: str
    aggregate_type: str
    aggregate_id: str
    payload: Any  # the body, parsed
    extra: dict[str, Any] = field(default_factory=dict)  # what else the broker said


# ---------------------------------------------------------------------------
# RabbitMQ
# ---------------------------------------------------------------------------

def amqp_channel(url: str = SHARED_RABBITMQ) -> tuple[Any, Any]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    return connection, connection.channel()


@dataclass
class Exchange:
    """A topic exchange of a test's own with one durable queue bound to it for ``binding``."""

    url: str
    name: str
    queue: str
    binding: str = "#"

    def declare(self) -> None:
        connection, channel = amqp_channel(self.url)
        try:
            channel.exchange_declare(self.name, "topic", durable=True)
            channel.queue_declare(self.queue, durable=True)
            channel.queue_bind(self.queue, self.name, self.binding)
        finally:
            connection.close()

    def delete(self) -> None:
        connection, channel = amqp_channel(self.url)
        try:
            channel.queue_delete(self.queue)
            channel.exchange_delete(self.name)
        finally:
            connection.close()

    def depth(self) -> int:
        connection, channel = amqp_channel(self.url)
        try:
            return int(channel.queue_declare(self.queue, passive=True).method.message_count)
        finally:
            connection.close()


def new_exchange(url: str = SHARED_RABBITMQ, binding: str = "#") -> Exchange:
    tag = uuid.uuid4().hex[:12]
    exchange = Exchange(url, f"outbox-test-{tag}", f"outbox-test-{tag}-q", binding)
    exchange.declare()
    return exchange


def amqp_message(properties: Any, body: bytes, routing_key: str) -> Message:
    headers = dict(properties.headers or {})
    return Message(
        message_id=properties.message_id, event_id=headers.pop("outbox-event-id"),
        event_type=properties.type, aggregate_type=_text(headers.pop("outbox-aggregate-type")),
        aggregate_id=_text(headers.pop("outbox-aggregate-id")),
        payload=json.loads(body.decode("utf-8")),
        extra={"content_type": properties.content_type,
               "delivery_mode": properties.delivery_mode, "routing_key": routing_key,
               "other_headers": headers})


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class AMQPConsumer(threading.Thread):
    """A pika consumer of ``queue`` in a thread of its own, acking each message once it has
    noted it, until :meth:`stop` finds the queue quiet."""

    def __init__(self, exchange: Exchange) -> None:
        super().__init__(daemon=True, name="amqp-consumer")
        self.exchange = exchange
        self.messages: list[Message] = []
        self.errors: list[BaseException] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            connection, channel = amqp_channel(self.exchange.url)
            channel.basic_qos(prefetch_count=200)
            quiet_since = None
            for method, properties, body in channel.consume(self.exchange.queue,
                                                            inactivity_timeout=0.2):
                if method is None:
                    if self._stopping.is_set():
                        quiet_since = quiet_since or time.monotonic()
                        if time.monotonic() - quiet_since > 0.5:
                            break
                    continue
                quiet_since = None
                self.messages.append(amqp_message(properties, body, method.routing_key))
                channel.basic_ack(method.delivery_tag)
            channel.cancel()
            connection.close()
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            self.errors.append(exc)

    def stop(self, timeout: float = 60) -> list[Message]:
        """Read until the queue has been quiet a moment; return every message seen."""
        self._stopping.set()
        self.join(timeout)
        assert not self.is_alive(), "the AMQP consumer did not finish"
        assert not self.errors, self.errors
        return self.messages


def basic_get(exchange: Exchange, count: int) -> list[tuple[Any, bytes]]:
    """The next ``count`` messages of the exchange's queue as pika gives them, (properties,
    body) each, acked; fails when fewer are there."""
    connection, channel = amqp_channel(exchange.url)
    try:
        got = [channel.basic_get(exchange.queue, auto_ack=True) for _ in range(count)]
    finally:
        connection.close()
    assert all(method is not None for method, _, _ in got), "fewer messages than expected"
    return [(props, body) for _, props, body in got]


def drain_queue(exchange: Exchange) -> list[Message]:
    """Every message now in the exchange's queue (acked: the queue is left empty)."""
    connection, channel = amqp_channel(exchange.url)
    seen = []
    try:
        while True:
            method, properties, body = channel.basic_get(exchange.queue, auto_ack=True)
            if method is None:
                return seen
            seen.append(amqp_message(properties, body, method.routing_key))
    finally:
        connection.close()


class RabbitMQNode:
    """A RabbitMQ node of the test's own: its own node name, AMQP and distribution ports, and
    data and log folders under ``folder`` (kept across a restart); stopped by its pid."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.dist_port = free_port()
        self.name = f"outbox-test-{uuid.uuid4().hex[:8]}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        (folder / "enabled_plugins").write_text("[].\n")
        (folder / "rabbitmq-env.conf").write_text("")
        (folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def start(self, timeout: float = 90) -> None:
        env = {**os.environ,
               "RABBITMQ_NODENAME": self.name, "RABBITMQ_NODE_PORT": str(self.port),
               "RABBITMQ_DIST_PORT": str(self.dist_port),
               "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
               "RABBITMQ_LOG_BASE": str(self.folder / "log"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
               "RABBITMQ_CONF_ENV_FILE": str(self.folder / "rabbitmq-env.conf"),
               "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq"),
               "ERL_EPMD_ADDRESS": "127.0.0.1",
               "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS":
                   "-kernel inet_dist_use_interface {127,0,0,1}"}
        log = open(self.folder / "node.out", "ab")
        # A session of its own: the script, its beam and their children stop together.
        self.proc = subprocess.Popen([RABBITMQ_SERVER], env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                connection, _ = amqp_channel(self.url)
                connection.close()
                return
            except pika.exceptions.AMQPError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"RabbitMQ node {self.name} did not start: "
                                       + (self.folder / "node.out").read_text()[-2000:])
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # this node's group only
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None


# ---------------------------------------------------------------------------
# NATS JetStream
# ---------------------------------------------------------------------------

async def _with_jetstream(url: str, call: Any) -> Any:
    client = await nats.connect(url, allow_reconnect=False)
    try:
        return await call(client.jetstream())
    finally:
        await client.close()


def on_jetstream(url: str, call: Any) -> Any:
    """``await call(jetstream)`` on a connection of its own to ``url``."""
    return asyncio.run(_with_jetstream(url, call))


@dataclass
class Stream:
    """A JetStream stream of a test's own capturing ``<prefix>.>`` (or ``subjects``)."""

    url: str
    name: str
    prefix: str
    subjects: list[str]

    def create(self, **config: Any) -> None:
        on_jetstream(self.url, lambda js: js.add_stream(StreamConfig(
            name=self.name, subjects=self.subjects, **config)))

    def delete(self) -> None:
        on_jetstream(self.url, lambda js: js.delete_stream(self.name))

    def count(self) -> int:
        async def call(js: Any) -> int:
            return int((await js.stream_info(self.name)).state.messages)
        return int(on_jetstream(self.url, call))

    def messages(self) -> list[Message]:
        """Every message the stream holds, in stream order (read by a consumer of its own)."""
        async def call(js: Any) -> list[Message]:
            expected = int((await js.stream_info(self.name)).state.messages)
            sub = await js.pull_subscribe(f"{self.prefix}.>", stream=self.name)
            seen: list[Message] = []
            while len(seen) < expected:
                for msg in await sub.fetch(min(500, expected - len(seen)), timeout=10):
                    seen.append(nats_message(msg))
                    await msg.ack()
            await sub.unsubscribe()
            return seen
        result: list[Message] = on_jetstream(self.url, call)
        return result


def new_stream(url: str = SHARED_NATS, subjects: list[str] | None = None,
               **config: Any) -> Stream:
    tag = uuid.uuid4().hex[:12]
    prefix = f"outbox-test-{tag}"
    stream = Stream(url, f"OUTBOX_TEST_{tag}", prefix, subjects or [f"{prefix}.>"])
    stream.create(**config)
    return stream


def nats_message(msg: Any) -> Message:
    headers = dict(msg.headers or {})
    return Message(
        message_id=headers.pop("Nats-Msg-Id"), event_id=int(headers.pop("Outbox-Event-Id")),
        event_type=headers.pop("Outbox-Event-Type"),
        aggregate_type=headers.pop("Outbox-Aggregate-Type"),
        aggregate_id=headers.pop("Outbox-Aggregate-Id"),
        payload=json.loads(msg.data.decode("utf-8")),
        extra={"subject": msg.subject, "other_headers": headers,
               "sequence": msg.metadata.sequence.stream if msg.reply else None})


class JetStreamConsumer(threading.Thread):
    """A nats-py consumer of a stream (an ephemeral pull consumer) in a thread of its own,
    with its own event loop, reading while the relays publish until :meth:`stop` finds the
    stream read to its end."""

    def __init__(self, stream: Stream) -> None:
        super().__init__(daemon=True, name="jetstream-consumer")
        self.stream = stream
        self.messages: list[Message] = []
        self.errors: list[BaseException] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._consume())
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            self.errors.append(exc)

    async def _consume(self) -> None:
        client = await nats.connect(self.stream.url, allow_reconnect=False)
        try:
            js = client.jetstream()
            sub = await js.pull_subscribe(f"{self.stream.prefix}.>", stream=self.stream.name)
            while True:
                try:
                    batch = await sub.fetch(200, timeout=0.2)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    batch = []
                for msg in batch:
                    self.messages.append(nats_message(msg))
                    await msg.ack()
                if not batch and self._stopping.is_set():
                    info = await js.stream_info(self.stream.name)
                    if len(self.messages) >= info.state.messages:
                        break
        finally:
            await client.close()

    def stop(self, timeout: float = 60) -> list[Message]:
        self._stopping.set()
        self.join(timeout)
        assert not self.is_alive(), "the JetStream consumer did not finish"
        assert not self.errors, self.errors
        return self.messages


class NATSServer:
    """A nats-server of the test's own with JetStream, on a free port, its store in
    ``folder`` (kept across a restart); stopped by its pid."""

    def __init__(self, folder: Path, *options: str) -> None:
        self.folder = folder
        self.port = free_port()
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20) -> None:
        self.proc = subprocess.Popen(
            ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js",
             "-sd", str(self.folder / "store"), *self.options],
            stdout=subprocess.DEVNULL, stderr=open(self.folder / "nats.log", "ab"))
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 1):
                    return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"nats-server on port {self.port} did not start")
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # this server only, by its pid
            self.proc.wait(timeout=20)
        self.proc = None
