"""End to end into RabbitMQ and NATS JetStream: business transactions -> outbox ->
`outbox-lite relay` processes -> the broker -> a consumer written with the broker's own client
(pika, nats-py). Faults: a relay SIGKILLed after its batch reached the broker and before it was
recorded, the broker stopped and started again, messages the broker cannot route, and
configuration errors at start."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from outbox_lite import Backoff, OutboxRepository
from outbox_lite.publishers import message_id
from outbox_lite.publishers.nats import NATSPublisher
from outbox_lite.publishers.rabbitmq import RabbitMQPublisher
from outbox_lite.relay import Relay

from _brokers import (SHARED_NATS, SHARED_RABBITMQ, AMQPConsumer, Exchange, JetStreamConsumer,
                      Stream, drain_queue, new_exchange, new_stream)
from _helpers import FAMILY
from _redis import SHARED_REDIS
from _relays import TESTS, StopsServerBefore, finish, orders, relay_process, wait_for

EVENTS = 2000


class _RabbitMQ:
    """What a test needs to know of RabbitMQ: its flags, its consumer, its guarantee."""

    name = "rabbitmq"
    hanging = "_relay_publishers:hanging_rabbitmq"

    def __init__(self, exchange: Exchange) -> None:
        self.target = exchange

    def flags(self) -> list[str]:
        return ["--rabbitmq-url", SHARED_RABBITMQ, "--exchange", self.target.name]

    def hanging_env(self) -> dict[str, str]:
        return {"OUTBOX_TEST_RABBITMQ_URL": SHARED_RABBITMQ,
                "OUTBOX_TEST_EXCHANGE": self.target.name}

    def consumer(self) -> AMQPConsumer:
        return AMQPConsumer(self.target)

    def check_extra(self, message, event) -> None:
        assert message.extra == {"content_type": "application/json", "delivery_mode": 2,
                                 "routing_key": event.event_type, "other_headers": {}}

    def held(self) -> int:
        return self.target.depth()


class _NATS:
    name = "nats"
    hanging = "_relay_publishers:hanging_nats"

    def __init__(self, stream: Stream) -> None:
        self.target = stream

    def flags(self) -> list[str]:
        return ["--nats-url", SHARED_NATS, "--subject-prefix", self.target.prefix]

    def hanging_env(self) -> dict[str, str]:
        return {"OUTBOX_TEST_NATS_URL": SHARED_NATS,
                "OUTBOX_TEST_SUBJECT_PREFIX": self.target.prefix}

    def consumer(self) -> JetStreamConsumer:
        return JetStreamConsumer(self.target)

    def check_extra(self, message, event) -> None:
        assert message.extra["subject"] == f"{self.target.prefix}.{event.event_type}"
        assert message.extra["other_headers"] == {}

    def held(self) -> int:
        return self.target.count()


@pytest.fixture(params=["rabbitmq", "nats"])
def broker(request):
    if request.param == "rabbitmq":
        return _RabbitMQ(request.getfixturevalue("exchange"))
    return _NATS(request.getfixturevalue("stream"))


def _check_messages(broker, messages, events):
    """Every message is one of ``events`` with every field of SPEC §6, and its payload
    unchanged (compared as JSON values: MySQL normalises the stored text)."""
    by_id = {message_id(e): e for e in events}
    for message in messages:
        event = by_id[message.message_id]
        assert (message.event_id, message.event_type, message.aggregate_type,
                message.aggregate_id, message.payload) == (
            event.id, event.event_type, event.aggregate_type, event.aggregate_id,
            event.payload)
        broker.check_extra(message, event)


def test_three_relays_one_killed_mid_batch_deliver_every_event(
        broker, db, db_url, repo, fetch, tmp_path):
    events = orders(db, repo, EVENTS)
    consumer = broker.consumer()
    consumer.start()  # reads while the relays publish
    marker = tmp_path / "hung"
    doomed = relay_process(
        db_url, "--publisher", broker.hanging, "--batch-size", "50", "--lock-timeout", "20",
        worker_id="relay-doomed",
        env={"OUTBOX_TEST_HANG_AFTER": "2", "OUTBOX_TEST_MARKER": str(marker),
             **broker.hanging_env()})
    wait_for(marker.exists, [doomed])
    # The survivors start once the doomed relay holds its second batch (see
    # test_relay_e2e.py); they cannot end while its claims are in flight.
    survivors = [relay_process(db_url, *broker.flags(), "--batch-size", "50",
                               "--lock-timeout", "20", "--until-empty") for _ in range(2)]
    wait_for(lambda: fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'pending'")
             == [{"n": 0}], survivors)
    doomed.send_signal(signal.SIGKILL)  # its batch is in the broker, nothing recorded
    assert doomed.wait(timeout=30) == -signal.SIGKILL
    held = {int(i) for i in marker.read_text().split(",")}
    assert len(held) == 50
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE locked_by = 'relay-doomed'"
                 " AND status = 'processing'") == [{"n": 50}]
    fetch(f"UPDATE outbox_event SET locked_at = locked_at - {FAMILY.interval('1 HOUR')}"
          " WHERE locked_by = 'relay-doomed'")  # its claims expire (through SQL)
    results = [finish(p) for p in survivors]
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    assert all("published" in err for _, _, err in results)  # progress lines
    messages = consumer.stop()

    rows = {r["id"]: r for r in fetch("SELECT id, status, attempt_count FROM outbox_event")}
    assert {r["status"] for r in rows.values()} == {"published"}
    assert {i for i, r in rows.items() if r["attempt_count"] == 2} == held
    _check_messages(broker, messages, events)
    seen = collections.Counter(m.message_id for m in messages)
    assert set(seen) == {message_id(e) for e in events}  # nothing lost
    again = {m.event_id for m in messages if seen[m.message_id] > 1}
    if broker.name == "nats":
        # The duplicate window dropped the republished 50: the stream holds each event once.
        assert len(messages) == EVENTS and broker.held() == EVENTS and not again
    else:
        # RabbitMQ has no dedupe: the 50 came again, with the same message_id and fields.
        assert again == held and max(seen.values()) == 2 and len(messages) == EVENTS + 50


def test_ordered_relays_deliver_each_aggregate_in_id_order(broker, db, db_url, repo, fetch):
    events = orders(db, repo, 600, aggregates=60)
    consumer = broker.consumer()
    consumer.start()
    relays = [relay_process(db_url, *broker.flags(), "--batch-size", "20", "--ordered",
                            "--until-empty") for _ in range(3)]
    results = [finish(p) for p in relays]
    assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    messages = consumer.stop()
    _check_messages(broker, messages, events)
    assert len(messages) == 600
    per_aggregate = collections.defaultdict(list)
    for message in messages:
        per_aggregate[message.aggregate_id].append(message.event_id)
    assert len(per_aggregate) == 60
    assert all(ids == sorted(ids) and len(ids) == 10 for ids in per_aggregate.values())


# ---------------------------------------------------------------------------
# The broker stopped mid-run: a server of the test's own
# ---------------------------------------------------------------------------

def _outage(db, fetch, publisher, server):
    """400 events through a relay whose 6th publish finds the broker stopped; while it is
    down nothing more is claimed or published; after ``server.start()`` all are published,
    none with more than 2 attempts. Returns the events."""
    repo = OutboxRepository(db, backoff=Backoff(base=0.01, cap=0.05, jitter=0))
    events = orders(db, repo, 400)
    stopping = StopsServerBefore(publisher, server, batch=6)
    relay = Relay(repo, stopping, worker_id="relay-outage", batch_size=20,
                  reconnect_pause=0.05, max_reconnect_pause=0.2, progress_every=0)
    stop = threading.Event()
    watchdog = threading.Timer(150, stop.set)
    watchdog.start()
    worker = threading.Thread(target=relay.run, args=(stop,), kwargs={"until_empty": True})
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while relay.stats.publish_errors == 0:  # the 6th batch met the stopped server
            assert time.monotonic() < deadline and worker.is_alive()
            time.sleep(0.01)
        published = fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'published'")
        assert published == [{"n": 100}]  # the five batches before the outage
        while stopping.failed_pings < 3:  # the outage lasts: the relay pings, claims nothing
            assert time.monotonic() < deadline and worker.is_alive()
            time.sleep(0.01)
        assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'published'") == (
            published)
        assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'processing'"
                     " OR attempt_count > 1") == [{"n": 0}]
        server.start()  # the same port and data
        worker.join(timeout=150)
    finally:
        watchdog.cancel()
        stop.set()
        worker.join(timeout=30)
        publisher.close()
    assert relay.stats.publish_errors == 1, relay.stats
    rows = fetch("SELECT status, attempt_count FROM outbox_event")
    assert {r["status"] for r in rows} == {"published"}
    assert max(r["attempt_count"] for r in rows) == 2  # the outage spent one attempt
    return events


def test_rabbitmq_stopped_mid_run_delays_but_loses_nothing(db, fetch, rabbitmq_node):
    node = rabbitmq_node()
    target = new_exchange(node.url)
    events = _outage(db, fetch, RabbitMQPublisher(node.url, target.name, timeout=2), node)
    messages = drain_queue(target)  # durable queue, persistent messages: kept over the stop
    assert {m.message_id for m in messages} == {message_id(e) for e in events}


def test_nats_stopped_mid_run_delays_but_loses_nothing(db, fetch, nats_server):
    server = nats_server()
    target = new_stream(server.url)
    events = _outage(db, fetch, NATSPublisher(server.url, target.prefix, timeout=2), server)
    messages = target.messages()  # a file-backed stream: kept over the stop
    assert sorted(m.message_id for m in messages) == sorted(message_id(e) for e in events)


# ---------------------------------------------------------------------------
# Messages the broker cannot take: retried, then dead letters; never published
# ---------------------------------------------------------------------------

def _mixed(db, publisher):
    """Events of a routable type and of an other, through a relay (2 attempts each, a short
    backoff); returns the repository's rows by event type."""
    repo = OutboxRepository(db, max_attempts=2, backoff=Backoff(base=0.01, cap=0.02, jitter=0))
    with db.atomic():
        for n, kind in enumerate(["job.created", "audit.logged", "bad type", "job.created"]):
            repo.create_in_transaction(event_type=kind, aggregate_type="job",
                                       aggregate_id=str(n), payload={"n": n})
    with publisher:
        Relay(repo, publisher, batch_size=10, progress_every=0).run(until_empty=True)
    rows = collections.defaultdict(list)
    for event in repo.model.select().order_by(repo.model.id):
        rows[event.event_type].append((event.status, event.attempt_count,
                                       event.last_error_code))
    return rows


