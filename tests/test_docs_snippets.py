"""The documentation's runnable blocks, run as written: only the names change (the test's own
database, queue, exchange, stream), as tests/test_readme.py does for the rest. Each block
names this file and its test in the marker above it (see tests/_docs.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import peewee

from outbox_lite import OutboxRepository
from outbox_lite.relay import Relay

from _docs import CONNECT, URLS, block, connect, family_blocks
from _helpers import FAMILY


def _python(code: str, tmp_path: Path, name: str = "snippet.py", timeout: float = 90,
            **env: str) -> str:
    script = tmp_path / name
    script.write_text(code, encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, timeout=timeout,
                            capture_output=True, text=True, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _shell(line: str, tmp_path: Path, url, *extra: str) -> subprocess.CompletedProcess[str]:
    """A command line of the docs, with this test's database (its URL, password and options
    included, in place of the page's ``OUTBOX_DATABASE_URL``) and ``extra`` flags."""
    assert line.startswith("outbox-lite "), line
    args = line.split()[1:]
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "OUTBOX_DATABASE_URL": url.secret_text(),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(bin_dir / "outbox-lite"), *args, *extra], cwd=tmp_path,
                          timeout=120, capture_output=True, text=True, env=env)


def _lines(page: str, lang: str, start: str) -> list[str]:
    """The lines starting with ``start`` of ``page``'s ``lang`` blocks, outside tabs and in
    the test server's family's tab."""
    return [line for b in family_blocks(page) if b.lang == lang
            for line in b.code.splitlines() if line.startswith(start)]


# ---------------------------------------------------------------------------
# docs/getting-started.md, the whole page in order
# ---------------------------------------------------------------------------

def test_getting_started_runs_as_written(db_url, fetch, tmp_path, rds, queue):
    page = "docs/getting-started.md"
    # MySQL and MariaDB: the command's default URL; PostgreSQL: the page sets it first.
    assert _lines(page, "sh", "export OUTBOX_DATABASE_URL=") == (
        [] if FAMILY.name == "mysql" else [f"export OUTBOX_DATABASE_URL={URLS[FAMILY.name]}"])
    [migrate] = _lines(page, "sh", "outbox-lite migrate")
    first = _shell(migrate, tmp_path, db_url)
    assert first.returncode == 0 and first.stdout == (
        f"{db_url.name} is up to date ({db_url.location})\n"), first
    write = block(page, "create_in_transaction(", lang="python")
    consume = block(page, "inbox.accept(job.id)", lang="python")
    [relay] = _lines(page, "sh", "outbox-lite relay")
    assert write.count(CONNECT) == 1 and consume.count(CONNECT) == 1
    assert _python(write.replace(CONNECT, connect(db_url)), tmp_path) == \
        "order 1 and its event committed together\n"
    relayed = _shell(relay.replace("domain-events", queue), tmp_path, db_url)
    assert relayed.returncode == 0, relayed.stderr
    assert json.loads(rds.hget(f"bull:{queue}:outbox-order.placed%3A1", "data")) == \
        {"order_id": 1}  # the job the page names
    out = _python(consume.replace(CONNECT, connect(db_url))
                  .replace('"domain-events"', repr(queue)), tmp_path, "consume.py")
    assert out == "shipped order.placed {'order_id': 1}\n"  # what the page says it prints
    assert fetch("SELECT order_id FROM shipment") == [{"order_id": 1}]
    assert fetch("SELECT consumer, message_id FROM inbox_message") == [
        {"consumer": "shipping", "message_id": "outbox-order.placed%3A1"}]
    assert fetch("SELECT status FROM outbox_event") == [{"status": "published"}]
    fetch("DROP TABLE orders")
    fetch("DROP TABLE shipment")


# ---------------------------------------------------------------------------
# docs/guides/upgrades.md: migrating from Python
# ---------------------------------------------------------------------------

def test_the_migrate_snippet_runs_as_written(db_url, tmp_path):
    code = block("docs/guides/upgrades.md", "outbox_lite.migrate.migrate(db)", lang="python")
    assert code.count(CONNECT) == 1
    out = _python(code.replace(CONNECT, connect(db_url)), tmp_path).splitlines()
    assert out[0] == "[]"  # the test database is migrated already: nothing pending
    assert out[1].startswith("['001_create_outbox_event', ") and "005_exact_aggregate_ids" in out[1]


# ---------------------------------------------------------------------------
# docs/guides/publisher.md: a factory for --publisher, and the command that uses it
# ---------------------------------------------------------------------------

