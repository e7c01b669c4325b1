"""Celery as a publisher, against a real ``celery worker`` process (tests/_celery_app.py) on
Redis and on RabbitMQ: each event runs its task once with its payload as the one argument, its
message id as the task id and its headers on the request; a relay SIGKILLed between its publish
and its record makes the broker hold that batch twice, and the task that accepts its task id in
the inbox still writes each business row once. Configuration errors are one line, without a
password."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pika
import pytest
import redis

from outbox_lite.publishers import message_id
from outbox_lite.publishers.celery import (CeleryConfigurationError, CeleryPublisher,
                                           CeleryUnavailableError)
from outbox_lite.relay import Relay

from _brokers import SHARED_RABBITMQ
from _helpers import FAMILY
from _relays import wait_for

TESTS = Path(__file__).resolve().parent
#: The Celery tests' own Redis database on the shared server (its queues' keys deleted after).
CELERY_REDIS = "redis://127.0.0.1:6379/13"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
EVENTS = 40
FIRST_BATCH = 10


class _Redis:
    name = "redis"
    url = CELERY_REDIS

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.client = redis.Redis.from_url(CELERY_REDIS, decode_responses=True)

    def held(self) -> list[str]:
        """The task ids of the messages the broker holds for the queue."""
        return [json.loads(item)["headers"]["id"]
                for item in self.client.lrange(self.queue, 0, -1)]

    def depth(self) -> int:
        return int(self.client.llen(self.queue))

    def delete(self) -> None:
        # kombu keeps a queue's binding under the name of its exchange (the queue's own here):
        # _kombu.binding_permanent.NAME from 5.7 on, _kombu.binding.NAME before.
        self.client.delete(self.queue, f"_kombu.binding.{self.queue}",
                           f"_kombu.binding_permanent.{self.queue}")
        self.client.close()


class _RabbitMQ:
    name = "rabbitmq"
    url = SHARED_RABBITMQ

    def __init__(self, queue: str) -> None:
        self.queue = queue

    def held(self) -> list[str]:
        """The task ids of the messages the queue holds (read, then put back)."""
        connection = pika.BlockingConnection(pika.URLParameters(SHARED_RABBITMQ))
        try:
            channel = connection.channel()
            ids = []
            while True:
                method, properties, _ = channel.basic_get(self.queue, auto_ack=False)
                if method is None:
                    break
                task_id = properties.headers["id"]
                ids.append(task_id.decode() if isinstance(task_id, bytes) else task_id)
            channel.basic_recover(requeue=True)
            return ids
        finally:
            connection.close()

    def depth(self) -> int:
        connection = pika.BlockingConnection(pika.URLParameters(SHARED_RABBITMQ))
        try:
            return int(connection.channel().queue_declare(
                self.queue, passive=True).method.message_count)
        except pika.exceptions.ChannelClosedByBroker:
            return 0
        finally:
            if connection.is_open:
                connection.close()

    def delete(self) -> None:
        """The queue, and the direct exchange of its name that Celery declares with it."""
        connection = pika.BlockingConnection(pika.URLParameters(SHARED_RABBITMQ))
        try:
            channel = connection.channel()
            channel.queue_delete(self.queue)
            channel.exchange_delete(self.queue)
        finally:
            connection.close()


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request):
    """A queue of this test's own on Redis (database 13) or RabbitMQ; deleted afterwards."""
    kind = _Redis if request.param == "redis" else _RabbitMQ
    broker = kind(f"outbox-test-celery-{uuid.uuid4().hex[:12]}")
    yield broker
    broker.delete()


def _env(db_url, broker, runs: Path, **extra) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TESTS),
            "OUTBOX_TEST_DATABASE_URL": db_url.secret_text(),
            "OUTBOX_TEST_CELERY_URL": broker.url, "OUTBOX_TEST_CELERY_QUEUE": broker.queue,
            "OUTBOX_TEST_RUNS": str(runs),
            **{f"OUTBOX_TEST_{k.upper()}": str(v) for k, v in extra.items()}}


def _worker(start, env):
    """A real Celery worker of the test app, on the test's queue only, one task at a time."""
    return start([sys.executable, "-m", "celery", "-A", "_celery_app", "worker", "-Q",
                  env["OUTBOX_TEST_CELERY_QUEUE"], "--pool", "solo", "--without-mingle",
                  "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING",
                  "-n", f"outbox-test-{uuid.uuid4().hex[:8]}@%h"], env, cwd=TESTS)


