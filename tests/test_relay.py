"""The relay against the real server, with publishers that stand for a broker."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from typing import Any

import pytest

from outbox_lite import Backoff, InvalidEventError, OutboxRepository
from outbox_lite.relay import Relay, RelayStats, default_worker_id

from _helpers import FAMILY, capture_sql, seed


class Broker:
    """A publisher that keeps what it was given, and fails the ids it is told to."""

    def __init__(self, fail: dict[int, BaseException] | None = None,
                 raise_: BaseException | None = None) -> None:
        self.batches: list[list[tuple[int, str, Any]]] = []
        self.fail = fail or {}
        self.raise_ = raise_
        self.closed = False

    def publish(self, events):
        self.batches.append([(e.id, e.event_type, e.payload) for e in events])
        if self.raise_ is not None:
            raise self.raise_
        return {e.id: self.fail[e.id] for e in events if e.id in self.fail}

    def close(self):
        self.closed = True

    @property
    def published(self) -> list[int]:
        return [event_id for batch in self.batches for event_id, _, _ in batch]


class Permanent(Exception):
    retryable = False
    error_code = "rejected_by_broker"


def _drain(relay, timeout=60.0):
    """run(until_empty=True), stopped and failed by a watchdog if it does not end by itself
    (the relay survives faults by retrying forever, so a broken one would never return)."""
    stop = threading.Event()
    watchdog = threading.Timer(timeout, stop.set)
    watchdog.start()
    try:
        relay.run(stop, until_empty=True)
    finally:
        watchdog.cancel()
    assert not stop.is_set(), f"the relay did not drain the outbox within {timeout} s"


def test_a_round_publishes_a_batch_and_records_it_in_one_statement(
        db, repo, fetch, clock, relay_of):
    ids = seed(repo, 5)
    broker = Broker()
    relay = relay_of(repo, broker, batch_size=3)
    first = relay.run_once()
    assert (first.claimed, first.published, first.retried, first.dead) == (3, 3, 0, 0)
    assert broker.batches == [[(i, "job.created", {"n": n}) for n, i in enumerate(ids[:3])]]
    rows = fetch("SELECT id, status, locked_by, published_at FROM outbox_event ORDER BY id")
    when = clock.now.replace(tzinfo=None)
    assert rows[:3] == [{"id": i, "status": "published", "locked_by": None, "published_at": when}
                        for i in ids[:3]]
    assert [r["status"] for r in rows[3:]] == ["pending", "pending"]
    assert relay.run_once().published == 2 and relay.run_once().claimed == 0
    assert relay.stats.published == 5 and relay.stats.rounds == 3


def test_failures_retry_or_dead_letter_with_their_code(db, repo, fetch, clock, relay_of):
    a, b, c, d = seed(repo, 4)

    class BrokerDown(Exception):
        pass

    broker = Broker(fail={a: BrokerDown("503 from broker"), b: Permanent("schema mismatch"),
                          c: ValueError("password=hunter2 refused")})
    result = relay_of(repo, broker).run_once()
    assert (result.published, result.retried, result.dead) == (1, 2, 1)
    rows = {r["id"]: r for r in fetch("SELECT * FROM outbox_event")}
    assert rows[a]["status"] == "pending" and rows[a]["last_error_code"] == "BrokerDown"
    assert rows[a]["available_at"] == (clock.now + dt.timedelta(seconds=10)).replace(tzinfo=None)
    assert rows[b]["status"] == "failed" and rows[b]["last_error_code"] == "rejected_by_broker"
    assert rows[b]["last_error_message"] == "schema mismatch"
    assert rows[c]["last_error_code"] == "ValueError"
    assert "hunter2" not in rows[c]["last_error_message"]
    assert rows[d]["status"] == "published"


def test_the_last_attempt_dead_letters(db, clock, fetch, relay_of):
    repo = OutboxRepository(db, clock=clock, max_attempts=2,
                            backoff=Backoff(base=1, cap=1, jitter=0))
    [event_id] = seed(repo, 1)
    relay = relay_of(repo, Broker(fail={event_id: OSError("down")}))
    assert relay.run_once().retried == 1
    clock.advance(seconds=2)
    assert relay.run_once().dead == 1
    assert fetch("SELECT status, attempt_count FROM outbox_event") == [
        {"status": "failed", "attempt_count": 2}]


def test_a_publisher_that_raises_fails_the_whole_batch(db, repo, fetch, relay_of):
    seed(repo, 3)
    broker = Broker(raise_=ConnectionError("redis unreachable"))
    result = relay_of(repo, broker).run_once()
    assert (result.claimed, result.published, result.retried) == (3, 0, 3)
    assert fetch("SELECT DISTINCT status, last_error_code FROM outbox_event") == [
        {"status": "pending", "last_error_code": "ConnectionError"}]


def test_failures_for_events_not_in_the_batch_are_ignored(db, repo, fetch, caplog, relay_of):
    seed(repo, 1)

    class Confused(Broker):
        def publish(self, events):
            super().publish(events)
            return {10 ** 9: OSError("?")}

    broker = Confused()
    with caplog.at_level(logging.WARNING, "outbox_lite.relay"):
        assert relay_of(repo, broker).run_once().published == 1
    assert "not in the batch" in caplog.text
    assert fetch("SELECT status FROM outbox_event") == [{"status": "published"}]


def test_a_claim_taken_over_during_the_publish_is_counted_lost_and_not_recorded(
        db, repo, fetch, clock, relay_of):
    ids = seed(repo, 2)

    class SlowBroker(Broker):
        def publish(self, events):
            clock.advance(minutes=10)  # the publish outlived the lock timeout
            assert repo.release_expired_locks(60) == 2
            assert repo.mark_processing(ids[0], "other")  # another relay took one over
            return super().publish(events)

    relay = relay_of(repo, SlowBroker(), lock_timeout=60, heartbeat=30)
    result = relay.run_once()
    assert (result.claimed, result.published, result.lost) == (2, 0, 2)
    assert fetch("SELECT id, status, locked_by FROM outbox_event ORDER BY id") == [
        {"id": ids[0], "status": "processing", "locked_by": "other"},
        {"id": ids[1], "status": "pending", "locked_by": None}]


def test_a_round_releases_expired_claims_and_counts_them(db, repo, fetch, clock, relay_of):
    """SPEC §5: a round first releases the claims older than the lock timeout (by the
    repository's clock, moved here), then claims them again; a younger claim is left alone."""
    crashed = seed(repo, 2)
    with db.atomic():
        assert [e.id for e in repo.claim_batch("crashed", limit=2)] == crashed
    clock.advance(seconds=50)
    [alive] = seed(repo, 1, aggregate_id="alive")
    assert repo.mark_processing(alive, "alive")
    clock.advance(seconds=20)  # crashed's claims are 70 s old, alive's 20 s: timeout 60 s
    broker = Broker()
    relay = relay_of(repo, broker, lock_timeout=60, heartbeat=30)
    result = relay.run_once()
    assert (result.released, result.claimed, result.published) == (2, 2, 2)
    assert relay.stats.released == 2 and broker.published == crashed
    assert fetch("SELECT id, status, locked_by, attempt_count, last_error_code"
                 " FROM outbox_event ORDER BY id") == [
        *({"id": i, "status": "published", "locked_by": None, "attempt_count": 2,
           "last_error_code": "lock_expired"} for i in crashed),
        {"id": alive, "status": "processing", "locked_by": "alive", "attempt_count": 1,
         "last_error_code": None}]


def _wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class HangingBroker(Broker):
    """Publishes once the test sets ``finish``: a publish as long as the test wants."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.finish = threading.Event(), threading.Event()

    def publish(self, events):
        self.entered.set()
        assert self.finish.wait(30)
        return super().publish(events)


def _round_in_a_thread(relay, broker):
    """Start ``relay.run_once()`` in a thread; return it, and the list its result goes to,
    once the round is inside its publish."""
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(relay.run_once()))
    worker.start()
    assert broker.entered.wait(10)
    return worker, results


def test_a_long_publish_renews_its_claims_so_no_one_takes_them_over(
        db, repo, fetch, clock, relay_of):
    ids = seed(repo, 3)
    broker = HangingBroker()
    relay = relay_of(repo, broker, lock_timeout=60, heartbeat=0.02)
    worker, released = _round_in_a_thread(relay, broker)
    other = OutboxRepository(db, clock=clock)
    for _ in range(4):  # four lock timeouts pass during the publish
        clock.advance(seconds=45)
        renewed_at = clock.now.replace(tzinfo=None)
        _wait_until(lambda: fetch("SELECT MIN(locked_at) AS t FROM outbox_event")[0]["t"]
                    == renewed_at)
        clock.advance(seconds=45)
        assert other.release_expired_locks(60) == 0  # 45 s since the renewal: not expired
    broker.finish.set()
    worker.join(10)
    relay.close()
    assert released[0].published == 3 and released[0].lost == 0
    assert relay.stats.renewals >= 4
    assert fetch("SELECT DISTINCT status, attempt_count FROM outbox_event") == [
        {"status": "published", "attempt_count": 1}]
    assert len(ids) == 3


def test_without_renewals_the_same_publish_loses_its_claims(db, repo, fetch, clock, relay_of):
    seed(repo, 3)
    broker = HangingBroker()
    relay = relay_of(repo, broker, lock_timeout=60, heartbeat=59)
    worker, results = _round_in_a_thread(relay, broker)
    clock.advance(seconds=90)
    assert OutboxRepository(db, clock=clock).release_expired_locks(60) == 3
    broker.finish.set()
    worker.join(10)
    relay.close()
    assert results[0].lost == 3 and results[0].published == 0
    assert fetch("SELECT DISTINCT status, last_error_code FROM outbox_event") == [
        {"status": "pending", "last_error_code": "lock_expired"}]


def test_a_publish_that_never_returns_stops_being_renewed_after_stuck_after(
        db, repo, fetch, clock, caplog, relay_of):
    seed(repo, 3)
    broker = HangingBroker()
    relay = relay_of(repo, broker, lock_timeout=60, heartbeat=0.02, stuck_after=0.3)
    with caplog.at_level(logging.WARNING, logger="outbox_lite.relay"):
        worker, results = _round_in_a_thread(relay, broker)
        _wait_until(lambda: "no longer renewed" in caplog.text)
        renewals = relay.stats.renewals
        assert renewals >= 1  # it renewed while the publish was young
        clock.advance(seconds=90)  # a lock timeout and a half since the last renewal
        assert OutboxRepository(db, clock=clock).release_expired_locks(60) == 3
        assert relay.stats.renewals == renewals  # and none since it gave up
    broker.finish.set()
    worker.join(10)
    relay.close()
    assert results[0].lost == 3 and results[0].published == 0  # fenced off when recording
    assert fetch("SELECT DISTINCT status, last_error_code FROM outbox_event") == [
        {"status": "pending", "last_error_code": "lock_expired"}]


def test_run_until_empty_drains_then_returns(db, repo, fetch, relay_of):
    seed(repo, 250)
    broker = Broker()
    relay = relay_of(repo, broker, batch_size=100)
    _drain(relay)
    assert sorted(broker.published) == [r["id"] for r in fetch(
        "SELECT id FROM outbox_event ORDER BY id")]
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": 250}]
    assert [len(b) for b in broker.batches] == [100, 100, 50]


def test_a_running_relay_records_each_batch_in_the_next_claims_transaction(
        db, repo, fetch, relay_of):
    seed(repo, 50)
    relay = relay_of(repo, Broker(), batch_size=10)
    with capture_sql(db) as statements:
        _drain(relay)
    kinds = [sql.split()[0] if not sql.startswith("UPDATE") else
             ("PUBLISH" if "'published'" in sql else "CLAIM" if "'processing'" in sql else sql)
             for sql, _ in statements if not sql.startswith("SELECT")]
    # One commit per round: the claim, then (publish) the record with the next claim.
    assert kinds == ["BEGIN", "CLAIM", "COMMIT"] + [
        "BEGIN", "PUBLISH", "CLAIM", "COMMIT"] * 4 + ["BEGIN", "PUBLISH", "COMMIT"]
    assert relay.stats.published == 50 and relay.stats.rounds == 6
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'published'") == [
        {"n": 50}]


def test_a_claim_that_fails_takes_the_carried_record_with_it_and_both_are_retried(
        db, repo, fetch, relay_of):
    ids = seed(repo, 20)
    failures = []

    class ConflictOnce(OutboxRepository):
        def claim_batch(self, *args, **kwargs):
            if len(failures) == 0 and self.database.execute_sql(
                    "SELECT COUNT(*) FROM outbox_event WHERE status = 'published'"
            ).fetchone()[0] == 10:  # the carried record is in, uncommitted: fail now
                failures.append("deadlock")
                from outbox_lite import LockConflictError
                raise LockConflictError(FAMILY.DEADLOCK, "Deadlock found (on purpose)")
            return super().claim_batch(*args, **kwargs)

    conflicted = ConflictOnce(db, clock=repo.clock)
    relay = relay_of(conflicted, Broker(), batch_size=10)
    _drain(relay, timeout=20)  # a relay that dropped the carried record would never drain
    assert failures == ["deadlock"] and relay.stats.lock_conflicts == 1
    assert relay.stats.published == 20 and relay.stats.lost == 0
    assert fetch("SELECT id FROM outbox_event WHERE status = 'published' ORDER BY id") == [
        {"id": i} for i in ids]


def test_ordered_until_empty_leaves_what_waits_behind_a_dead_letter(db, repo, fetch, relay_of):
    with db.atomic():
        ids = [repo.create_in_transaction(event_type="e", aggregate_type="job",
                                          aggregate_id=agg, payload={}).id
               for agg in ("a", "b", "a", "b", "a")]
    broker = Broker(fail={ids[0]: Permanent("poison")})
    _drain(relay_of(repo, broker, ordered=True))
    assert fetch("SELECT id, status FROM outbox_event ORDER BY id") == [
        {"id": ids[0], "status": "failed"}, {"id": ids[1], "status": "published"},
        {"id": ids[2], "status": "pending"}, {"id": ids[3], "status": "published"},
        {"id": ids[4], "status": "pending"}]
    assert repo.stats().held_back == 2
    # per aggregate, the broker saw b's events in id order and nothing of a after the poison
    assert broker.published == [ids[0], ids[1], ids[3]]


def _count_pauses(relay, after: int) -> tuple[threading.Event, list[float]]:
    """A stop event set after ``after`` idle pauses, and the list of those pauses (as the
    relay announces each to its progress clock; it waits them on its doorbell, which a ring
    may cut short, so not through ``stop.wait``)."""
    stop, pauses = threading.Event(), []
    progress = relay._progress

    def record(*, waiting: float = 0.0) -> None:
        if waiting:
            pauses.append(waiting)
            if len(pauses) >= after:
                stop.set()
        progress(waiting=waiting)

    relay._progress = record
    return stop, pauses


def test_the_idle_pause_doubles_up_to_its_cap_and_work_resets_it(db, repo, relay_of):
    relay = relay_of(repo, Broker(), idle_pause=0.01, max_idle_pause=0.1)
    stop, pauses = _count_pauses(relay, after=8)
    relay.run(stop)
    assert pauses == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1, 0.1, 0.1]

    seed(repo, 1)
    relay = relay_of(repo, Broker(), idle_pause=0.01, max_idle_pause=0.1)
    stop, pauses = _count_pauses(relay, after=3)
    relay.run(stop)
    assert pauses == [0.01, 0.02, 0.04] and relay.stats.published == 1


def test_stopping_finishes_and_records_the_batch_in_hand(db, repo, fetch, relay_of):
    seed(repo, 30)
    stop = threading.Event()

    class StoppingBroker(Broker):
        def publish(self, events):
            stop.set()  # a SIGTERM arrives during the publish
            return super().publish(events)

    broker = StoppingBroker()
    relay_of(repo, broker, batch_size=10).run(stop)
    assert len(broker.batches) == 1
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status ORDER BY status"
                 ) == [{"status": "pending", "n": 20}, {"status": "published", "n": 10}]


def test_a_lock_conflict_while_recording_is_retried(db, db_url, repo, fetch, relay_of):
    ids = seed(repo, 2)
    holding, conflicted = threading.Event(), threading.Event()
    relay = None
    holders = []

    def hold_rows():
        other = db_url.database()
        with other.atomic():
            other.execute_sql("SELECT id FROM outbox_event WHERE id IN (%s, %s) FOR UPDATE", ids)
            holding.set()
            _wait_until(lambda: relay.stats.lock_conflicts >= 1, timeout=30)
        other.close()
        conflicted.set()

    class Broker2(Broker):
        def publish(self, events):
            FAMILY.limit_lock_waits(db, 1)
            holders.append(threading.Thread(target=hold_rows))
            holders[0].start()
            assert holding.wait(10)
            return super().publish(events)

    relay = relay_of(repo, Broker2())
    result = relay.run_once()
    # The holder lets go once it sees the conflict; the relay's retry can then finish before
    # the holder's last step: wait for the thread, not for luck.
    holders[0].join(30)
    assert not holders[0].is_alive() and conflicted.is_set()
    assert result.published == 2 and relay.stats.lock_conflicts >= 1
    assert fetch("SELECT DISTINCT status FROM outbox_event") == [{"status": "published"}]


@pytest.mark.parametrize("kind", ["autoconnect", "no-autoconnect", "pooled"])
@pytest.mark.parametrize("when", ["claim", "record"])
def test_a_killed_connection_is_reconnected_and_nothing_is_lost_or_doubled(
        db_url, clock, fetch, kind, when, relay_of):
    if kind == "pooled":
        database = db_url.database(FAMILY.pooled_class(), max_connections=4)
    else:
        database = db_url.database(FAMILY.database_class(), autoconnect=kind == "autoconnect")
    database.connect()
    kills = []

    def kill_own_connection():
        connection_id = FAMILY.session_id(database)
        fetch(FAMILY.kill_sql(connection_id))
        kills.append(connection_id)

    class KillingRepository(OutboxRepository):
        claims = 0

        def claim_batch(self, *args, **kwargs):
            self.claims += 1
            if when == "claim" and self.claims in (2, 4):
                kill_own_connection()  # the claim transaction finds it dead
            return super().claim_batch(*args, **kwargs)

    class KillingBroker(Broker):
        def publish(self, events):
            if when == "record" and len(self.batches) in (1, 3):
                kill_own_connection()  # recording the outcomes finds it dead
            return super().publish(events)

    repo = KillingRepository(database, clock=clock)
    ids = seed(repo, 40)
    broker = KillingBroker()
    relay = relay_of(repo, broker, batch_size=10, reconnect_pause=0.01, lock_timeout=10)
    _drain(relay)
    database.close()
    assert len(kills) == 2 and relay.stats.reconnects == 2
    assert sorted(broker.published) == ids  # each event handed to the broker once
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": 40}]
    assert fetch("SELECT MAX(attempt_count) AS a FROM outbox_event") == [{"a": 1}]


def test_progress_lines_name_the_figures_and_nothing_else(db, repo, caplog, relay_of):
    seed(repo, 5)
    relay = relay_of(repo, Broker(), progress_every=0.001)
    with caplog.at_level(logging.INFO, "outbox_lite.relay"):
        _drain(relay)
    lines = [r.getMessage() for r in caplog.records if r.name == "outbox_lite.relay"]
    assert any("5 published" in line and "events/s" in line for line in lines), lines
    assert not any('"n"' in line or "job.created" in line for line in lines)


def test_the_progress_rate_is_the_last_intervals_not_a_lifetime_average(db, repo, caplog,
                                                                         relay_of):
    """A burst of 1,500 events in 1 s, then 99 s idle: the line after the burst says 1500
    events/s, the one after the quiet 0 (the lifetime average would say 15, then 15 again).
    Time is the stats' own clock, moved by hand."""
    now = [1000.0]
    relay = relay_of(repo, Broker())
    relay.stats = RelayStats(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "outbox_lite.relay"):
        relay.stats.published += 1500
        now[0] += 1.0
        relay.log_progress()
        now[0] += 99.0
        relay.log_progress()
        relay.stats.published += 50
        now[0] += 10.0
        relay.log_progress()
    lines = [r.getMessage() for r in caplog.records if r.name == "outbox_lite.relay"]
    assert [line.split("; ")[1] for line in lines] == [
        "1500 events/s in the last 1 s", "0 events/s in the last 99 s",
        "5 events/s in the last 10 s"], lines
    assert all("1550 published" in line for line in lines[2:]), lines


def test_worker_ids_are_unique_and_valid(db, repo):
    ids = {default_worker_id() for _ in range(100)}
    assert len(ids) == 100
    relay = Relay(repo, Broker())
    assert relay.worker_id.count(":") == 2


@pytest.mark.parametrize("options,words", [
    ({"batch_size": 0}, "batch_size"),
    ({"lock_timeout": -1}, "lock_timeout"),
    ({"lock_timeout": 10, "heartbeat": 10}, "heartbeat"),
    ({"worker_id": " x"}, "worker_id"),
    ({"ordered": "yes"}, "ordered"),
    ({"idle_pause": 0}, "idle_pause"),
])
def test_bad_options_are_refused(db, repo, options, words):
    with pytest.raises(InvalidEventError, match=words):
        Relay(repo, Broker(), **options)


def test_a_publisher_must_have_publish_and_close(db, repo):
    with pytest.raises(TypeError, match="publish"):
        Relay(repo, object())
    with pytest.raises(TypeError, match="OutboxRepository"):
        Relay(db, Broker())