def test_unroutable_rabbitmq_messages_are_retried_then_dead_letters(db):
    target = new_exchange(binding="job.*")  # nothing takes audit.logged or "bad type"
    try:
        rows = _mixed(db, RabbitMQPublisher(SHARED_RABBITMQ, target.name))
        messages = drain_queue(target)
    finally:
        target.delete()
    assert rows == {"job.created": [("published", 1, None)] * 2,
                    "audit.logged": [("failed", 2, "unroutable")],
                    "bad type": [("failed", 2, "unroutable")]}
    assert sorted(m.aggregate_id for m in messages) == ["0", "3"]


def test_a_bad_nats_subject_is_a_dead_letter_and_an_uncaptured_one_retried(db):
    prefix = f"outbox-test-{uuid.uuid4().hex[:12]}"
    target = Stream(SHARED_NATS, f"OUTBOX_TEST_{prefix[-12:]}", prefix, [f"{prefix}.job.>"])
    target.create()  # captures job.* only
    try:
        rows = _mixed(db, NATSPublisher(SHARED_NATS, prefix))
        messages = target.messages()
    finally:
        target.delete()
    assert rows == {"job.created": [("published", 1, None)] * 2,
                    "audit.logged": [("failed", 2, "no_stream")],
                    "bad type": [("failed", 1, "invalid_subject")]}  # never retried
    assert sorted(m.aggregate_id for m in messages) == ["0", "3"]


