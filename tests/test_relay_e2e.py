"""End to end: business transactions -> outbox -> `outbox-lite relay` processes -> BullMQ on
real Redis -> the bullmq package's own Worker. Faults: a relay SIGKILLed mid-batch, Redis
stopped and started again, SIGTERM and a double SIGINT during a publish."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from outbox_lite import Backoff, OutboxRepository
from outbox_lite.publishers.bullmq import BullMQPublisher, job_id
from outbox_lite.relay import Relay

from _helpers import FAMILY
from _redis import SHARED_REDIS, consume
from _relays import TESTS
from _relays import StopsServerBefore as _StopsRedisBefore
from _relays import finish as _finish
from _relays import orders as _orders
from _relays import relay_process as _relay_process
from _relays import wait_for as _wait_for
from _relays import watched_relay_process



def _expected(events):
    return {job_id(e.dedupe_key): (e.event_type, e.payload) for e in events}


def test_three_relays_deliver_every_event_once_with_its_name_and_data(
        db, db_url, repo, fetch, queue, rds):
    events = _orders(db, repo, 600)
    relays = [_relay_process(db_url, "--bullmq-url", SHARED_REDIS, "--queue", queue,
                             "--batch-size", "50", "--until-empty") for _ in range(3)]
    results = [_finish(p) for p in relays]
    assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": 600}]
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE attempt_count <> 1") == [
        {"n": 0}]
    seen = asyncio.run(consume(queue, expected=600))
    assert len(seen) == 600
    assert {jid: (name, data) for jid, name, data in seen} == _expected(events)
    assert rds.zcard(f"bull:{queue}:completed") == 600  # and nothing else was added
    assert rds.llen(f"bull:{queue}:wait") == 0
    assert sum(int("published" in err) for _, _, err in results) == 3  # progress lines


def test_a_relay_killed_mid_batch_leaves_no_event_lost_or_doubled(
        db, db_url, repo, fetch, queue, rds, tmp_path):
    events = _orders(db, repo, 600)
    marker = tmp_path / "hung"
    doomed = _relay_process(
        db_url, "--publisher", "_relay_publishers:hanging_bullmq", "--batch-size", "50",
        "--lock-timeout", "20", worker_id="relay-doomed",
        env={"OUTBOX_TEST_HANG_AFTER": "2", "OUTBOX_TEST_MARKER": str(marker),
             "OUTBOX_TEST_REDIS_URL": SHARED_REDIS, "OUTBOX_TEST_QUEUE": queue})
    _wait_for(marker.exists, [doomed])
    # The survivors start once the doomed relay holds its second batch: started together,
    # they could drain the outbox before it claimed again, and it would never hang. They
    # cannot end (--until-empty) while its claims are in flight.
    survivors = [_relay_process(db_url, "--bullmq-url", SHARED_REDIS, "--queue", queue,
                                "--batch-size", "50", "--lock-timeout", "20", "--until-empty")
                 for _ in range(2)]
    _wait_for(lambda: fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'pending'")
              == [{"n": 0}], survivors)
    doomed.send_signal(signal.SIGKILL)  # mid-batch: its jobs are in Redis, nothing recorded
    assert doomed.wait(timeout=30) == -signal.SIGKILL
    held = [int(i) for i in marker.read_text().split(",")]
    assert len(held) == 50
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE locked_by = 'relay-doomed'"
                 " AND status = 'processing'") == [{"n": 50}]
    in_redis = {e.id for e in events
                if rds.exists(f"bull:{queue}:{job_id(e.dedupe_key)}") and e.id in held}
    assert in_redis == set(held)  # published, but the outbox does not know it
    # The lock timeout passes for the dead relay's claims (set through SQL, not waited for).
    fetch(f"UPDATE outbox_event SET locked_at = locked_at - {FAMILY.interval('1 HOUR')}"
          " WHERE locked_by = 'relay-doomed'")
    results = [_finish(p) for p in survivors]
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    rows = {r["id"]: r for r in fetch("SELECT id, status, attempt_count, last_error_code"
                                      " FROM outbox_event")}
    assert {r["status"] for r in rows.values()} == {"published"}
    assert {i for i, r in rows.items() if r["attempt_count"] == 2} == set(held)
    assert all(rows[i]["last_error_code"] == "lock_expired" for i in held)
    seen = asyncio.run(consume(queue, expected=600))
    assert len(seen) == 600 and len({jid for jid, _, _ in seen}) == 600
    assert {jid: (name, data) for jid, name, data in seen} == _expected(events)
    assert rds.zcard(f"bull:{queue}:completed") == 600  # the republished 50 added no job


def test_ordered_relays_deliver_each_aggregate_in_id_order(db, db_url, repo, fetch, queue):
    events = _orders(db, repo, 300, aggregates=20)
    relays = [_relay_process(db_url, "--bullmq-url", SHARED_REDIS, "--queue", queue,
                             "--batch-size", "20", "--ordered", "--until-empty")
              for _ in range(3)]
    results = [_finish(p) for p in relays]
    assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    seen = asyncio.run(consume(queue, expected=300))  # one job at a time, in queue order
    by_job_id = {job_id(e.dedupe_key): e for e in events}
    per_aggregate = defaultdict(list)
    for jid, _, _ in seen:
        per_aggregate[by_job_id[jid].aggregate_id].append(by_job_id[jid].id)
    assert len(per_aggregate) == 20
    assert all(ids == sorted(ids) and len(ids) == 15 for ids in per_aggregate.values())


def test_redis_stopped_mid_run_delays_but_loses_nothing(db, clock, fetch, redis_server,
                                                        tmp_path):
    # A Redis of this test's own that keeps its data across the restart (append-only file).
    server = redis_server("--appendonly", "yes", "--appendfsync", "always",
                          "--dir", str(tmp_path))
    repo = OutboxRepository(db, backoff=Backoff(base=0.01, cap=0.05, jitter=0))
    events = _orders(db, repo, 400)
    publisher = _StopsRedisBefore(BullMQPublisher(server.url, "outage", timeout=1), server,
                                  batch=6)
    relay = Relay(repo, publisher, worker_id="relay-outage", batch_size=20,
                  reconnect_pause=0.05, max_reconnect_pause=0.2, progress_every=0)
    stop = threading.Event()
    watchdog = threading.Timer(120, stop.set)
    watchdog.start()
    worker = threading.Thread(target=relay.run, args=(stop,), kwargs={"until_empty": True})
    worker.start()
    deadline = time.monotonic() + 60
    while relay.stats.publish_errors == 0:  # the 6th batch met the stopped server
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.01)
    outage_published = {r["id"] for r in fetch(
        "SELECT id FROM outbox_event WHERE status = 'published'")}
    assert len(outage_published) == 100  # the five batches before the outage
    # the outage lasts: the relay waits for Redis (its pings fail) and claims nothing
    while publisher.failed_pings < 3:
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.01)
    assert {r["id"] for r in fetch(
        "SELECT id FROM outbox_event WHERE status = 'published'")} == outage_published
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'processing'") == [
        {"n": 0}]  # the failed batch went back to pending; nothing new was claimed
    server.start()  # the same port and data
    worker.join(timeout=120)
    watchdog.cancel()
    publisher.close()
    assert not stop.is_set(), "the relay did not finish after Redis came back"
    rows = fetch("SELECT id, status, attempt_count FROM outbox_event ORDER BY id")
    assert {r["status"] for r in rows} == {"published"}
    assert max(r["attempt_count"] for r in rows) <= 2  # the outage spent one attempt at most
    client = server.client()
    try:
        jobs = {e.id for e in events if client.exists(f"bull:outage:{job_id(e.dedupe_key)}")}
        assert jobs == {e.id for e in events}  # every published event is in Redis ...
        assert outage_published <= jobs  # ... including those recorded before the outage
        assert client.llen("bull:outage:wait") == 400  # one job each
    finally:
        client.close()


def _relay_inside_a_publish(db, db_url, repo, gate: Path):
    """30 events, and a relay (batches of 10) whose first publish waits until ``gate/go``
    exists; returned once that publish has begun."""
    _orders(db, repo, 30)
    relay = watched_relay_process(db_url, "--publisher", "_relay_publishers:gated",
                                  "--batch-size", "10", env={"OUTBOX_TEST_GATE": str(gate)})
    _wait_for((gate / "entered").exists, [relay])
    return relay


def test_sigterm_during_a_publish_records_the_batch_in_hand_then_exits(
        db, db_url, repo, fetch, tmp_path):
    relay = _relay_inside_a_publish(db, db_url, repo, tmp_path)
    relay.send_signal(signal.SIGTERM)
    # the signal arrived while the publish is still running: the relay says so
    relay.wait_for_line(lambda line: "SIGTERM: stopping after the batch" in line,
                        "the relay's answer to SIGTERM")
    (tmp_path / "go").write_text("go")
    code, _, err = _finish(relay, timeout=60)
    assert code == 0, err
    assert "SIGTERM: stopping after the batch in hand" in err
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status"
                 " ORDER BY status") == [{"status": "pending", "n": 20},
                                         {"status": "published", "n": 10}]
    assert (tmp_path / "closed").exists()  # the publisher was closed
    assert "Traceback" not in err


def test_a_second_sigint_stops_at_once_leaving_the_claims_to_expire(
        db, db_url, repo, fetch, tmp_path):
    relay = _relay_inside_a_publish(db, db_url, repo, tmp_path)
    relay.send_signal(signal.SIGINT)
    relay.wait_for_line(lambda line: "SIGINT: stopping after the batch" in line,
                        "the relay's answer to the first SIGINT")
    relay.send_signal(signal.SIGINT)
    code, _, err = _finish(relay, timeout=30)
    assert code == 130, err
    assert "Traceback" not in err
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status"
                 " ORDER BY status") == [{"status": "pending", "n": 20},
                                         {"status": "processing", "n": 10}]


@pytest.mark.parametrize("args,code,words", [
    (["--database-url", f"{FAMILY.SCHEME}://root@127.0.0.1:1/x", "--publisher",
      "_relay_publishers:gated"], 1,
     f"cannot reach the {FAMILY.SERVER_NAME} server at 127.0.0.1:1"),
    (["--bullmq-url", "redis://:Sup3rSecret@127.0.0.1:1/0", "--queue", "q"], 1,
     "unavailable"),
    (["--publisher", "_relay_publishers:missing"], 2, "_relay_publishers has no missing"),
    (["--publisher", "no_such_module:make"], 2, "cannot import no_such_module"),
    (["--publisher", "_relay_publishers:not_a_publisher"], 2, "no publish(events)"),
    (["--publisher", "_relay_publishers"], 2, "must be MODULE:FACTORY"),
    (["--queue", "q"], 2, "name a broker"),
    (["--bullmq-url", "redis://127.0.0.1:6379/0"], 2, "name a broker"),
    (["--publisher", "_relay_publishers:gated", "--queue", "q"], 2, "--queue goes with"),
    (["--publisher", "_relay_publishers:gated", "--batch-size", "0"], 2, "at least 1"),
])
def test_configuration_errors_are_one_line_without_a_traceback_or_a_password(
        db_url, tmp_path, args, code, words):
    command = [sys.executable, "-m", "outbox_lite.cli", "relay"]
    if "--database-url" not in args:
        command += ["--database-url", db_url.secret_text()]
    result = subprocess.run(command + args, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(TESTS),
                                 "OUTBOX_TEST_GATE": str(tmp_path)})
    assert result.returncode == code, result.stderr
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Sup3rSecret" not in result.stderr
    assert not (tmp_path / "entered").exists()  # nothing was claimed or published
