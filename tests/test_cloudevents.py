"""CloudEvents binary content mode (SPEC §11) on RabbitMQ (the AMQP binding) and NATS (ce-
headers), read back from the brokers with their own clients (pika, nats-py) and parsed by the
CloudEvents SDK's bindings: ``id`` the message id, ``type`` the event type, ``source``,
``subject`` the aggregate, ``time`` the event's ``created_at``, ``datacontenttype``
``application/json``, the data the payload unchanged; the event's own headers travel beside."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cloudevents.core.bindings.amqp import AMQPMessage
from cloudevents.core.bindings.amqp import from_binary as amqp_from_binary
from cloudevents.core.bindings.http import HTTPMessage
from cloudevents.core.bindings.http import from_binary as http_from_binary
from cloudevents.core.formats.json import JSONFormat

from outbox_lite import InvalidEventError, OutboxRepository
from outbox_lite.publishers import DEFAULT_CLOUDEVENTS_SOURCE, message_body, message_id
from outbox_lite.publishers.nats import NATSPublisher
from outbox_lite.publishers.rabbitmq import RabbitMQPublisher

from _brokers import SHARED_NATS, SHARED_RABBITMQ, basic_get, on_jetstream

TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
PAYLOADS = [{"order": 42, "note": "naïve café ☕"}, [1, "two", None]]
KEYS = ["order 42:paid", "plain-key"]  # the first one's message id holds '%'


def _claimed(repo: OutboxRepository) -> list:
    _create(repo)
    with repo.database.atomic():
        return sorted(repo.claim_batch("tester", limit=10), key=lambda e: e.id)


def _create(repo: OutboxRepository) -> None:
    with repo.database.atomic():
        for n, (payload, key) in enumerate(zip(PAYLOADS, KEYS)):
            repo.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                       aggregate_id=f"ö-{n}", payload=payload,
                                       dedupe_key=key, headers=TRACE if n == 0 else None)


def _assert_cloudevent(ce, event, source):
    assert ce.get_specversion() == "1.0"
    assert ce.get_id() == message_id(event)
    assert ce.get_type() == "order.paid"
    assert ce.get_source() == source
    assert ce.get_subject() == f"order/{event.aggregate_id}"
    assert ce.get_time() == event.created_at  # microseconds and UTC kept
    assert ce.get_datacontenttype() == "application/json"
    assert ce.get_data() == event.payload


def test_rabbitmq_binary_mode_reads_back_with_the_sdk(repo, exchange):
    events = _claimed(repo)
    with RabbitMQPublisher(SHARED_RABBITMQ, exchange.name, cloudevents=True,
                           cloudevents_source="urn:shop:orders") as publisher:
        assert publisher.publish(events) == {}
    got = basic_get(exchange, len(events))
    for event, (props, body) in zip(events, got):
        assert body == message_body(event)  # the data is the payload, unchanged
        message = AMQPMessage(properties={"content-type": props.content_type},
                              application_properties=dict(props.headers),
                              application_data=body)
        _assert_cloudevent(amqp_from_binary(message, JSONFormat()), event, "urn:shop:orders")
        assert props.message_id == message_id(event) and props.type == "order.paid"
        assert props.headers["outbox-event-id"] == event.id
    assert got[0][0].headers["traceparent"] == TRACE["traceparent"]
    assert sorted(k for k in got[1][0].headers if k.startswith("cloudEvents_")) == [
        "cloudEvents_id", "cloudEvents_source", "cloudEvents_specversion",
        "cloudEvents_subject", "cloudEvents_time", "cloudEvents_type"]


def test_nats_binary_mode_reads_back_with_the_sdk(repo, stream):
    events = _claimed(repo)
    with NATSPublisher(SHARED_NATS, stream.prefix, cloudevents=True) as publisher:
        assert publisher.publish(events) == {}

    async def read(js):
        sub = await js.pull_subscribe(f"{stream.prefix}.>", stream=stream.name)
        msgs = await sub.fetch(len(events), timeout=10)
        await sub.unsubscribe()
        return [(dict(m.headers), m.data) for m in msgs]

    got = on_jetstream(SHARED_NATS, read)
    for event, (headers, data) in zip(events, got):
        assert data == message_body(event)
        ce = http_from_binary(HTTPMessage(headers=headers, body=data), JSONFormat())
        _assert_cloudevent(ce, event, DEFAULT_CLOUDEVENTS_SOURCE)
        assert headers["Nats-Msg-Id"] == message_id(event)
    # The id holds '%' (a percent-encoded dedupe key): the header value encodes it again.
    assert got[0][0]["ce-id"] == "outbox-order%252042%253Apaid"
    assert got[0][0]["ce-subject"] == "order/%C3%B6-0"
    assert got[0][0]["traceparent"] == TRACE["traceparent"]


def test_without_the_flag_no_cloudevents_attribute_is_sent(repo, exchange):
    events = _claimed(repo)
    with RabbitMQPublisher(SHARED_RABBITMQ, exchange.name) as publisher:
        assert publisher.publish(events) == {}
    [(props, _), _] = basic_get(exchange, 2)
    assert not [k for k in props.headers if k.lower().startswith("cloudevents")]


@pytest.mark.parametrize("source", ["", "has space", "x" * 1025, 7])
def test_a_bad_source_is_refused(source):
    with pytest.raises(InvalidEventError, match="cloudevents_source"):
        RabbitMQPublisher(SHARED_RABBITMQ, "x", cloudevents=True, cloudevents_source=source)
    with pytest.raises(InvalidEventError, match="cloudevents_source"):
        NATSPublisher(SHARED_NATS, "x", cloudevents=True, cloudevents_source=source)


@pytest.mark.parametrize("flags, said", [
    (["--cloudevents-source", "urn:x", "--rabbitmq-url", SHARED_RABBITMQ, "--exchange", "x"],
     "--cloudevents-source goes with --cloudevents"),
    (["--cloudevents", "--bullmq-url", "redis://127.0.0.1:6379", "--queue", "q"],
     "--cloudevents goes with --rabbitmq-url or --nats-url"),
    (["--cloudevents", "--publisher", "x:y"],
     "--cloudevents goes with --rabbitmq-url or --nats-url"),
])
def test_the_command_refuses_flags_that_do_not_go_together(db_url, flags, said):
    ran = subprocess.run([sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
                          db_url.secret_text(), *flags], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 2 and said in ran.stderr, ran.stderr


def test_the_command_publishes_cloudevents(repo, db_url, exchange, fetch):
    _create(repo)
    ran = subprocess.run([sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
                          db_url.secret_text(), "--rabbitmq-url", SHARED_RABBITMQ,
                          "--exchange", exchange.name, "--cloudevents",
                          "--cloudevents-source", "https://shop.example.com/orders",
                          "--until-empty"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert [r["status"] for r in fetch("SELECT status FROM outbox_event")] == ["published"] * 2
    ids = set()
    for props, body in basic_get(exchange, len(KEYS)):
        message = AMQPMessage(properties={"content-type": props.content_type},
                              application_properties=dict(props.headers),
                              application_data=body)
        ce = amqp_from_binary(message, JSONFormat())
        assert ce.get_source() == "https://shop.example.com/orders"
        ids.add(ce.get_id())
    assert ids == {"outbox-order%2042%3Apaid", "outbox-plain-key"}