# ---------------------------------------------------------------------------
# Configuration errors at start: one line, exit 1 (2 for flags that do not fit), nothing
# claimed, no password
# ---------------------------------------------------------------------------

SECRET = "Sup3rSecret"


def _relay_command(db_url, args, env=None, cwd=None, timeout=60):
    command = [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
               db_url.secret_text(), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(TESTS), **(env or {})})


@pytest.mark.parametrize("args,env,code,words", [
    (["--rabbitmq-url", f"amqp://guest:{SECRET}@127.0.0.1:1/", "--exchange", "{exchange}"],
     {}, 1, "is unavailable"),
    (["--rabbitmq-url", f"amqp://guest:{SECRET}@127.0.0.1:5672/", "--exchange", "{exchange}"],
     {}, 1, "refused the login of user 'guest'"),
    (["--exchange", "{exchange}"], {"OUTBOX_RABBITMQ_URL": f"amqp://guest:{SECRET}@127.0.0.1/"},
     1, "refused the login"),
    (["--rabbitmq-url", SHARED_RABBITMQ, "--exchange", "no-such-exchange"], {}, 1,
     "exchange 'no-such-exchange' does not exist"),
    (["--rabbitmq-url", "amqp://guest:guest@127.0.0.1:5672/no-such-vhost", "--exchange",
      "{exchange}"], {}, 1, "refused to open the virtual host"),
    (["--rabbitmq-url", f"http://guest:{SECRET}@127.0.0.1/", "--exchange", "{exchange}"], {},
     2, "is not an AMQP URL"),
    (["--nats-url", f"nats://user:{SECRET}@127.0.0.1:1", "--subject-prefix", "{prefix}"], {},
     1, "is unavailable"),
    (["--nats-url", SHARED_NATS, "--subject-prefix", "no-such-prefix"], {}, 1,
     "no JetStream stream captures subjects 'no-such-prefix.>'"),
    (["--nats-url", f"redis://u:{SECRET}@127.0.0.1:4222", "--subject-prefix", "{prefix}"], {},
     2, "is not a NATS URL"),
    (["--nats-url", SHARED_NATS, "--subject-prefix", "a.*"], {}, 2, "is not a subject"),
    (["--rabbitmq-url", SHARED_RABBITMQ, "--exchange", "{exchange}", "--nats-url", SHARED_NATS],
     {}, 2, "choose one broker, not RabbitMQ and NATS"),
    (["--exchange", "{exchange}"], {}, 2, "RabbitMQ also needs --rabbitmq-url"),
    (["--nats-url", SHARED_NATS], {}, 2, "NATS also needs --subject-prefix"),
    (["--publisher", "_relay_publishers:gated", "--subject-prefix", "x"], {}, 2,
     "--subject-prefix goes with --nats-url, not with --publisher"),
])
def test_configuration_errors_are_one_line_and_claim_nothing(
        db, db_url, repo, fetch, exchange, stream, args, env, code, words):
    orders(db, repo, 10)
    args = [a.format(exchange=exchange.name, prefix=stream.prefix) for a in args]
    result = _relay_command(db_url, args, env)
    assert result.returncode == code, result.stderr
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and SECRET not in result.stderr
    assert fetch("SELECT status, attempt_count, COUNT(*) AS n FROM outbox_event"
                 " GROUP BY status, attempt_count") == [
        {"status": "pending", "attempt_count": 0, "n": 10}]
    assert exchange.depth() == 0 and stream.count() == 0


