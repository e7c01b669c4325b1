"""End to end: outbox -> `outbox-lite relay` -> BullMQ on real Redis, or RabbitMQ -> consumer
processes (BullMQ's own Worker; a pika consumer with manual acks) whose handler accepts each
message id in the inbox and writes its business row in the same transaction. Faults:
consumers SIGKILLed after their commit and before BullMQ records the job complete or before
the ack (the broker hands the message out again), and a relay SIGKILLed between its publish and
its record (its successor publishes the batch again). Every event's business row must exist
exactly once."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from outbox_lite.publishers import message_id

from _brokers import SHARED_RABBITMQ
from _helpers import FAMILY
from _redis import SHARED_REDIS

TESTS = Path(__file__).resolve().parent
EVENTS = 60
FIRST_BATCH = 10


class _BullMQ:
    """The doomed relay's jobs are removed once completed, so its successor's copies come back
    as new jobs; a killed worker's job comes back once BullMQ's stalled-job checker sees its
    lock gone (about 2 s with the worker's settings)."""

    hanging = "_inbox_publishers:hanging_forgetful_bullmq"

    def __init__(self, queue, rds) -> None:
        self.queue, self.rds = queue, rds

    def env(self) -> dict[str, str]:
        return {"broker": "bullmq", "redis_url": SHARED_REDIS, "queue": self.queue}

    def flags(self) -> list[str]:
        return ["--bullmq-url", SHARED_REDIS, "--queue", self.queue]

    def gone(self, ids) -> bool:
        """None of these messages is held by the broker any longer."""
        return not any(self.rds.exists(f"bull:{self.queue}:{i}") for i in ids)

    def idle(self) -> bool:
        return (self.rds.llen(f"bull:{self.queue}:wait") == 0
                and self.rds.llen(f"bull:{self.queue}:active") == 0)


class _RabbitMQ:
    """RabbitMQ keeps no dedupe, so the successor's copies arrive again as they are; a killed
    consumer's unacked message is requeued as soon as its connection drops."""

    hanging = "_relay_publishers:hanging_rabbitmq"

    def __init__(self, exchange) -> None:
        self.exchange = exchange

    def env(self) -> dict[str, str]:
        return {"broker": "rabbitmq", "rabbitmq_url": SHARED_RABBITMQ,
                "exchange": self.exchange.name, "amqp_queue": self.exchange.queue}

    def flags(self) -> list[str]:
        return ["--rabbitmq-url", SHARED_RABBITMQ, "--exchange", self.exchange.name]

    def gone(self, ids) -> bool:
        return self.exchange.depth() == 0

    def idle(self) -> bool:
        return self.exchange.depth() == 0


@pytest.fixture(params=["bullmq", "rabbitmq"])
def broker(request):
    if request.param == "bullmq":
        return _BullMQ(request.getfixturevalue("queue"), request.getfixturevalue("rds"))
    return _RabbitMQ(request.getfixturevalue("exchange"))


def _env(db_url, broker, **extra):
    settings = {**broker.env(), **extra}
    return {**os.environ, "PYTHONPATH": str(TESTS),
            "OUTBOX_TEST_DATABASE_URL": db_url.secret_text(),
            **{f"OUTBOX_TEST_{k.upper()}": str(v) for k, v in settings.items()}}


def _consumer(start, db_url, broker, tmp_path, name, hang_after=0):
    marker = tmp_path / f"{name}.committed"
    process = start([sys.executable, str(TESTS / "_inbox_worker.py")],
                    _env(db_url, broker, hang_after=hang_after, marker=marker))
    return process, marker


def _relay(start, db_url, *args, env):
    return start([sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
                  db_url.secret_text(), "--batch-size", str(FIRST_BATCH), "--lock-timeout", "20",
                  "--progress-every", "0.5", *args], env)


def _wait_for(condition, processes, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            for p in processes:
                p.kill()
            pytest.fail(f"waited in vain for {what}: "
                        + " | ".join(p.communicate()[1][-1500:] for p in processes))
        time.sleep(0.02)


def _kill(process):
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    process.communicate()


def test_kills_of_consumers_and_of_a_relay_leave_each_business_row_exactly_once(
        broker, db, db_url, repo, fetch, tmp_path, processes):
    db.execute_sql(f"CREATE TABLE effect ({FAMILY.SERIAL_ID},"
                   " message_id VARCHAR(704) NOT NULL, n INT NOT NULL, pid INT NOT NULL)")
    db.execute_sql(f"CREATE TABLE delivery ({FAMILY.SERIAL_ID},"
                   " message_id VARCHAR(704) NOT NULL, accepted BOOL NOT NULL,"
                   " pid INT NOT NULL)")
    with db.atomic():
        events = [repo.create_in_transaction(
            event_type="order.paid", aggregate_type="order", aggregate_id=str(n),
            payload={"n": n}, dedupe_key=f"order:{n}") for n in range(EVENTS)]
    ids = {message_id(e): e.payload["n"] for e in events}

    def effects() -> int:
        count = fetch("SELECT COUNT(*) AS n FROM effect")[0]["n"]
        assert count <= EVENTS, "a business row was written twice"
        return count

    def deliveries() -> dict[str, tuple[int, int]]:
        """Per message id: how many deliveries the inbox accepted, and how many in all (BOOL
        is a number on MySQL, a boolean that SUM refuses on PostgreSQL: CASE counts both)."""
        return {r["message_id"]: (int(r["firsts"]), r["n"]) for r in fetch(
            "SELECT message_id, SUM(CASE WHEN accepted THEN 1 ELSE 0 END) AS firsts,"
            " COUNT(*) AS n FROM delivery GROUP BY message_id")}

    # A relay publishes its first batch and hangs before recording it (killed there, below).
    hung = tmp_path / "relay.hung"
    doomed = _relay(processes, db_url, "--publisher", broker.hanging,
                    "--worker-id", "relay-doomed",
                    env=_env(db_url, broker, hang_after=1, marker=hung))
    _wait_for(hung.exists, [doomed], "the doomed relay's first batch")
    first = [message_id(e) for e in events if str(e.id) in hung.read_text().split(",")]
    assert len(first) == FIRST_BATCH

    # Two consumers die, each right after a commit, before the job is completed or acked.
    killed = []
    for name, hang_after in (("w1", 3), ("w2", 2)):
        worker, marker = _consumer(processes, db_url, broker, tmp_path, name, hang_after)
        _wait_for(marker.exists, [worker, doomed], f"{name}'s commit")
        killed.append(marker.read_text())
        _kill(worker)
    # A third works off what they left and the rest of the batch.
    w3, w3_marker = _consumer(processes, db_url, broker, tmp_path, "w3", hang_after=12)
    _wait_for(lambda: effects() >= FIRST_BATCH and broker.gone(first), [w3, doomed],
              "the first batch")
    assert effects() == FIRST_BATCH

    # The doomed relay dies between publish and record; its claims expire (set through SQL);
    # its successor publishes that batch again, then the rest.
    _kill(doomed)
    fetch(f"UPDATE outbox_event SET locked_at = locked_at - {FAMILY.interval('1 HOUR')}"
          " WHERE locked_by = 'relay-doomed'")
    survivor = _relay(processes, db_url, *broker.flags(), "--until-empty",
                      env=_env(db_url, broker))
    _wait_for(w3_marker.exists, [w3], "w3's twelfth commit")
    killed.append(w3_marker.read_text())
    _kill(w3)
    w4, _ = _consumer(processes, db_url, broker, tmp_path, "w4")
    out, err = survivor.communicate(timeout=120)
    assert survivor.returncode == 0, err[-2000:]
    # Each id comes at least once, the republished batch once more, a killed one once more
    # for each kill.
    least = {i: 1 + (i in first) + killed.count(i) for i in ids}

    def done() -> bool:
        seen = deliveries()
        return (effects() == EVENTS and broker.idle()
                and all(seen.get(i, (0, 0))[1] >= n for i, n in least.items()))

    _wait_for(done, [w4], "every delivery")
    w4.send_signal(signal.SIGTERM)
    assert w4.wait(timeout=30) == 0, w4.communicate()[1][-2000:]
    w4.communicate()

    # Exactly one business row per event, with its payload; the inbox holds each id once,
    # and accepted exactly one delivery of each: the faults did happen, and changed nothing.
    rows = fetch("SELECT message_id, n, COUNT(*) AS copies FROM effect GROUP BY message_id, n")
    assert {r["message_id"]: r["n"] for r in rows} == ids
    assert {r["copies"] for r in rows} == {1}
    assert fetch("SELECT consumer, COUNT(*) AS n FROM inbox_message GROUP BY consumer") == [
        {"consumer": "billing", "n": EVENTS}]
    seen = deliveries()
    assert set(seen) == set(ids) and len(killed) == 3
    assert {firsts for firsts, _ in seen.values()} == {1}
    assert sum(n for _, n in seen.values()) >= EVENTS + FIRST_BATCH + 3
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": EVENTS}]
