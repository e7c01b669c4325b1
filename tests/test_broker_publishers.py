"""RabbitMQPublisher and NATSPublisher against the real brokers, read back with the brokers'
own clients: the message of SPEC §6, per-event outcomes (return, nack, duplicate ack, bad
subject), a lost channel or connection, bad arguments, and the one message id."""

from __future__ import annotations

import json

import pytest

from outbox_lite import InvalidEventError, OutboxRepository
from outbox_lite.publishers import dedupe_key_of, message_body, message_id, message_id_of_key
from outbox_lite.publishers.bullmq import job_id
from outbox_lite.publishers.nats import (NATSConfigurationError, NATSPublisher,
                                         NATSUnavailableError, subject_error)
from outbox_lite.publishers.rabbitmq import (RabbitMQConfigurationError, RabbitMQPublisher,
                                             RabbitMQUnavailableError)

from _brokers import SHARED_NATS, SHARED_RABBITMQ, amqp_channel, drain_queue, new_stream

PAYLOADS = [{"text": "naïve café ☕ 𝄞", "n": 1}, [1, 2.5, None, True, "x"], {"deep": {"a": []}}]


def _claimed(repo: OutboxRepository, kinds: list[str], **fields):
    with repo.database.atomic():
        for n, kind in enumerate(kinds):
            repo.create_in_transaction(event_type=kind, aggregate_type="order",
                                       aggregate_id=f"ord-{n}", payload=PAYLOADS[n % 3],
                                       dedupe_key=f"order {n}:paid", **fields)
    with repo.database.atomic():
        return repo.claim_batch("tester", limit=100)


def test_one_message_id_for_every_broker():
    for key in ["order 42:paid", "plain-key_1.2~", "ключ/100%", "a:b:c"]:
        assert job_id(key) == message_id_of_key(key)
        assert dedupe_key_of(message_id_of_key(key)) == key
    assert message_id_of_key("order 42:paid") == "outbox-order%2042%3Apaid"


# ---------------------------------------------------------------------------
# RabbitMQ
# ---------------------------------------------------------------------------

def test_rabbitmq_messages_carry_the_spec_fields(repo, exchange):
    events = _claimed(repo, ["order.paid", "order.shipped", "order.paid"])
    with RabbitMQPublisher(SHARED_RABBITMQ, exchange.name) as publisher:
        publisher.ping()
        assert publisher.publish(events) == {}
    connection, channel = amqp_channel()
    try:
        got = []
        while (reply := channel.basic_get(exchange.queue, auto_ack=True))[0] is not None:
            got.append(reply)
    finally:
        connection.close()
    assert len(got) == 3
    for event, (method, props, body) in zip(events, got):
        assert method.exchange == exchange.name and method.routing_key == event.event_type
        assert (props.message_id, props.type, props.content_type, props.delivery_mode) == (
            message_id(event), event.event_type, "application/json", 2)
        assert props.headers == {"outbox-event-id": event.id,
                                 "outbox-aggregate-type": "order",
                                 "outbox-aggregate-id": event.aggregate_id}
        assert body == message_body(event)
        assert json.loads(body.decode("utf-8")) == event.payload


def test_a_routing_key_given_routes_every_message(repo, exchange):
    events = _claimed(repo, ["order.paid", "order.shipped"])
    with RabbitMQPublisher(SHARED_RABBITMQ, exchange.name, routing_key="orders") as publisher:
        assert publisher.publish(events) == {}
        assert "routing_key='orders'" in repr(publisher)
    assert [m.extra["routing_key"] for m in drain_queue(exchange)] == ["orders", "orders"]


def test_a_returned_or_nacked_message_is_that_events_retryable_failure(repo, exchange):
    connection, channel = amqp_channel()
    try:  # a queue that takes one message and nacks the rest (reject-publish)
        channel.queue_declare(f"{exchange.queue}-one", durable=True, arguments={
            "x-max-length": 1, "x-overflow": "reject-publish"})
        channel.queue_bind(f"{exchange.queue}-one", exchange.name, "full.*")
        channel.queue_unbind(exchange.queue, exchange.name, "#")
        channel.queue_bind(exchange.queue, exchange.name, "order.*")  # not nobody.listens
        events = _claimed(repo, ["order.paid", "nobody.listens", "full.a", "full.b"])
        with RabbitMQPublisher(SHARED_RABBITMQ, exchange.name) as publisher:
            failures = publisher.publish(events)
        assert sorted(failures) == [events[1].id, events[3].id]
        returned, nacked = failures[events[1].id], failures[events[3].id]
        assert (returned.error_code, returned.retryable) == ("unroutable", True)
        assert "routing key 'nobody.listens'" in str(returned)
        assert (nacked.error_code, nacked.retryable) == ("nacked", True)
        assert channel.queue_declare(f"{exchange.queue}-one", passive=True
                                     ).method.message_count == 1
    finally:
        channel.queue_delete(f"{exchange.queue}-one")
        connection.close()
    assert [m.event_type for m in drain_queue(exchange)] == ["order.paid"]


def test_a_lost_channel_fails_the_batch_and_ping_connects_again(repo, exchange):
    events = _claimed(repo, ["order.paid", "order.shipped"])
    publisher = RabbitMQPublisher(SHARED_RABBITMQ, exchange.name, timeout=5)
    try:
        assert publisher.publish(events[:1]) == {}
        exchange.delete()  # the broker closes the channel on the next publish (404)
        with pytest.raises(RabbitMQUnavailableError) as caught:
            publisher.publish(events[1:])
        assert caught.value.retryable is True
        with pytest.raises(RabbitMQConfigurationError, match="does not exist"):
            publisher.ping()
        exchange.declare()
        publisher.ping()
        assert publisher.publish(events[1:]) == {}
    finally:
        publisher.close()
    assert [m.event_id for m in drain_queue(exchange)] == [events[1].id]


