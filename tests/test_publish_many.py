"""mark_published_many: one statement for a batch, with mark_published's fencing per event."""

from __future__ import annotations

import datetime as dt

import pytest

from outbox_lite import InvalidEventError

from _helpers import claim_all, T0, run_threads, seed


def test_records_every_event_the_worker_holds(db, repo, fetch, clock):
    ids = claim_all(repo, "w1", 5)
    clock.advance(seconds=3)
    assert repo.mark_published_many(ids, "w1") == 5
    rows = fetch("SELECT status, published_at, updated_at, locked_by, locked_at"
                 " FROM outbox_event ORDER BY id")
    when = (T0 + dt.timedelta(seconds=3)).replace(tzinfo=None)
    assert rows == [{"status": "published", "published_at": when, "updated_at": when,
                     "locked_by": None, "locked_at": None}] * 5
    assert repo.mark_published_many(ids, "w1") == 0  # once only


def test_fences_each_event_a_stale_worker_lost(db, repo, fetch, clock):
    ids = claim_all(repo, "stale", 6)
    clock.advance(minutes=10)
    assert repo.release_expired_locks(dt.timedelta(minutes=5)) == 6
    taken = ids[:2]
    for event_id in taken:
        assert repo.mark_processing(event_id, "fresh")
    before = fetch("SELECT * FROM outbox_event WHERE id IN (%s, %s)", *taken)
    for event_id in ids[2:]:  # the rest the stale worker claims again, as anyone could
        assert repo.mark_processing(event_id, "stale")
    assert repo.mark_published_many(ids, "stale") == 4
    assert fetch("SELECT * FROM outbox_event WHERE id IN (%s, %s)", *taken) == before
    assert repo.mark_published_many(taken, "fresh") == 2
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": 6}]


def test_leaves_pending_failed_and_missing_events_alone(db, repo, fetch):
    ids = seed(repo, 3)
    before = fetch("SELECT * FROM outbox_event ORDER BY id")
    assert repo.mark_published_many([*ids, 10 ** 9], "w1") == 0
    assert fetch("SELECT * FROM outbox_event ORDER BY id") == before


def test_more_ids_than_one_statement_takes(db, repo, fetch):
    ids = claim_all(repo, "w1", 1203)
    assert repo.mark_published_many(reversed(ids), "w1") == 1203
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'published'") == [
        {"n": 1203}]


def test_inside_the_callers_transaction_it_rolls_back_with_it(db, repo, fetch):
    ids = claim_all(repo, "w1", 3)
    with db.atomic() as txn:
        assert repo.mark_published_many(ids, "w1") == 3
        txn.rollback()
    assert fetch("SELECT DISTINCT status FROM outbox_event") == [{"status": "processing"}]


@pytest.mark.parametrize("event_ids, locked_by, field", [
    ([1, "2"], "w1", "event_id"), ([0], "w1", "event_id"), ([True], "w1", "event_id"),
    ("12", "w1", "event_ids"), (None, "w1", "event_ids"), ([1], "", "locked_by"),
    ([1], "w" * 256, "locked_by"), ([1], None, "locked_by"),
])
def test_bad_arguments_are_refused_before_any_sql(db, repo, fetch, event_ids, locked_by,
                                                    field):
    claim_all(repo, "w1", 2)  # ids 1 and 2, held by w1
    before = fetch("SELECT * FROM outbox_event ORDER BY id")
    with pytest.raises(InvalidEventError, match=field):
        repo.mark_published_many(event_ids, locked_by)
    assert fetch("SELECT * FROM outbox_event ORDER BY id") == before


def test_an_empty_batch_records_nothing(db, repo):
    assert repo.mark_published_many([], "w1") == 0


@pytest.mark.parametrize("attempt", range(5))
def test_workers_publishing_overlapping_batches_record_each_event_once(db, repo, fetch,
                                                                        attempt):
    seed(repo, 400)
    with db.atomic():
        holders = {e.id: "w0" for e in repo.claim_batch("w0", limit=200)}
    with db.atomic():
        holders.update({e.id: "w1" for e in repo.claim_batch("w1", limit=200)})
    every = sorted(holders)

    def publish(i):  # each worker names every id; fencing keeps the other's rows
        return repo.mark_published_many(every[::-1] if i else every, f"w{i}")

    results, errors = run_threads(2, publish, db)
    assert errors == []
    assert results == [200, 200]
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'published'") == [
        {"n": 400}]