@pytest.mark.parametrize("hidden,args,extra", [
    ("bullmq", ["--bullmq-url", SHARED_REDIS, "--queue", "q"], "bullmq"),
    ("aiormq", ["--rabbitmq-url", SHARED_RABBITMQ, "--exchange", "x"], "rabbitmq"),
    ("nats", ["--nats-url", SHARED_NATS, "--subject-prefix", "x"], "nats"),
    ("celery", ["--celery-url", SHARED_REDIS, "--celery-task", "t"], "celery"),
])
def test_a_broker_whose_extra_is_missing_is_one_line_naming_it(
        db, db_url, repo, fetch, hidden, args, extra):
    orders(db, repo, 4)
    code = (f"import sys; sys.modules[{hidden!r}] = None  # as if it were not installed\n"
            "from outbox_lite.cli import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run(
        [sys.executable, "-c", code, "relay", "--database-url", db_url.secret_text(), *args],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("outbox-lite relay: error: ")
    assert f"pip install 'outbox-lite[{extra}]'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert fetch("SELECT status, attempt_count, COUNT(*) AS n FROM outbox_event"
                 " GROUP BY status, attempt_count") == [
        {"status": "pending", "attempt_count": 0, "n": 4}]


def test_a_nats_password_is_checked_at_start_and_never_shown(db, db_url, repo, fetch,
                                                            nats_server):
    server = nats_server("--user", "relay", "--pass", SECRET)
    good = f"nats://relay:{SECRET}@127.0.0.1:{server.port}"
    target = new_stream(good)
    orders(db, repo, 10)
    refused = _relay_command(db_url, ["--nats-url", good.replace(SECRET, "wrong-pass"),
                                      "--subject-prefix", target.prefix])
    assert refused.returncode == 1, refused.stderr
    assert "refused the login" in refused.stderr and "wrong-pass" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE attempt_count > 0") == [{"n": 0}]
    ran = _relay_command(db_url, ["--subject-prefix", target.prefix, "--until-empty",
                                  "--progress-every", "0.5"], env={"OUTBOX_NATS_URL": good})
    assert ran.returncode == 0, ran.stderr
    assert f"nats://relay:***@127.0.0.1:{server.port}" in ran.stderr  # the start-up line
    assert SECRET not in ran.stderr
    assert target.count() == 10


def test_a_publisher_module_in_the_current_directory_is_found(db, db_url, repo, fetch,
                                                             tmp_path, exchange):
    """As a new user runs it: the console script, from the folder that holds mypub.py."""
    (tmp_path / "mypub.py").write_text(
        "from outbox_lite.publishers.rabbitmq import RabbitMQPublisher\n"
        f"def make():\n    return RabbitMQPublisher({SHARED_RABBITMQ!r}, {exchange.name!r})\n")
    orders(db, repo, 10)
    script = Path(sys.executable).with_name("outbox-lite")
    result = subprocess.run([str(script), "relay", "--database-url", db_url.secret_text(),
                             "--publisher", "mypub:make", "--until-empty"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    assert "to <RabbitMQPublisher exchange=" in result.stderr
    assert "amqp://guest:***@127.0.0.1:5672/" in result.stderr  # the start-up line, masked
    assert exchange.depth() == 10