def test_the_publisher_factory_runs_as_written(db, db_url, fetch, tmp_path):
    page = "docs/guides/publisher.md"
    package = tmp_path / "myservice"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "outbox.py").write_text(block(page, "def make_publisher(", lang="python"))
    outbox = OutboxRepository(db)
    with db.atomic():
        outbox.create_in_transaction(event_type="order.placed", aggregate_type="order",
                                     aggregate_id="7", payload={"note": "café"},
                                     dedupe_key="order.placed:7")
        outbox.create_in_transaction(event_type="test.ping", aggregate_type="order",
                                     aggregate_id="8", payload={"n": 1})
    db.close()
    [line] = _lines(page, "sh", "outbox-lite relay")
    result = _shell(line, tmp_path, db_url, "--until-empty")
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "events.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == [
        {"id": "outbox-order.placed%3A7", "type": "order.placed", "data": {"note": "café"}}]
    assert fetch("SELECT event_type, status, last_error_code FROM outbox_event ORDER BY id") == [
        {"event_type": "order.placed", "status": "published", "last_error_code": None},
        {"event_type": "test.ping", "status": "failed", "last_error_code": "refused"}]


# ---------------------------------------------------------------------------
# docs/guides/bullmq.md: the publisher by hand
# ---------------------------------------------------------------------------

def test_the_bullmq_publisher_snippet_runs_as_written(db, db_url, fetch, tmp_path, rds, queue):
    code = block("docs/guides/bullmq.md", "publisher.publish(batch)", lang="python")
    assert code.count(CONNECT) == 1 and code.count('"domain-events"') == 1
    outbox = OutboxRepository(db)
    with db.atomic():
        outbox.create_in_transaction(event_type="order.placed", aggregate_type="order",
                                     aggregate_id="5", payload={"order_id": 5},
                                     dedupe_key="order 5:placed")
    db.close()
    out = _python(code.replace(CONNECT, connect(db_url))
                  .replace('"domain-events"', repr(queue)), tmp_path)
    assert out == "1 published, 0 failed\n"
    job = rds.hgetall(f"bull:{queue}:outbox-order%205%3Aplaced")
    assert job["name"] == "order.placed" and json.loads(job["data"]) == {"order_id": 5}
    assert fetch("SELECT status FROM outbox_event") == [{"status": "published"}]


# ---------------------------------------------------------------------------
# docs/guides/rabbitmq.md and nats.md: the relay lines on a fresh broker, after the set-up
# ---------------------------------------------------------------------------

def _relay_on_a_fresh_broker(db, db_url, fetch, tmp_path, line: str, refusal: str,
                             setup: str) -> None:
    """The relay line refused on the fresh broker (one line naming what is missing), then,
    after the page's set-up, publishing the one event; the caller checks the broker."""
    outbox = OutboxRepository(db)
    with db.atomic():
        outbox.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                     aggregate_id="9", payload={"order_id": 9},
                                     dedupe_key="order.paid:9")
    db.close()
    before = _shell(line, tmp_path, db_url, "--until-empty")
    assert before.returncode == 1 and refusal in before.stderr, before.stderr
    _python(setup, tmp_path)
    result = _shell(line, tmp_path, db_url, "--until-empty")
    assert result.returncode == 0, result.stderr
    assert fetch("SELECT status FROM outbox_event") == [{"status": "published"}]


def test_the_rabbitmq_relay_line_runs_on_a_fresh_broker(db, db_url, fetch, tmp_path):
    from _brokers import Exchange, SHARED_RABBITMQ

    page = "docs/guides/rabbitmq.md"
    setup = block(page, "exchange_declare(", "amqp.close()", "import pika\n\n", lang="python")
    target = Exchange(SHARED_RABBITMQ, f"docs-{db_url.name}", f"docs-{db_url.name}-q")
    [line] = _lines(page, "sh", "outbox-lite relay --rabbitmq-url")
    try:
        _relay_on_a_fresh_broker(
            db, db_url, fetch, tmp_path, line.replace("--exchange orders",
                                                      f"--exchange {target.name}"),
            f"exchange {target.name!r} does not exist",
            setup.replace('"orders"', repr(target.name)).replace('"billing"', repr(target.queue)))
        assert target.depth() == 1  # the bound queue holds the event
    finally:
        target.delete()


