"""Expiry (SPEC §11): an event past its ``expires_at`` is never published; the relay makes it a
dead letter with ``last_error_code`` ``expired`` and counts it as
``outbox_relay_events_total{outcome="expired"}``, also when it expired while held back behind
its aggregate's head. Time is the repository's clock, moved by the test."""

from __future__ import annotations

import datetime as dt
import threading

from prometheus_client import CollectorRegistry

from outbox_lite.metrics import RelayMetrics
from outbox_lite.publishers.rabbitmq import RabbitMQPublisher

from _brokers import SHARED_RABBITMQ, drain_queue
from _helpers import T0, new_event


class Broker:
    """Keeps the ids it was given; fails those in ``fail`` for good."""

    def __init__(self) -> None:
        self.published: list[int] = []
        self.fail: set[int] = set()

    def publish(self, events):
        self.published += [e.id for e in events if e.id not in self.fail]
        return {e.id: Permanent() for e in events if e.id in self.fail}

    def close(self):
        pass


class Permanent(Exception):
    retryable = False
    error_code = "rejected"


def _rows(fetch):
    return {r["id"]: (r["status"], r["last_error_code"]) for r in fetch(
        "SELECT id, status, last_error_code FROM outbox_event ORDER BY id")}


def test_an_event_past_its_expiry_is_a_dead_letter_never_published(repo, fetch, clock, relay_of):
    soon = new_event(repo, 0, expires_at=T0 + dt.timedelta(seconds=10))
    later = new_event(repo, 1, expires_at=T0 + dt.timedelta(hours=1))
    never = new_event(repo, 2)
    at_once = new_event(repo, 3, expires_at=T0 + dt.timedelta(seconds=20))  # the very instant
    clock.advance(seconds=20)
    broker = Broker()
    relay = relay_of(repo, broker)
    counts = relay.run_once()
    assert (counts.claimed, counts.published, counts.expired, counts.dead) == (4, 2, 2, 0)
    assert sorted(broker.published) == [later.id, never.id]
    assert _rows(fetch) == {soon.id: ("failed", "expired"), later.id: ("published", None),
                            never.id: ("published", None), at_once.id: ("failed", "expired")}
    message = fetch("SELECT last_error_message FROM outbox_event WHERE id = %s", soon.id)
    assert message[0]["last_error_message"] == (
        "expired at 2026-01-01 12:00:10.000000 UTC, before its publish: never published")
    assert relay.stats.expired == 2 and relay.stats.dead == 0
    assert repo.stats().dead_letters_by_code == {"expired": 2}


def test_a_batch_of_expired_events_only_reaches_no_publisher(repo, fetch, clock, relay_of):
    ids = [new_event(repo, n, expires_at=T0).id for n in range(3)]
    broker = Broker()
    counts = relay_of(repo, broker).run_once()
    assert (counts.claimed, counts.expired, counts.published) == (3, 3, 0)
    assert broker.published == []
    assert set(_rows(fetch).values()) == {("failed", "expired")} and len(ids) == 3


def test_an_event_that_expired_while_held_back_behind_its_head_is_never_published(
        repo, fetch, clock, relay_of):
    head = new_event(repo, 0, aggregate_id="order-7")
    behind = new_event(repo, 1, aggregate_id="order-7",
                       expires_at=T0 + dt.timedelta(minutes=5))
    other = new_event(repo, 2, aggregate_id="order-8")
    broker = Broker()
    broker.fail.add(head.id)
    relay = relay_of(repo, broker, ordered=True)
    relay.run_once()  # the head becomes a dead letter; the event behind it waits
    relay.run_once()
    assert _rows(fetch)[behind.id] == ("pending", None)
    assert repo.stats().held_back == 1
    clock.advance(minutes=10)  # it expires while held back
    broker.fail.clear()
    assert repo.requeue_failed([head.id]) == 1  # an operator lets the head go on
    relay.run_once()
    counts = relay.run_once()
    assert counts.expired == 1
    assert broker.published == [other.id, head.id]
    assert _rows(fetch) == {head.id: ("published", "rejected"),  # its last failure stays
                            behind.id: ("failed", "expired"), other.id: ("published", None)}


def test_an_expired_event_never_reaches_rabbitmq_and_is_counted(
        repo, fetch, clock, exchange, relay_of):
    gone = new_event(repo, 0, expires_at=T0 - dt.timedelta(microseconds=1))
    kept = new_event(repo, 1, expires_at=T0 + dt.timedelta(days=1))
    registry = CollectorRegistry()
    metrics = RelayMetrics(registry=registry)
    with RabbitMQPublisher(SHARED_RABBITMQ, exchange.name) as publisher:
        relay = relay_of(repo, publisher, metrics=metrics)
        stop = threading.Event()
        watchdog = threading.Timer(60, stop.set)
        watchdog.start()
        try:
            relay.run(stop, until_empty=True)
        finally:
            watchdog.cancel()
    assert not stop.is_set()
    assert [m.event_id for m in drain_queue(exchange)] == [kept.id]
    assert _rows(fetch) == {gone.id: ("failed", "expired"), kept.id: ("published", None)}
    assert registry.get_sample_value("outbox_relay_events_total",
                                     {"outcome": "expired"}) == 1.0
    assert registry.get_sample_value("outbox_relay_events_total",
                                     {"outcome": "dead"}) == 0.0


def test_a_relay_whose_claim_was_taken_over_does_not_dead_letter_the_expired_event(
        repo, fetch, clock, relay_of):
    """An expired event's dead letter is fenced as any outcome (mark_failed, not retryable):
    a relay whose claims expired during the batch's publish, and whose expired event another
    relay took over, records nothing of it."""
    gone = new_event(repo, 0, expires_at=T0 + dt.timedelta(seconds=10))
    sent = new_event(repo, 1)
    clock.advance(seconds=20)

    class TakenOver(Broker):
        def publish(self, events):
            clock.advance(minutes=10)  # the publish outlived the lock timeout
            assert repo.release_expired_locks(60) == 2
            assert repo.mark_processing(gone.id, "other")  # another relay took it over
            return super().publish(events)

    counts = relay_of(repo, TakenOver(), lock_timeout=60, heartbeat=30).run_once()
    assert (counts.claimed, counts.published, counts.expired, counts.dead, counts.lost) == (
        2, 0, 0, 0, 2)
    assert fetch("SELECT id, status, locked_by, last_error_code FROM outbox_event"
                 " ORDER BY id") == [
        {"id": gone.id, "status": "processing", "locked_by": "other",
         "last_error_code": "lock_expired"},
        {"id": sent.id, "status": "pending", "locked_by": None,
         "last_error_code": "lock_expired"}]
