"""extend_locks: a worker renews the claims it still holds, fenced like mark_published."""

from __future__ import annotations

import datetime as dt

import pytest

from outbox_lite import InvalidEventError

from _helpers import claim_all, T0, run_threads, seed


def test_renewed_claims_survive_the_release_of_expired_ones(db, repo, fetch, clock):
    ids = claim_all(repo, "w1", 4)
    clock.advance(minutes=4)
    assert repo.extend_locks(ids, "w1") == 4
    renewed_at = (T0 + dt.timedelta(minutes=4)).replace(tzinfo=None)
    assert fetch("SELECT DISTINCT locked_at, updated_at, locked_by, status FROM outbox_event") == [
        {"locked_at": renewed_at, "updated_at": renewed_at, "locked_by": "w1",
         "status": "processing"}]
    clock.advance(minutes=3)  # 7 minutes after the claim, 3 after the renewal
    assert repo.release_expired_locks(dt.timedelta(minutes=5)) == 0
    assert repo.mark_published_many(ids, "w1") == 4


def test_lost_claims_are_not_renewed_and_are_counted_out(db, repo, fetch, clock):
    ids = claim_all(repo, "stale", 5)
    clock.advance(minutes=10)
    assert repo.release_expired_locks(dt.timedelta(minutes=5)) == 5
    assert repo.mark_processing(ids[0], "fresh")  # taken over by another worker
    assert repo.mark_processing(ids[1], "stale")  # claimed again by the same worker
    before = fetch("SELECT * FROM outbox_event WHERE id <> %s ORDER BY id", ids[1])
    clock.advance(seconds=30)
    assert repo.extend_locks(ids, "stale") == 1
    assert fetch("SELECT * FROM outbox_event WHERE id <> %s ORDER BY id", ids[1]) == before
    assert fetch("SELECT locked_at FROM outbox_event WHERE id = %s", ids[1]) == [
        {"locked_at": clock.now.replace(tzinfo=None)}]


def test_published_failed_and_missing_events_are_left_alone(db, repo, fetch):
    ids = claim_all(repo, "w1", 3)
    assert repo.mark_published(ids[0], "w1")
    assert repo.mark_failed(ids[1], "w1", "x", "y", retryable=False)
    before = fetch("SELECT * FROM outbox_event ORDER BY id")
    assert repo.extend_locks([ids[0], ids[1], 10 ** 9], "w1") == 0
    assert fetch("SELECT * FROM outbox_event ORDER BY id") == before


def test_a_renewal_at_the_claims_own_instant_still_counts(db, repo, fetch, clock):
    # MySQL reports changed rows, not matched ones: locked_at = now changes nothing here.
    ids = claim_all(repo, "w1", 3)
    assert repo.extend_locks(ids, "w1") == 3
    assert repo.extend_locks(ids + [10 ** 9], "w1") == 3


def test_more_ids_than_one_statement_takes(db, repo, fetch, clock):
    ids = claim_all(repo, "w1", 1103)
    clock.advance(seconds=1)
    assert repo.extend_locks(reversed(ids), "w1") == 1103
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE locked_at = %s",
                 clock.now.replace(tzinfo=None)) == [{"n": 1103}]


@pytest.mark.parametrize("round_", range(5))
def test_renewal_racing_the_release_never_leaves_a_claim_both_renewed_and_released(
        db, repo, fetch, clock, round_):
    ids = claim_all(repo, "slow", 60)
    clock.advance(minutes=10)  # every claim is past the timeout when the race starts

    def race(i):
        if i == 0:
            return repo.release_expired_locks(dt.timedelta(minutes=5))
        return repo.extend_locks(ids, "slow")

    results, errors = run_threads(2, race, db)
    assert errors == []
    released, renewed = results
    assert released + renewed == 60  # each claim went one way or the other, never both
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'processing'"
                 " AND locked_by = 'slow'") == [{"n": renewed}]
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'pending'"
                 " AND last_error_code = 'lock_expired'") == [{"n": released}]


@pytest.mark.parametrize("bad,field", [
    ("1,2", "event_ids"), ([0], "event_id"), (None, "event_ids"), ([1.5], "event_id")])
def test_bad_ids_are_refused_before_any_sql(repo, fetch, bad, field):
    seed(repo, 1)
    with pytest.raises(InvalidEventError, match=field):
        repo.extend_locks(bad, "w")
    with pytest.raises(InvalidEventError, match="locked_by"):
        repo.extend_locks([1], " ")