def test_the_nats_relay_line_runs_on_a_fresh_server(db, db_url, fetch, tmp_path):
    from _brokers import SHARED_NATS, Stream

    page = "docs/guides/nats.md"
    setup = block(page, "async def add_stream(", lang="python")
    prefix = f"docs-{db_url.name}".replace("_", "-")
    target = Stream(SHARED_NATS, f"DOCS_{db_url.name}", prefix, [f"{prefix}.>"])
    [line] = _lines(page, "sh", "outbox-lite relay --nats-url")
    try:
        _relay_on_a_fresh_broker(
            db, db_url, fetch, tmp_path, line.replace("--subject-prefix shop",
                                                      f"--subject-prefix {prefix}"),
            f"no JetStream stream captures subjects '{prefix}.>'",
            setup.replace('"SHOP"', repr(target.name)).replace('"shop.>"', repr(f"{prefix}.>")))
        assert target.count() == 1
    finally:
        try:
            target.delete()
        except Exception:  # never created: the refusal's assertion failed first
            pass


# ---------------------------------------------------------------------------
# The pieces of programs (producing.md, envelope.md, relay.md): each run on the test server
# with the names it uses given, and what it wrote checked (issue 37: producing.md's piece
# used lastrowid, 0 on PostgreSQL, and no test ran it on any server)
# ---------------------------------------------------------------------------

ORDERS = {"mysql": "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
                   " item VARCHAR(64) NOT NULL)",
          "postgresql": "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, item VARCHAR(64) NOT NULL)"}


class _Message:
    """What pika hands a consumer's callback: channel, method, properties, body."""

    def __init__(self, headers, message_id=None, content_type="application/json"):
        self.headers, self.message_id, self.content_type = headers, message_id, content_type
        self.delivery_tag, self.acked = 1, []

    def basic_ack(self, tag):
        self.acked.append(tag)


class _Nothing:
    def publish(self, events):
        return {}

    def close(self):
        pass


def _run_piece(code: str, page: str, **names):
    namespace = {"dt": dt, "json": json, "peewee": peewee, **names}
    exec(compile(code, page, "exec"), namespace)
    return namespace


def test_the_python_pieces_run_on_the_test_server(db, db_url, fetch, capsys):
    from outbox_lite.publishers import DEFAULT_CLOUDEVENTS_SOURCE, cloudevent_attributes
    from outbox_lite.publishers.rabbitmq import CLOUDEVENTS_PREFIX

    outbox = OutboxRepository(db)
    db.execute_sql(ORDERS[FAMILY.name])
    try:
        # producing.md: the business row's id is the event's aggregate, twice over
        piece = block("docs/guides/producing.md", "orders.insert(", lang="python")
        for _ in range(2):
            _run_piece(piece, "producing.md", db=db, outbox=outbox)
        orders = fetch("SELECT id FROM orders ORDER BY id")
        assert len(orders) == 2 and all(row["id"] > 0 for row in orders), orders
        written = fetch("SELECT aggregate_id, dedupe_key, payload FROM outbox_event ORDER BY id")
        assert [(w["aggregate_id"], w["dedupe_key"], json.loads(w["payload"])) for w in written] \
            == [(str(o["id"]), f"order.placed:{o['id']}", {"order_id": o["id"]}) for o in orders]
        fetch("DELETE FROM outbox_event")

        # envelope.md: headers and a deadline on an event
        now = dt.datetime.now(dt.timezone.utc)
        _run_piece(block("docs/guides/envelope.md", "headers={", lang="python"), "envelope.md",
                   db=db, repo=outbox, request_id="req-7", now=now)
        [event] = outbox.find_dispatchable()
        assert (event.aggregate_id, event.headers) == ("42", {"x-request-id": "req-7",
                                                              "tenant": "acme"})
        assert abs(event.expires_at - (now + dt.timedelta(minutes=15))) < dt.timedelta(seconds=1)

        # envelope.md: a traced consumer applies a message once, acking each delivery
        applied = []
        consumer = _run_piece(block("docs/guides/envelope.md", "tracing.consume(", lang="python"),
                              "envelope.md", db=db, apply=applied.append)
        for _ in range(2):
            message = _Message({}, message_id="outbox-order.paid%3A42")
            consumer["on_message"](message, message, message, b'{"order_id": 42}')
            assert message.acked == [1]
        assert applied == [{"order_id": 42}]
        assert fetch("SELECT consumer, message_id FROM inbox_message") == [
            {"consumer": "billing", "message_id": "outbox-order.paid%3A42"}]

        # envelope.md: a CloudEvents consumer reads the attributes the publisher sends
        attributes = cloudevent_attributes(event, DEFAULT_CLOUDEVENTS_SOURCE)
        headers = {f"{CLOUDEVENTS_PREFIX}{name}": value for name, value in attributes.items()}
        reader = _run_piece(block("docs/guides/envelope.md", "from_binary(", lang="python"),
                            "envelope.md")
        capsys.readouterr()
        message = _Message(headers)
        reader["on_message"](message, message, message, b'{"order_id": 42, "total": "19.90"}')
        assert capsys.readouterr().out == (
            f"order.paid order/42 {event.created_at} {{'order_id': 42, 'total': '19.90'}}\n")
        assert message.acked == [1]

        # relay.md: the service's repository and a relay waking through Redis
        stop = threading.Event()
        stop.set()
        woken = _run_piece(block("docs/guides/relay.md", 'wake="redis://', lang="python"),
                           "relay.md", db=db, OutboxRepository=OutboxRepository, Relay=Relay,
                           publisher=_Nothing(), stop=stop)
        assert woken["outbox"].wake is not None
    finally:
        db.execute_sql("DROP TABLE orders")


