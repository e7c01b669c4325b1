"""BullMQPublisher against real Redis servers: the shared one at 127.0.0.1:6379 (queues named
per test, their keys deleted afterwards) and servers of the tests' own, stopped by their pid.

Events come from a real OutboxRepository (create, then claim_batch), as the relay gets them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import random
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import pytest
import redis

from outbox_lite import InvalidEventError, OutboxEvent, OutboxRepository
from _redis import SHARED_REDIS, RedisServer, consume, free_port
from outbox_lite.publishers.bullmq import (
    DEFAULT_JOB_OPTIONS,
    BullMQJobError,
    BullMQPublisher,
    BullMQUnavailableError,
    dedupe_key_of,
    job_id,
)

# The keys BullMQ keeps for a queue itself, beside its jobs' (bullmq/queue_keys.py).
QUEUE_KEYS = {"wait", "paused", "meta", "id", "events", "marker", "completed", "failed",
              "active", "delayed", "prioritized", "stalled", "stalled-check", "limiter", "pc",
              "repeat", "waiting-children", "de"}


# ---------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------

def claimed(repo: OutboxRepository, payloads: list[Any], **fields: Any) -> list[OutboxEvent]:
    """Create one event per payload (dedupe keys from ``fields["dedupe_keys"]`` if given),
    then claim them as a relay does; returns the claimed events in id order."""
    keys = fields.pop("dedupe_keys", [None] * len(payloads))
    with repo.database.atomic():
        for n, (payload, key) in enumerate(zip(payloads, keys)):
            repo.create_in_transaction(
                event_type=fields.get("event_type", f"job.type{n % 3}"), aggregate_type="ai_job",
                aggregate_id=str(n), payload=payload, dedupe_key=key)
    with repo.database.atomic():
        batch = repo.claim_batch("relay-1", limit=len(payloads))
    assert len(batch) == len(payloads)
    return sorted(batch, key=lambda e: e.id)


def job_hash(client: redis.Redis, queue: str, event: OutboxEvent) -> dict[str, str]:
    return client.hgetall(f"bull:{queue}:{job_id(event.dedupe_key)}")


def waiting_ids(client: redis.Redis, queue: str) -> list[str]:
    return client.lrange(f"bull:{queue}:wait", 0, -1)


# ---------------------------------------------------------------------------
# The job mapping
# ---------------------------------------------------------------------------

def test_one_job_per_event_with_name_data_and_id(repo: OutboxRepository, rds: redis.Redis,
                                                 queue: str) -> None:
    payloads: list[Any] = [{"n": 1}, [1, "two", {"three": 3.5}], {"text": "naïve ключ 🎉"},
                           {"nested": {"a": [None, True, False, {"b": {}}]}}, []]
    events = claimed(repo, payloads)
    with BullMQPublisher(SHARED_REDIS, queue) as publisher:
        assert publisher.publish(events) == {}
    assert sorted(waiting_ids(rds, queue)) == sorted(job_id(e.dedupe_key) for e in events)
    for event, payload in zip(events, payloads):
        stored = job_hash(rds, queue, event)
        assert stored["name"] == event.event_type
        assert json.loads(stored["data"]) == payload
        opts = json.loads(stored["opts"])
        assert opts["jobId"] == job_id(event.dedupe_key)
        assert opts["removeOnComplete"] == DEFAULT_JOB_OPTIONS["removeOnComplete"]
        assert opts["removeOnFail"] == DEFAULT_JOB_OPTIONS["removeOnFail"]


def test_publishing_the_same_events_again_adds_no_second_job(
        repo: OutboxRepository, rds: redis.Redis, queue: str) -> None:
    events = claimed(repo, [{"n": n} for n in range(20)])
    with BullMQPublisher(SHARED_REDIS, queue) as publisher:
        assert publisher.publish(events[:15]) == {}
        # The relay died after adding but before recording: the whole batch comes again,
        # overlapping the jobs already added.
        assert publisher.publish(events) == {}
        assert publisher.publish(events) == {}
    assert sorted(waiting_ids(rds, queue)) == sorted(job_id(e.dedupe_key) for e in events)
    job_keys = [k for k in rds.scan_iter(f"bull:{queue}:outbox-*")]
    assert len(job_keys) == 20
    assert rds.get(f"bull:{queue}:id") == "55"  # BullMQ's counter moves; no job comes of it


def test_a_bullmq_worker_receives_every_event_once(repo: OutboxRepository, rds: redis.Redis,
                                                   queue: str) -> None:
    payloads = [{"n": n, "text": f"event {n}"} for n in range(60)]
    events = claimed(repo, payloads)
    with BullMQPublisher(SHARED_REDIS, queue) as publisher:
        assert publisher.publish(events[:40]) == {}
        assert publisher.publish(events) == {}  # 40 again, 20 new
        seen = asyncio.run(consume(queue, expected=len(events)))
        # Completed jobs are kept (by age), so a late re-publication still adds nothing.
        assert publisher.publish(events) == {}

    expected = {job_id(e.dedupe_key): (e.event_type, p) for e, p in zip(events, payloads)}
    assert len(seen) == len(events)
    assert {jid: (name, data) for jid, name, data in seen} == expected
    assert rds.zcard(f"bull:{queue}:completed") == len(events)
    assert rds.llen(f"bull:{queue}:wait") == 0
    assert rds.llen(f"bull:{queue}:active") == 0


AWKWARD_KEYS = [
    "order:42:paid", "order%3A42%3Apaid", "order 42 paid", "order%2042%20paid", "order+42",
    "ключ", "日本語のキー", "emoji 🎉 key", "12345", "0", "-1", "007", "1e3",
    "wait", "meta", "id", "events", "de", "outbox-1", "{hash-tag}", "a/b\\c", "~._-",
    "x" * 255, "x" * 254 + ":", "%" * 255, "🎉" * 255,
]


def test_awkward_dedupe_keys_give_distinct_bullmq_safe_ids() -> None:
    ids = [job_id(k) for k in AWKWARD_KEYS]
    assert len(set(ids)) == len(AWKWARD_KEYS)
    for key, jid in zip(AWKWARD_KEYS, ids):
        assert ":" not in jid
        assert not jid.lstrip("+-").isdigit()  # BullMQ for Node refuses integer ids
        assert jid.isascii() and jid.isprintable() and " " not in jid
        assert dedupe_key_of(jid) == key
    assert job_id("order 42:paid") == "outbox-order%2042%3Apaid"
    assert max(len(j) for j in ids) <= len("outbox-") + 255 * 12


def test_job_ids_are_injective_over_random_keys() -> None:
    rng = random.Random(20261130)
    alphabet = "ab:%20AZ -_.~/{}\u00e9\u043a\u65e5\U0001f389"
    keys = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
            for _ in range(20_000)}
    ids = {job_id(k) for k in keys}
    assert len(ids) == len(keys)
    assert all(":" not in j for j in ids)


def test_awkward_dedupe_keys_are_published_each_under_its_own_key(
        repo: OutboxRepository, rds: redis.Redis, queue: str) -> None:
    keys = [k for k in AWKWARD_KEYS if k == k.strip()]
    events = claimed(repo, [{"key": k} for k in keys], dedupe_keys=keys)
    with BullMQPublisher(SHARED_REDIS, queue) as publisher:
        assert publisher.publish(events) == {}
        assert publisher.publish(events) == {}
    assert sorted(waiting_ids(rds, queue)) == sorted(job_id(k) for k in keys)
    for event in events:
        assert json.loads(job_hash(rds, queue, event)["data"]) == {"key": event.dedupe_key}
    # Nothing but the queue's own keys and one hash per job: no id landed on another key.
    suffixes = {k[len(f"bull:{queue}:"):] for k in rds.scan_iter(f"bull:{queue}:*")}
    assert suffixes == {job_id(k) for k in keys} | (suffixes & QUEUE_KEYS)
    assert {"wait", "meta", "id"} <= suffixes
    assert rds.type(f"bull:{queue}:meta") == "hash"
    assert rds.hget(f"bull:{queue}:meta", "name") is None  # no job was written over it


# ---------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------

def test_redis_unreachable_raises_a_retryable_error_within_the_timeout(
        repo: OutboxRepository) -> None:
    events = claimed(repo, [{"n": 1}, {"n": 2}])
    publisher = BullMQPublisher(f"redis://:hunter2pass@127.0.0.1:{free_port()}/0",
                                "q", timeout=2)
    started = time.monotonic()
    with pytest.raises(BullMQUnavailableError) as caught:
        publisher.publish(events)
    assert time.monotonic() - started < 3
    assert caught.value.retryable is True
    assert caught.value.error_code == "bullmq_unavailable"
    assert "hunter2pass" not in str(caught.value) and "hunter2pass" not in repr(publisher)
    publisher.close()
    publisher.close()  # idempotent
    assert not publisher._thread.is_alive()
    with pytest.raises(BullMQUnavailableError, match="closed"):
        publisher.publish(events)


def test_a_server_that_never_answers_times_out(repo: OutboxRepository) -> None:
    events = claimed(repo, [{"n": 1}])
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        publisher = BullMQPublisher(f"redis://127.0.0.1:{port}/0", "q", timeout=0.5)
        for _ in range(2):  # and again on the fresh connection it opens after a timeout
            started = time.monotonic()
            with pytest.raises(BullMQUnavailableError) as caught:
                publisher.publish(events)
            assert time.monotonic() - started < 1.5
            assert caught.value.retryable is True
            assert caught.value.error_code in ("bullmq_timeout", "bullmq_unavailable")
        started = time.monotonic()
        publisher.close()
        assert time.monotonic() - started < 1.5
        assert not publisher._thread.is_alive()


def test_a_restarted_redis_is_used_again_by_the_same_publisher(
        repo: OutboxRepository, redis_server: Callable[..., RedisServer]) -> None:
    server = redis_server()
    events = claimed(repo, [{"n": n} for n in range(6)])
    with BullMQPublisher(server.url, "restart", timeout=3) as publisher:
        assert publisher.publish(events[:3]) == {}
        server.stop()
        with pytest.raises(BullMQUnavailableError) as caught:
            publisher.publish(events[3:])
        assert caught.value.retryable is True
        server.start()  # same port, empty (no persistence)
        assert publisher.publish(events[3:]) == {}
        client = server.client()
        assert sorted(client.lrange("bull:restart:wait", 0, -1)) == sorted(
            job_id(e.dedupe_key) for e in events[3:])
        client.close()


def test_a_job_redis_refuses_fails_alone(repo: OutboxRepository, rds: redis.Redis,
                                         queue: str) -> None:
    events = claimed(repo, [{"n": n} for n in range(5)])
    # Something else squats the job's key: BullMQ's script fails for that job only.
    rds.set(f"bull:{queue}:{job_id(events[2].dedupe_key)}", "not a job")
    with BullMQPublisher(SHARED_REDIS, queue) as publisher:
        failures = publisher.publish(events)
    assert set(failures) == {events[2].id}
    error = failures[events[2].id]
    assert isinstance(error, BullMQJobError)
    assert error.retryable is True and error.error_code == "bullmq_job_refused"
    assert sorted(waiting_ids(rds, queue)) == sorted(
        job_id(e.dedupe_key) for e in events if e is not events[2])


def test_data_longer_than_redis_takes_is_a_dead_letter_of_its_own(
        db: Any, clock: Any, redis_server: Callable[..., RedisServer]) -> None:
    server = redis_server("--proto-max-bulk-len", "1mb")
    repo = OutboxRepository(db, clock=clock, max_payload_bytes=4 * 1024 * 1024)
    big = {"blob": "x" * (1024 * 1024 + 1)}
    events = claimed(repo, [{"n": 0}, big, {"n": 2}, big])
    with BullMQPublisher(server.url, "big", timeout=10) as publisher:
        failures = publisher.publish(events)
        assert set(failures) == {events[1].id, events[3].id}
        for error in failures.values():
            assert isinstance(error, BullMQJobError)
            assert error.retryable is False and error.error_code == "bullmq_data_too_large"
            assert "xxxx" not in str(error)
        assert publisher.publish(events[:1]) == {}  # the publisher works on
    client = server.client()
    assert sorted(client.lrange("bull:big:wait", 0, -1)) == sorted(
        job_id(e.dedupe_key) for e in (events[0], events[2]))
    client.close()


def test_data_limit_given_when_the_server_hides_config(
        db: Any, clock: Any, redis_server: Callable[..., RedisServer]) -> None:
    server = redis_server("--proto-max-bulk-len", "1mb", "--rename-command", "CONFIG", "")
    repo = OutboxRepository(db, clock=clock, max_payload_bytes=4 * 1024 * 1024)
    events = claimed(repo, [{"n": 0}, {"blob": "x" * (1024 * 1024 + 1)}])
    with BullMQPublisher(server.url, "big", timeout=10) as publisher:
        # Without CONFIG the publisher assumes Redis's default (512 MiB): the batch fails.
        with pytest.raises(BullMQUnavailableError):
            publisher.publish(events)
    with BullMQPublisher(server.url, "big", timeout=10, max_data_bytes=1024 * 1024) as publisher:
        failures = publisher.publish(events)
    assert set(failures) == {events[1].id} and failures[events[1].id].retryable is False


def test_the_password_is_never_shown(repo: OutboxRepository,
                                     redis_server: Callable[..., RedisServer]) -> None:
    server = redis_server("--requirepass", "s3cret-Pa55word")
    events = claimed(repo, [{"n": 1}])
    wrong = f"redis://:wr0ng-Pa55word@127.0.0.1:{server.port}/0"
    with BullMQPublisher(wrong, "auth", timeout=3) as publisher:
        assert "wr0ng" not in repr(publisher) and "wr0ng" not in publisher.redis_url
        with pytest.raises(BullMQUnavailableError) as caught:
            publisher.publish(events)
        assert "wr0ng" not in str(caught.value)
        with pytest.raises(BullMQUnavailableError) as caught:
            publisher.ping()  # what a start-up check calls
        assert "wr0ng" not in str(caught.value)
    right = f"redis://default:s3cret-Pa55word@127.0.0.1:{server.port}/0"
    with BullMQPublisher(right, "auth", timeout=3) as publisher:
        assert publisher.redis_url == f"redis://default:***@127.0.0.1:{server.port}/0"
        publisher.ping()
        assert publisher.publish(events) == {}
    with pytest.raises(InvalidEventError) as bad:
        BullMQPublisher("http://:s3cret-Pa55word@127.0.0.1/0", "auth")
    assert "s3cret" not in str(bad.value)


def test_close_stops_the_loop_thread(rds: redis.Redis, queue: str) -> None:
    before = threading.active_count()
    publishers = [BullMQPublisher(SHARED_REDIS, queue) for _ in range(3)]
    assert threading.active_count() == before + 3
    for publisher in publishers:
        publisher.close()
    assert threading.active_count() == before
    with BullMQPublisher(SHARED_REDIS, queue) as publisher:
        assert publisher.publish([]) == {}
        publisher.ping()
    assert not publisher._thread.is_alive() and publisher._loop.is_closed()
    dropped = BullMQPublisher(SHARED_REDIS, queue)
    dropped.ping()
    thread = dropped._thread
    del dropped, publisher  # never closed: the garbage collector winds it up
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


# ---------------------------------------------------------------------------
# Options and the optional dependency
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"queue": "a:b"}, "':'"),
    ({"queue": ""}, "empty"),
    ({"queue": 7}, "str"),
    ({"timeout": 0}, "positive"),
    ({"timeout": float("nan")}, "positive"),
    ({"timeout": True}, "number"),
    ({"job_options": {"jobId": "x"}}, "jobId"),
    ({"job_options": {"deduplication": {"id": "x"}}}, "deduplication"),
    ({"job_options": {"attempts": object()}}, "JSON"),
    ({"max_data_bytes": 0}, "at least 1"),
    ({"redis_url": "mysql://127.0.0.1/x"}, "Redis URL"),
])
def test_bad_options_are_refused(kwargs: dict[str, Any], message: str) -> None:
    args = {"redis_url": SHARED_REDIS, "queue": "q", **kwargs}
    before = threading.active_count()
    with pytest.raises(InvalidEventError, match=message):
        BullMQPublisher(args.pop("redis_url"), args.pop("queue"), **args)
    assert threading.active_count() == before  # no loop thread left behind


def test_job_options_are_merged_over_the_defaults(repo: OutboxRepository, rds: redis.Redis,
                                                  queue: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    events = claimed(repo, [{"n": 1}])
    options = {"attempts": 3, "backoff": {"type": "exponential", "delay": 1000},
               "removeOnComplete": {"age": 172_800}}
    with BullMQPublisher(SHARED_REDIS, queue, job_options=options) as publisher:
        assert publisher.publish(events) == {}
    opts = json.loads(job_hash(rds, queue, events[0])["opts"])
    assert opts["attempts"] == 3 and opts["backoff"] == {"type": "exponential", "delay": 1000}
    assert opts["removeOnComplete"] == {"age": 172_800}
    assert opts["removeOnFail"] == DEFAULT_JOB_OPTIONS["removeOnFail"]
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="outbox_lite.publishers.bullmq"):
        BullMQPublisher(SHARED_REDIS, queue, job_options={"removeOnComplete": 1000}).close()
    assert "second job" in caplog.text


def test_outbox_lite_imports_without_bullmq_and_the_publisher_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['bullmq'] = None  # as if it were not installed\n"
        "import outbox_lite, outbox_lite.publishers\n"
        "from outbox_lite.publishers import bullmq as publisher\n"
        "assert 'redis' not in sys.modules\n"
        "try:\n"
        "    publisher.BullMQPublisher('redis://127.0.0.1:6379/0', 'q')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pip install 'outbox-lite[bullmq]'" in result.stdout
