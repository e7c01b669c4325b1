"""Outcomes: publish, fail and retry, dead letters, fencing, expired locks, requeue."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from outbox_lite import Backoff, InvalidEventError, OutboxRepository

from _helpers import T0, new_event, seed


def _claim(repo, worker="w1"):
    event = new_event(repo)
    assert repo.mark_processing(event.id, worker)
    return event


def test_mark_published_by_the_holder(repo, fetch, clock):
    event = _claim(repo)
    clock.advance(seconds=2)
    assert repo.mark_published(event.id, "w1") is True
    row = fetch("SELECT * FROM outbox_event")[0]
    assert row["status"] == "published"
    assert row["published_at"] == row["updated_at"] == (T0 + dt.timedelta(seconds=2)).replace(
        tzinfo=None)
    assert row["locked_by"] is None and row["locked_at"] is None
    assert repo.mark_published(event.id, "w1") is False  # once only


def test_fencing_a_stale_worker_changes_nothing(repo, fetch, clock):
    event = _claim(repo, "stale")
    clock.advance(minutes=10)
    assert repo.release_expired_locks(dt.timedelta(minutes=5)) == 1
    assert repo.mark_processing(event.id, "fresh")
    before = fetch("SELECT * FROM outbox_event")
    assert repo.mark_published(event.id, "stale") is False
    assert repo.mark_failed(event.id, "stale", "boom", "late failure") is False
    assert fetch("SELECT * FROM outbox_event") == before
    assert repo.mark_published(event.id, "fresh") is True


def test_fencing_compares_locked_by_exactly(repo, fetch):
    event = _claim(repo, "Worker-1")
    assert repo.mark_published(event.id, "worker-1") is False
    assert fetch("SELECT status FROM outbox_event") == [{"status": "processing"}]


def test_mark_published_refuses_pending_events(repo, fetch):
    event = new_event(repo)
    assert repo.mark_published(event.id, "w1") is False
    assert fetch("SELECT status, published_at FROM outbox_event") == [
        {"status": "pending", "published_at": None}]


def test_retryable_failure_goes_back_to_pending_with_exponential_backoff(repo, fetch, clock):
    event = new_event(repo)
    expected_delays = [10, 20, 40, 80]  # base 10 s, factor 2, no jitter (the fixture's)
    for attempt, delay in enumerate(expected_delays, start=1):
        assert repo.mark_processing(event.id, "w1")
        assert repo.mark_failed(event.id, "w1", "broker_down", "connection refused") is True
        row = fetch("SELECT * FROM outbox_event")[0]
        assert row["status"] == "pending" and row["attempt_count"] == attempt
        assert row["available_at"] == (clock.now + dt.timedelta(seconds=delay)).replace(
            tzinfo=None)
        assert row["last_error_code"] == "broker_down"
        assert row["locked_by"] is None and row["locked_at"] is None
        assert repo.mark_processing(event.id, "w1") is False  # not yet available
        clock.advance(seconds=delay)
    # Fifth attempt: max_attempts (5) is exhausted, so it dead-letters.
    assert repo.mark_processing(event.id, "w1")
    assert repo.mark_failed(event.id, "w1", "broker_down", "still refused") is True
    row = fetch("SELECT * FROM outbox_event")[0]
    assert row["status"] == "failed" and row["attempt_count"] == 5
    assert row["last_error_message"] == "still refused"
    assert row["locked_by"] is None and row["locked_at"] is None  # a dead letter holds no lock


def test_backoff_is_capped_and_jittered_as_configured(db, fetch, clock):
    draws = itertools.cycle([0.0, 0.5])  # one draw per precomputed attempt
    backoff = Backoff(base=100, factor=10, cap=1000, jitter=0.5, random=lambda: next(draws))
    repo = OutboxRepository(db, clock=clock, backoff=backoff, max_attempts=10)
    event = new_event(repo)
    # Attempt 1 waits 100 s * (1 - 0.5 * 0.0); later ones the cap, 1000 s * (1 - 0.5 * 0.5).
    for expected in (100, 750, 750):
        assert repo.mark_processing(event.id, "w")
        assert repo.mark_failed(event.id, "w", "e", "m")
        available = fetch("SELECT available_at FROM outbox_event")[0]["available_at"]
        assert available == (clock.now + dt.timedelta(seconds=expected)).replace(tzinfo=None)
        clock.advance(seconds=expected)


def test_backoff_delays():
    backoff = Backoff(base=1, factor=2, cap=30, jitter=0)
    assert [backoff.delay(n).total_seconds() for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    jittered = Backoff(base=10, cap=10, jitter=0.2, random=lambda: 0.5)
    assert jittered.delay(3) == dt.timedelta(seconds=9)
    with pytest.raises(ValueError):
        Backoff(base=0)
    with pytest.raises(ValueError):
        Backoff(jitter=1)


def test_non_retryable_failure_dead_letters_at_once(repo, fetch):
    event = _claim(repo)
    assert repo.mark_failed(event.id, "w1", "bad_payload", "schema mismatch", retryable=False)
    assert fetch("SELECT status, attempt_count, last_error_code, locked_by, locked_at"
                 " FROM outbox_event") == [
        {"status": "failed", "attempt_count": 1, "last_error_code": "bad_payload",
         "locked_by": None, "locked_at": None}]
    assert repo.mark_processing(event.id, "w1") is False


@pytest.mark.parametrize("max_attempts,retryable", [(5, False), (1, True), (2, True)],
                         ids=["non-retryable", "max-attempts-1", "last-attempt"])
def test_only_the_holder_can_make_a_dead_letter(db, fetch, clock, max_attempts, retryable):
    """mark_failed's fencing where the failure dead-letters (SPEC §2: "same fencing"): a
    stale worker's failure changes nothing of an event another worker holds; the holder's
    makes a dead letter with its lock cleared."""
    repo = OutboxRepository(db, clock=clock, max_attempts=max_attempts,
                            backoff=Backoff(base=10, cap=10, jitter=0))
    event = new_event(repo)
    for _ in range(max_attempts - 1 if retryable else 0):  # up to the last attempt
        assert repo.mark_processing(event.id, "earlier")
        assert repo.mark_failed(event.id, "earlier", "broker_down", "refused")
        clock.advance(seconds=10)
    assert repo.mark_processing(event.id, "holder")
    before = fetch("SELECT * FROM outbox_event")
    assert repo.mark_failed(event.id, "stale", "late", "stale failure",
                            retryable=retryable) is False
    assert fetch("SELECT * FROM outbox_event") == before
    assert before[0]["status"] == "processing" and before[0]["locked_by"] == "holder"
    assert repo.mark_failed(event.id, "holder", "rejected", "for good",
                            retryable=retryable) is True
    assert fetch("SELECT status, attempt_count, last_error_code, locked_by, locked_at"
                 " FROM outbox_event") == [
        {"status": "failed", "attempt_count": max_attempts if retryable else 1,
         "last_error_code": "rejected", "locked_by": None, "locked_at": None}]


def test_stored_error_messages_are_redacted_and_bounded(repo, fetch):
    event = _claim(repo)
    message = ("POST https://svc:hunter2@broker.internal/x failed; Authorization: Bearer "
               "abcdEFGH1234ijklMNOP5678 rejected; " + "é" * 40_000)
    assert repo.mark_failed(event.id, "w1", "http_401", message)
    stored = fetch("SELECT last_error_message AS m FROM outbox_event")[0]["m"]
    assert "hunter2" not in stored and "abcdEFGH1234ijklMNOP5678" not in stored
    assert "https://svc:***@broker.internal" in stored and "Bearer ***" in stored
    assert len(stored.encode("utf-8")) <= 65_535
    assert stored.endswith("[truncated]")


@pytest.mark.parametrize("code,message,retryable,field", [
    ("", "m", True, "error_code"), ("x" * 65, "m", True, "error_code"),
    (None, "m", True, "error_code"), ("code", None, True, "error_message"),
    ("code", b"bytes", True, "error_message"), ("code", "m", "yes", "retryable"),
])
def test_mark_failed_refuses_bad_arguments(repo, fetch, code, message, retryable, field):
    event = _claim(repo)
    with pytest.raises(InvalidEventError, match=field):
        repo.mark_failed(event.id, "w1", code, message, retryable=retryable)
    assert fetch("SELECT status, last_error_code FROM outbox_event") == [
        {"status": "processing", "last_error_code": None}]


def test_release_expired_locks_by_the_injected_clock(repo, fetch, clock):
    old = _claim(repo, "crashed")
    clock.advance(seconds=50)
    young = _claim(repo, "alive")
    clock.advance(seconds=20)  # old: held 70 s; young: held 20 s
    assert repo.release_expired_locks(60) == 1
    rows = {r["id"]: r for r in fetch("SELECT * FROM outbox_event")}
    assert rows[old.id]["status"] == "pending" and rows[old.id]["locked_by"] is None
    assert rows[old.id]["last_error_code"] == "lock_expired"
    assert "crashed" in rows[old.id]["last_error_message"]
    assert rows[old.id]["attempt_count"] == 1
    assert rows[young.id]["status"] == "processing" and rows[young.id]["locked_by"] == "alive"
    assert repo.release_expired_locks(dt.timedelta(seconds=60)) == 0
    # The released event is dispatchable again at once.
    assert [e.id for e in repo.find_dispatchable()] == [old.id]


def test_release_expired_locks_dead_letters_when_attempts_are_exhausted(db, fetch, clock):
    repo = OutboxRepository(db, clock=clock, max_attempts=2)
    event = new_event(repo)
    for _ in range(2):
        assert repo.mark_processing(event.id, "crashing")
        clock.advance(minutes=2)
        repo.release_expired_locks(60)
    assert fetch("SELECT status, attempt_count, last_error_code, locked_by, locked_at"
                 " FROM outbox_event") == [
        {"status": "failed", "attempt_count": 2, "last_error_code": "lock_expired",
         "locked_by": None, "locked_at": None}]


def test_release_expired_locks_handles_more_than_one_page(db, repo, fetch, clock):
    ids = seed(repo, 1_203)
    with db.atomic():
        assert len(repo.claim_batch("crashed", limit=2_000)) == 1_203
    clock.advance(hours=1)
    assert repo.release_expired_locks(60) == 1_203
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'pending'") == [
        {"n": len(ids)}]


@pytest.mark.parametrize("bad", [-1, 0, dt.timedelta(seconds=-5), "60", None, float("nan")])
def test_release_expired_locks_refuses_bad_timeouts(repo, bad):
    with pytest.raises(InvalidEventError, match="lock_timeout"):
        repo.release_expired_locks(bad)


def test_requeue_failed_all_or_by_id(repo, fetch, clock):
    events = [_claim(repo) for _ in range(3)]
    for e in events:
        assert repo.mark_failed(e.id, "w1", "fatal", "no", retryable=False)
    pending = new_event(repo)
    clock.advance(seconds=5)
    assert repo.requeue_failed([events[0].id, pending.id, 10 ** 9]) == 1
    row = fetch("SELECT status, attempt_count, available_at FROM outbox_event WHERE id = %s",
                events[0].id)[0]
    assert row == {"status": "pending", "attempt_count": 0,
                   "available_at": clock.now.replace(tzinfo=None)}
    assert repo.requeue_failed([]) == 0
    assert repo.requeue_failed() == 2
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'failed'") == [{"n": 0}]
    assert repo.requeue_failed() == 0
    # A requeued event can be claimed again, with a fresh attempt count.
    assert repo.mark_processing(events[1].id, "w2")
    assert fetch("SELECT attempt_count FROM outbox_event WHERE id = %s", events[1].id) == [
        {"attempt_count": 1}]


@pytest.mark.parametrize("bad", ["1,2", [0], [1, "2"], 5, [True]])
def test_requeue_failed_refuses_bad_ids(repo, bad):
    with pytest.raises(InvalidEventError):
        repo.requeue_failed(bad)