# ---------------------------------------------------------------------------
# docs/guides/celery.md: the task, its worker and the relay line, a message sent twice
# ---------------------------------------------------------------------------

def test_the_celery_guide_runs_a_task_once_per_event(db, db_url, fetch, tmp_path):
    import signal
    import time
    import uuid

    import redis

    from outbox_lite.publishers.celery import CeleryPublisher

    page = "docs/guides/celery.md"
    broker, queue = "redis://127.0.0.1:6379/13", f"docs-orders-{uuid.uuid4().hex[:12]}"
    tasks = block(page, "def order_paid(", lang="python")
    assert tasks.count(CONNECT) == 1 and tasks.count('"redis://127.0.0.1:6379/0"') == 1
    (tmp_path / "tasks.py").write_text(
        tasks.replace(CONNECT, connect(db_url)).replace('"redis://127.0.0.1:6379/0"',
                                                        repr(broker)), encoding="utf-8")
    [relay_line] = _lines(page, "sh", "outbox-lite relay --celery-url")
    [worker_line] = _lines(page, "sh", "celery -A tasks worker")
    db.execute_sql("CREATE TABLE invoice (order_id INT NOT NULL, amount INT NOT NULL)")
    outbox = OutboxRepository(db)
    with db.atomic():
        events = [outbox.create_in_transaction(
            event_type="order.paid", aggregate_type="order", aggregate_id=str(n),
            payload={"order_id": n, "amount": 10 * n}, dedupe_key=f"order.paid:{n}")
            for n in (1, 2, 3)]
    db.close()
    client = redis.Redis.from_url(broker)
    worker = None
    try:
        result = _shell(relay_line.replace("redis://127.0.0.1:6379/0", broker)
                        .replace("--celery-queue orders", f"--celery-queue {queue}"),
                        tmp_path, db_url, "--until-empty")
        assert result.returncode == 0, result.stderr
        with CeleryPublisher(broker, "shop.order_paid", queue=queue) as publisher:
            assert publisher.publish(events[:1]) == {}  # as a relay that died would, again
        assert client.llen(queue) == 4
        args = worker_line.split()[1:]
        assert args == ["-A", "tasks", "worker", "-Q", "orders"]
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", *args[:-1], queue, "--pool", "solo",
             "--without-mingle", "--without-gossip", "--without-heartbeat",
             "-n", f"docs-{uuid.uuid4().hex[:8]}@%h"], cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Done: nothing waits in the queue, nothing is delivered but unacked (Celery acks as a
        # task starts; a warm shutdown finishes the task it runs), every event accepted.
        deadline = time.monotonic() + 60
        while (client.llen(queue) or client.hlen("unacked")
               or fetch("SELECT COUNT(*) AS n FROM inbox_message")[0]["n"] < 3):
            assert worker.poll() is None and time.monotonic() < deadline, worker.stderr.read()
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)  # a warm shutdown: the task in hand finishes
        _, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err[-2000:]
        assert client.llen(queue) == 0  # all four messages ran: none went back to the queue
        assert fetch("SELECT order_id, amount FROM invoice ORDER BY order_id") == [
            {"order_id": n, "amount": 10 * n} for n in (1, 2, 3)]
        assert fetch("SELECT consumer, COUNT(*) AS n FROM inbox_message GROUP BY consumer") == [
            {"consumer": "invoices", "n": 3}]
        assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
            {"status": "published", "n": 3}]
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.communicate()
        client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        client.close()