def _stop(process) -> str:
    """SIGTERM (Celery's warm shutdown) to one process by its pid; its stderr."""
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    return err


def _progress(path: Path, broker: _Redis | _RabbitMQ) -> str:
    """What a wait for the worker saw: its task runs, and the messages left in the queue."""
    return f"{len(_runs(path))} task runs written, {broker.depth()} messages in the queue"


def _runs(path: Path) -> list[dict]:
    """The task runs the worker has written whole: a line the worker is still writing (no
    newline yet: a read may meet a write half done) is left for the next look."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n")[:-1]]


# ---------------------------------------------------------------------------
# The message: one task run per event, its payload, its id, its headers
# ---------------------------------------------------------------------------

def test_each_event_runs_its_task_once_with_payload_id_and_headers(
        broker, db, db_url, repo, fetch, tmp_path, processes):
    with db.atomic():
        events = [repo.create_in_transaction(
            event_type="order.paid", aggregate_type="order", aggregate_id=str(n),
            payload={"n": n, "text": f"naïve café {n}", "items": [n, None, True]},
            dedupe_key=f"order {n}:paid",
            headers={"traceparent": TRACEPARENT, "tracestate": "shop=1", "tenant": f"t{n}"})
            for n in range(20)]
    runs = tmp_path / "runs.jsonl"
    with CeleryPublisher(broker.url, "outbox_test.record", queue=broker.queue) as publisher:
        publisher.ping()
        relay = Relay(repo, publisher, batch_size=7)
        while relay.run_once().claimed:
            pass
    # The broker took every message before the relay recorded it: they wait in the queue.
    assert sorted(broker.held()) == sorted(message_id(e) for e in events)
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": len(events)}]

    worker = _worker(processes, _env(db_url, broker, runs))
    wait_for(lambda: len(_runs(runs)) >= len(events) and broker.depth() == 0, [worker],
             state=lambda: _progress(runs, broker))
    _stop(worker)
    seen = {run["task_id"]: run for run in _runs(runs)}
    assert len(_runs(runs)) == len(events) == len(seen)  # each event ran its task once
    for e in events:
        run = seen[message_id(e)]  # the task id is the event's message id
        assert run["args"] == [e.payload] and run["kwargs"] == {}  # the payload, one argument
        assert run["headers"] == {
            "outbox-event-id": e.id, "outbox-event-type": "order.paid",
            "outbox-aggregate-type": "order", "outbox-aggregate-id": e.aggregate_id,
            "traceparent": TRACEPARENT, "tracestate": "shop=1", "tenant": e.headers["tenant"]}
    assert broker.depth() == 0


def test_a_header_with_a_celery_name_is_a_dead_letter_and_the_rest_are_sent(
        broker, db, repo, fetch):
    with db.atomic():
        bad = repo.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                         aggregate_id="1", payload={"n": 1},
                                         headers={"eta": "2030-01-01T00:00:00"})
        good = repo.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                          aggregate_id="2", payload={"n": 2})
    with CeleryPublisher(broker.url, "outbox_test.record", queue=broker.queue) as publisher:
        Relay(repo, publisher).run_once()
    rows = fetch("SELECT id, status, last_error_code FROM outbox_event ORDER BY id")
    assert rows == [{"id": bad.id, "status": "failed",
                     "last_error_code": "celery_reserved_header"},
                    {"id": good.id, "status": "published", "last_error_code": None}]
    assert broker.held() == [message_id(good)]


def test_a_lost_broker_fails_the_batch_and_the_next_call_connects_again(
        db, repo, fetch, redis_server):
    server = redis_server()
    with db.atomic():
        events = [repo.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                             aggregate_id=str(n), payload={"n": n})
                  for n in range(3)]
    with CeleryPublisher(server.url, "outbox_test.record", queue="orders",
                         timeout=2) as publisher:
        assert publisher.publish(events[:1]) == {}
        server.stop()
        with pytest.raises(CeleryUnavailableError) as raised:  # nothing taken: all failed
            publisher.publish(events[1:])
        assert raised.value.retryable and raised.value.error_code == "celery_unavailable"
        assert f"127.0.0.1:{server.port}" in str(raised.value)
        server.start()  # afresh, without persistence: empty
        publisher.ping()
        assert publisher.publish(events[1:]) == {}
    assert [json.loads(item)["headers"]["id"] for item in
            reversed(server.client().lrange("orders", 0, -1))] == [message_id(e)
                                                                   for e in events[1:]]


def test_on_rabbitmq_each_publish_waits_for_the_brokers_confirm(db, repo):
    queue = _RabbitMQ(f"outbox-test-celery-{uuid.uuid4().hex[:12]}")
    with db.atomic():
        event = repo.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                           aggregate_id="1", payload={"n": 1})
    try:
        with CeleryPublisher(SHARED_RABBITMQ, "outbox_test.record",
                             queue=queue.queue) as publisher:
            assert publisher.publish([event]) == {}
            channel = publisher._state[1].channel  # kombu's py-amqp channel
            assert channel.basic_publish.__name__ == "basic_publish_confirm"
            assert channel._confirm_selected  # confirm.select was sent: the broker acks
        assert queue.held() == [message_id(event)]
    finally:
        queue.delete()


@pytest.mark.parametrize("auth", [":wrong@", ""])
def test_a_redis_that_refuses_the_login_is_a_configuration_error_without_the_password(
        redis_server, auth):
    server = redis_server("--requirepass", "Sup3rSecret")
    with CeleryPublisher(f"redis://{auth}127.0.0.1:{server.port}/0", "t") as publisher:
        with pytest.raises(CeleryConfigurationError) as raised:
            publisher.ping()
    assert raised.value.error_code == "celery_access_refused"
    assert "refused the login" in str(raised.value)
    assert "wrong" not in str(raised.value) and "Sup3rSecret" not in str(raised.value)


# ---------------------------------------------------------------------------
# A relay killed between publish and record: twice at the broker, once in effect
# ---------------------------------------------------------------------------

def test_a_relay_killed_after_publishing_leaves_each_business_row_once_through_the_inbox(
        broker, db, db_url, repo, fetch, tmp_path, processes):
    db.execute_sql(f"CREATE TABLE effect ({FAMILY.SERIAL_ID},"
                   " task_id VARCHAR(704) NOT NULL, n INT NOT NULL)")
    with db.atomic():
        events = [repo.create_in_transaction(
            event_type="order.paid", aggregate_type="order", aggregate_id=str(n),
            payload={"n": n}, dedupe_key=f"order:{n}") for n in range(EVENTS)]
    ids = {message_id(e): e.payload["n"] for e in events}
    runs = tmp_path / "runs.jsonl"
    relay = [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
             db_url.secret_text(), "--batch-size", str(FIRST_BATCH), "--lock-timeout", "30",
             "--progress-every", "0.5"]

    # A relay publishes its first batch to the broker and hangs before recording it.
    hung = tmp_path / "relay.hung"
    doomed = processes(relay + ["--publisher", "_relay_publishers:hanging_celery",
                                "--worker-id", "relay-doomed"],
                       _env(db_url, broker, runs, celery_task="outbox_test.once",
                            hang_after=1, marker=hung))
    wait_for(hung.exists, [doomed])
    first = {message_id(e) for e in events if str(e.id) in hung.read_text().split(",")}
    assert len(first) == FIRST_BATCH
    doomed.send_signal(signal.SIGKILL)  # between its publish and its record
    assert doomed.wait(timeout=30) == -signal.SIGKILL
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'processing'"
                 " AND locked_by = 'relay-doomed'") == [{"n": FIRST_BATCH}]

    # Its claims expire (set through SQL, not waited for); a second relay publishes all.
    fetch(f"UPDATE outbox_event SET locked_at = locked_at - {FAMILY.interval('1 HOUR')}"
          " WHERE locked_by = 'relay-doomed'")
    survivor = processes(relay + ["--celery-url", broker.url, "--celery-task",
                                  "outbox_test.once", "--celery-queue", broker.queue,
                                  "--until-empty"], _env(db_url, broker, runs))
    _, err = survivor.communicate(timeout=120)
    assert survivor.returncode == 0, err[-2000:]
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": EVENTS}]
    # The broker holds the first batch twice: a task without the inbox would run it twice.
    held = broker.held()
    assert len(held) == EVENTS + FIRST_BATCH
    assert {i: held.count(i) for i in ids} == {i: 1 + (i in first) for i in ids}

    worker = _worker(processes, _env(db_url, broker, runs))
    wait_for(lambda: len(_runs(runs)) >= EVENTS + FIRST_BATCH and broker.depth() == 0,
             [worker], state=lambda: _progress(runs, broker))
    _stop(worker)
    done = _runs(runs)
    # Every message ran its task; the inbox accepted each task id once, so the republished
    # batch's second runs changed nothing.
    assert len(done) == EVENTS + FIRST_BATCH and broker.depth() == 0
    assert {i: sum(r["task_id"] == i for r in done) for i in ids} == {
        i: 1 + (i in first) for i in ids}
    assert {i: sum(r["task_id"] == i and r["accepted"] for r in done) for i in ids} == {
        i: 1 for i in ids}
    rows = fetch("SELECT task_id, n, COUNT(*) AS copies FROM effect GROUP BY task_id, n")
    assert {r["task_id"]: r["n"] for r in rows} == ids
    assert {r["copies"] for r in rows} == {1}
    assert fetch("SELECT consumer, COUNT(*) AS n FROM inbox_message GROUP BY consumer") == [
        {"consumer": "celery-consumer", "n": EVENTS}]


# ---------------------------------------------------------------------------
# Configuration: one line, no password, nothing claimed
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("args,env,code,words", [
    (["--celery-url", "redis://:Sup3rSecret@127.0.0.1:1/0", "--celery-task", "t"], {}, 1,
     "Celery broker redis://:***@127.0.0.1:1/0 is unavailable"),
    (["--celery-url", "amqp://guest:Sup3rSecret@127.0.0.1:5672//", "--celery-task", "t"], {},
     1, "refused the login of user 'guest'"),
    (["--celery-task", "t"], {"OUTBOX_CELERY_URL": "amqp://guest:Sup3rSecret@127.0.0.1:1//"},
     1, "amqp://guest:***@127.0.0.1:1//"),
    (["--celery-url", "redis://127.0.0.1:6379/13"], {}, 2, "Celery also needs --celery-task"),
    (["--celery-task", "t"], {}, 2, "--celery-url (or $OUTBOX_CELERY_URL)"),
    (["--celery-url", "http://x:Sup3rSecret@h/", "--celery-task", "t"], {}, 2,
     "is not a RabbitMQ or Redis URL"),
    (["--celery-url", "redis://127.0.0.1:6379/13", "--celery-task", "t", "--queue", "q"], {},
     2, "choose one broker, not BullMQ and Celery"),
    (["--celery-url", "redis://127.0.0.1:6379/13", "--celery-task", "t", "--cloudevents"],
     {}, 2, "--cloudevents goes with --rabbitmq-url or --nats-url"),
])
def test_configuration_errors_are_one_line_and_claim_nothing(db, db_url, repo, fetch, args,
                                                             env, code, words):
    with db.atomic():
        repo.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                   aggregate_id="1", payload={"n": 1})
    environment = {k: v for k, v in os.environ.items() if k != "OUTBOX_CELERY_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
         db_url.secret_text(), *args], capture_output=True, text=True, timeout=60,
        env={**environment, **env})
    assert result.returncode == code, result.stderr
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Sup3rSecret" not in result.stderr
    assert fetch("SELECT status FROM outbox_event") == [{"status": "pending"}]


def test_bad_arguments_and_a_closed_publisher():
    from outbox_lite import InvalidEventError

    with pytest.raises(InvalidEventError, match="not a RabbitMQ or Redis URL"):
        CeleryPublisher("nats://127.0.0.1:4222", "t")
    with pytest.raises(InvalidEventError, match="task"):
        CeleryPublisher(CELERY_REDIS, "")
    publisher = CeleryPublisher("redis://:Sup3rSecret@127.0.0.1:6379/13", "t", queue="q")
    assert "Sup3rSecret" not in repr(publisher) and "***" in repr(publisher)
    publisher.close()
    with pytest.raises(Exception, match="closed") as raised:
        publisher.ping()
    assert raised.value.error_code == "celery_closed"