def test_rabbitmq_bad_arguments_and_a_closed_publisher():
    for url in ["redis://127.0.0.1/", "amqp://", "amqp://h:port/", 42]:
        with pytest.raises(InvalidEventError):
            RabbitMQPublisher(url, "x")  # type: ignore[arg-type]
    for bad in [{"exchange": ""}, {"exchange": "x", "timeout": 0},
                {"exchange": "x", "routing_key": 1}]:
        with pytest.raises(InvalidEventError):
            RabbitMQPublisher(SHARED_RABBITMQ, **bad)
    publisher = RabbitMQPublisher("amqp://guest:hunter2pass@127.0.0.1:1/", "x", timeout=2)
    assert "hunter2pass" not in repr(publisher)
    with pytest.raises(RabbitMQUnavailableError) as caught:
        publisher.ping()
    assert "hunter2pass" not in str(caught.value)
    publisher.close()
    publisher.close()  # idempotent
    assert not publisher._runner.thread.is_alive()
    with pytest.raises(RabbitMQUnavailableError, match="closed") as caught:
        publisher.ping()
    assert caught.value.error_code == "rabbitmq_closed"


# ---------------------------------------------------------------------------
# NATS JetStream
# ---------------------------------------------------------------------------

def test_jetstream_messages_carry_the_spec_fields_and_a_republish_is_dropped(repo, stream):
    events = _claimed(repo, ["order.paid", "order.shipped", "order.paid"])
    with NATSPublisher(SHARED_NATS, stream.prefix) as publisher:
        publisher.ping()
        assert publisher.publish(events) == {}
        assert publisher.publish(events) == {}  # duplicate acks: published, stored once
    messages = stream.messages()
    assert stream.count() == 3 and len(messages) == 3
    for event, message in zip(events, messages):
        assert (message.message_id, message.event_id, message.event_type,
                message.aggregate_type, message.aggregate_id, message.payload) == (
            message_id(event), event.id, event.event_type, "order", event.aggregate_id,
            event.payload)
        assert message.extra["subject"] == f"{stream.prefix}.{event.event_type}"
        assert message.extra["other_headers"] == {}


@pytest.mark.parametrize("kind", ["bad type", "order..paid", "order.*", "order.>", ".x",
                                  "x."])
def test_an_event_type_that_is_no_subject_is_a_dead_letter(repo, stream, kind):
    events = _claimed(repo, ["order.paid", kind])
    with NATSPublisher(SHARED_NATS, stream.prefix) as publisher:
        failures = publisher.publish(events)
    [(event_id, error)] = failures.items()
    assert event_id == events[1].id
    assert (error.error_code, error.retryable) == ("invalid_subject", False)
    assert stream.count() == 1


def test_subjects_refused_and_taken():
    for bad in ["", "a b", "a..b", "a.*", ">", "a\tb", "a\u0085b", "a.b.", "x>"]:
        assert subject_error(bad), bad
    for good in ["a", "order.paid", "ключ.создан", "a-b_c.D9", "%41"]:
        assert subject_error(good) is None, good


def test_a_lost_nats_connection_fails_the_batch_and_ping_connects_again(repo, nats_server):
    server = nats_server()
    target = new_stream(server.url)
    events = _claimed(repo, ["order.paid", "order.shipped"])
    publisher = NATSPublisher(server.url, target.prefix, timeout=2)
    try:
        assert publisher.publish(events[:1]) == {}
        server.stop()
        with pytest.raises(NATSUnavailableError) as caught:
            publisher.publish(events[1:])
        assert caught.value.retryable is True
        with pytest.raises(NATSUnavailableError, match="is unavailable"):
            publisher.ping()
        server.start()
        publisher.ping()
        assert publisher.publish(events) == {}  # the first again: a duplicate, stored once
    finally:
        publisher.close()
    assert [m.event_id for m in target.messages()] == [e.id for e in events]


def test_nats_bad_arguments_and_a_missing_stream(stream):
    for servers in ["http://127.0.0.1:4222", "", "nats://", ["nats://a:1", 2], 42]:
        with pytest.raises(InvalidEventError):
            NATSPublisher(servers, "x")  # type: ignore[arg-type]
    for prefix in ["", "a.*", "a..b", "a b", ">"]:
        with pytest.raises(InvalidEventError):
            NATSPublisher(SHARED_NATS, prefix)
    two = NATSPublisher(f"nats://u:hunter2pass@127.0.0.1:1,{SHARED_NATS}", stream.prefix)
    assert "hunter2pass" not in repr(two) and "nats://u:***@127.0.0.1:1," in repr(two)
    two.ping()  # the second server answers
    two.close()
    two.close()  # idempotent
    assert not two._runner.thread.is_alive()
    with pytest.raises(NATSUnavailableError, match="closed") as caught:
        two.ping()
    assert caught.value.error_code == "nats_closed" and caught.value.retryable is True
    with NATSPublisher(SHARED_NATS, f"{stream.prefix}-none") as publisher:
        with pytest.raises(NATSConfigurationError, match="no JetStream stream captures"):
            publisher.ping()
