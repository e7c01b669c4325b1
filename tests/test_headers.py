"""Headers on an event (SPEC §11): the guard (bounds, names, credentials named by their header,
never their value), nothing written on a refusal, the column read back exactly, and every
header carried by every publisher to a consumer with the broker's own client."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest

from outbox_lite import CredentialInPayloadError, OutboxRepository, PayloadError
from outbox_lite.payload import MAX_HEADERS, MAX_HEADERS_BYTES, check_headers
from outbox_lite.publishers import message_id
from outbox_lite.publishers.bullmq import BullMQPublisher, job_headers
from outbox_lite.publishers.nats import NATSPublisher
from outbox_lite.publishers.rabbitmq import RabbitMQPublisher

from _brokers import SHARED_NATS, SHARED_RABBITMQ, basic_get
from _redis import SHARED_REDIS

HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
           "x-request-id": "req-42", "Tenant": "naïve café ☕ 𝄞", "a.b:c_d": "x y\tz"}


def _create(repo: OutboxRepository, n: int = 0, **fields: Any) -> Any:
    with repo.database.atomic():
        return repo.create_in_transaction(event_type="order.paid", aggregate_type="order",
                                          aggregate_id=f"o-{n}", payload={"n": n}, **fields)


def _claim(repo: OutboxRepository) -> list[Any]:
    with repo.database.atomic():
        return sorted(repo.claim_batch("tester", limit=100), key=lambda e: e.id)


# ---------------------------------------------------------------------------
# The guard
# ---------------------------------------------------------------------------

SECRET = "Bearer abcdefghij0123456789xyz"


@pytest.mark.parametrize("headers, named", [
    ({"Authorization": "anything"}, "'Authorization'"),
    ({"Cookie": "session=1"}, "'Cookie'"),
    ({"X-Api-Key": "k"}, "'X-Api-Key'"),
    ({"note": SECRET}, "'note'"),
    ({"callback": "https://user:hunter2hunter2@example.com/x"}, "'callback'"),
    ({"ghp_abcdefghijklmnopqrstuvwxyz0123456789": "1"}, "'<redacted>'"),
])
def test_a_credential_is_refused_naming_the_header_never_the_value(repo, fetch, headers, named):
    with pytest.raises(CredentialInPayloadError) as refused:
        _create(repo, headers=headers)
    text = str(refused.value)
    assert f"header {named} carries a credential" in text
    for value in headers.values():
        assert value not in text or value in ("1",)
    if named == "'<redacted>'":
        assert "ghp_" not in text
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


@pytest.mark.parametrize("headers, message", [
    ({f"h{n}": "v" for n in range(MAX_HEADERS + 1)}, "65 entries; the limit is 64"),
    ({"big": "x" * (MAX_HEADERS_BYTES - 2)}, "8193 bytes of names and values; the limit is 8192"),
    ({"": "v"}, "must be 1-128 letters"),
    ({"a b": "v"}, "must be 1-128 letters"),
    ({"x" * 129: "v"}, "must be 1-128 letters"),
    ({"é": "v"}, "must be 1-128 letters"),
    ({"outbox-event-id": "1"}, "is reserved"),
    ({"Nats-Expected-Stream": "S"}, "is reserved"),
    ({"ce-id": "1"}, "is reserved"),
    ({"cloudEvents_id": "1"}, "is reserved"),
    ({"CC": "other-queue"}, "is reserved"),
    ({"content-type": "text/plain"}, "is reserved"),
    ({"n": 1}, "must be a str, not int"),
    ({"n": None}, "must be a str, not NoneType"),
    ({"n": "a\r\nb"}, "has a control character"),
    ({"n": " padded"}, "starts or ends with white space"),
    ({"n": "\ud800"}, "lone surrogate"),
    ([("a", "b")], "must be a mapping"),
])
def test_bad_headers_are_refused_before_any_sql(repo, fetch, headers, message):
    with pytest.raises(PayloadError, match=message):
        _create(repo, headers=headers)
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


def test_the_bounds_themselves_are_accepted():
    assert len(check_headers({f"h{n:02}": "v" for n in range(MAX_HEADERS)})) == MAX_HEADERS
    exact = {"big": "é" * ((MAX_HEADERS_BYTES - 3) // 2)}  # 2 bytes each
    assert len(exact["big"].encode()) + 3 <= MAX_HEADERS_BYTES
    assert check_headers(exact) == exact
    assert check_headers({"x" * 128: ""}) == {"x" * 128: ""}
    # Ordinary names that mention a credential word pass, as in payloads.
    assert check_headers({"tokenCount": "3", "password-changed-at": "2026-01-01"})


def test_a_name_the_caller_allows_passes(db):
    repo = OutboxRepository(db, allowed_payload_keys={"x-api-key"})
    event = _create(repo, headers={"X-Api-Key": "key-id-17"})
    assert event.headers == {"X-Api-Key": "key-id-17"}


# ---------------------------------------------------------------------------
# Stored and read back
# ---------------------------------------------------------------------------

def test_headers_and_expiry_are_stored_and_read_back_exactly(repo, fetch):
    expires = dt.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    created = _create(repo, 0, headers=HEADERS, expires_at=expires)
    bare = _create(repo, 1)
    assert created.headers == HEADERS and bare.headers == {}
    assert created.expires_at == expires and bare.expires_at is None
    rows = fetch("SELECT headers, expires_at FROM outbox_event ORDER BY id")
    assert json.loads(rows[0]["headers"]) == HEADERS
    assert rows[0]["expires_at"] == dt.datetime(2031, 5, 6, 5, 8, 9, 123456)  # UTC
    assert rows[1] == {"headers": None, "expires_at": None}  # NULL when none
    found = repo.find_dispatchable()
    claimed = _claim(repo)
    held = repo.held_by("tester")
    for events in (found, claimed, held):
        assert [e.headers for e in events] == [HEADERS, {}]
        assert [e.expires_at for e in events] == [expires, None]
        assert events[0].expires_at.utcoffset() == dt.timedelta(0)


def test_the_largest_headers_round_trip(repo):
    headers = {f"h{n:02}": ("ключ" * 40)[:62] + str(n % 10) for n in range(MAX_HEADERS)}
    assert sum(len(k) + len(v.encode()) for k, v in headers.items()) == MAX_HEADERS_BYTES
    assert len(check_headers(headers)) == MAX_HEADERS
    _create(repo, headers=headers)
    assert _claim(repo)[0].headers == headers


def test_a_naive_expiry_is_refused(repo, fetch):
    with pytest.raises(PayloadError.__mro__[1], match="expires_at"):
        _create(repo, expires_at=dt.datetime(2031, 1, 1))
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


# ---------------------------------------------------------------------------
# Every publisher sends every header
# ---------------------------------------------------------------------------

def test_rabbitmq_sends_every_header(repo, exchange):
    _create(repo, 0, headers=HEADERS)
    _create(repo, 1)
    events = _claim(repo)
    with RabbitMQPublisher(SHARED_RABBITMQ, exchange.name) as publisher:
        assert publisher.publish(events) == {}
    got = basic_get(exchange, len(events))
    for event, (props, _) in zip(events, got):
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in props.headers.items()}
        assert headers == {**event.headers, "outbox-event-id": event.id,
                           "outbox-aggregate-type": "order",
                           "outbox-aggregate-id": event.aggregate_id}
    assert got[0][0].headers["Tenant"] == HEADERS["Tenant"]


def test_nats_sends_every_header(repo, stream):
    _create(repo, 0, headers=HEADERS)
    _create(repo, 1)
    events = _claim(repo)
    with NATSPublisher(SHARED_NATS, stream.prefix) as publisher:
        assert publisher.publish(events) == {}
    messages = stream.messages()
    # A NATS header name cannot hold ':': it travels as %3A (names never hold '%').
    sent = {name.replace(":", "%3A"): value for name, value in HEADERS.items()}
    assert [m.extra["other_headers"] for m in messages] == [sent, {}]
    assert [m.message_id for m in messages] == [message_id(e) for e in events]


def test_bullmq_puts_the_headers_where_node_and_python_workers_read_them(repo, rds, queue):
    _create(repo, 0, headers=HEADERS)
    _create(repo, 1)
    events = _claim(repo)
    with BullMQPublisher(SHARED_REDIS, queue) as publisher:
        assert publisher.publish(events) == {}
    first = json.loads(rds.hget(f"bull:{queue}:{message_id(events[0])}", "opts"))
    bare = json.loads(rds.hget(f"bull:{queue}:{message_id(events[1])}", "opts"))
    assert first["outboxHeaders"] == HEADERS
    # BullMQ's own telemetry (bullmq-otel) stores and reads the context here, as JSON text.
    assert json.loads(first["tm"]) == {"traceparent": HEADERS["traceparent"],
                                       "tracestate": HEADERS["tracestate"]}
    assert "outboxHeaders" not in bare and "tm" not in bare
    seen = asyncio.run(_python_worker(queue, 2))
    assert seen == {message_id(events[0]): HEADERS, message_id(events[1]): {}}


async def _python_worker(queue: str, expected: int) -> dict[str, dict[str, str]]:
    """A worker of the Python bullmq package, reading each job's headers with job_headers."""
    from bullmq import Worker

    seen: dict[str, dict[str, str]] = {}
    done = asyncio.Event()

    async def process(job: Any, token: Any) -> None:
        seen[job.id] = job_headers(job)
        if len(seen) == expected:
            done.set()

    worker = Worker(queue, process, {"connection": SHARED_REDIS, "autorun": True})
    try:
        await asyncio.wait_for(done.wait(), 20)
    finally:
        await worker.close()
    return seen


def test_the_families_read_every_column_of_the_model():
    """The claims' SELECTs read the model's columns in its order (the new two among them)."""
    from outbox_lite._families import mysql_sql, postgresql_sql
    from outbox_lite.models import COLUMNS

    for sql in (mysql_sql, postgresql_sql):
        assert [c.strip(" `").removesuffix("::text") for c in sql._COLUMNS.split(",")] == list(
            COLUMNS), sql.__name__
