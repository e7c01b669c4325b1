"""find_dispatchable, mark_processing and claim_batch, alone and under contention."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest

from outbox_lite import InvalidEventError, TransactionRequiredError

from _helpers import FAMILY, T0, new_event, run_threads, seed


def test_find_dispatchable_orders_by_available_at_then_id_and_skips_the_future(repo, clock):
    late = new_event(repo, 1, available_at=T0 - dt.timedelta(seconds=1))
    early = new_event(repo, 2, available_at=T0 - dt.timedelta(seconds=5))
    same_a = new_event(repo, 3, available_at=T0 - dt.timedelta(seconds=1))
    future = new_event(repo, 4, available_at=T0 + dt.timedelta(seconds=30))
    assert [e.id for e in repo.find_dispatchable()] == [early.id, late.id, same_a.id]
    assert [e.id for e in repo.find_dispatchable(limit=1)] == [early.id]
    clock.advance(seconds=30)
    assert future.id in [e.id for e in repo.find_dispatchable()]


def test_find_dispatchable_returns_only_pending(repo, fetch):
    ids = seed(repo, 3)
    assert repo.mark_processing(ids[0], "w1")
    assert [e.id for e in repo.find_dispatchable()] == ids[1:]


def test_find_dispatchable_takes_no_locks(db, repo, db_url):
    ids = seed(repo, 2)
    with db.atomic():
        assert len(repo.find_dispatchable()) == 2
        # Another connection can change the rows at once: nothing is locked.
        other = db_url.database()
        FAMILY.limit_lock_waits(other, 1)
        assert other.execute_sql("UPDATE outbox_event SET attempt_count = 7"
                                 " WHERE id IN (%s, %s)", ids).rowcount == 2
        other.close()


def test_mark_processing_claims_once(repo, fetch, clock):
    event = new_event(repo)
    clock.advance(seconds=3)
    assert repo.mark_processing(event.id, "worker-1") is True
    row = fetch("SELECT * FROM outbox_event")[0]
    assert row["status"] == "processing" and row["locked_by"] == "worker-1"
    assert row["attempt_count"] == 1
    assert row["locked_at"] == row["updated_at"] == (T0 + dt.timedelta(seconds=3)).replace(
        tzinfo=None)
    assert repo.mark_processing(event.id, "worker-2") is False
    assert fetch("SELECT locked_by, attempt_count FROM outbox_event") == [
        {"locked_by": "worker-1", "attempt_count": 1}]


def test_mark_processing_refuses_missing_future_and_published(repo, fetch):
    future = new_event(repo, 1, available_at=T0 + dt.timedelta(minutes=5))
    done = new_event(repo, 2)
    assert repo.mark_processing(done.id, "w") and repo.mark_published(done.id, "w")
    assert repo.mark_processing(future.id, "w") is False
    assert repo.mark_processing(done.id, "w") is False
    assert repo.mark_processing(10 ** 12, "w") is False
    assert [r["status"] for r in fetch("SELECT status FROM outbox_event ORDER BY id")] == [
        "pending", "published"]


@pytest.mark.parametrize("round_", range(10))
def test_compare_and_set_race_has_exactly_one_winner(db, repo, fetch, round_):
    event = new_event(repo, round_)
    results, errors = run_threads(8, lambda i: repo.mark_processing(event.id, f"w{i}"), db)
    assert errors == []
    assert results.count(True) == 1 and results.count(False) == 7
    winner = f"w{results.index(True)}"
    assert fetch("SELECT status, locked_by, attempt_count FROM outbox_event") == [
        {"status": "processing", "locked_by": winner, "attempt_count": 1}]


def test_claim_batch_requires_the_callers_transaction(repo, fetch):
    seed(repo, 2)
    with pytest.raises(TransactionRequiredError):
        repo.claim_batch("w1")
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'pending'") == [{"n": 2}]


def test_claim_batch_claims_oldest_first_and_sets_the_claim_fields(db, repo, fetch, clock):
    ids = seed(repo, 5)
    clock.advance(seconds=1)
    with db.atomic():
        claimed = repo.claim_batch("w1", limit=3)
    assert [e.id for e in claimed] == ids[:3]
    assert all(e.status == "processing" and e.locked_by == "w1" and e.attempt_count == 1
               for e in claimed)
    rows = fetch("SELECT id, status, locked_by, locked_at, attempt_count FROM outbox_event"
                 " ORDER BY id")
    now = clock.now.replace(tzinfo=None)
    assert rows[:3] == [{"id": i, "status": "processing", "locked_by": "w1", "locked_at": now,
                         "attempt_count": 1} for i in ids[:3]]
    assert [r["status"] for r in rows[3:]] == ["pending", "pending"]


def test_claim_batch_rolls_back_with_the_callers_transaction(db, repo, fetch):
    seed(repo, 3)
    with pytest.raises(RuntimeError):
        with db.atomic():
            assert len(repo.claim_batch("w1")) == 3
            raise RuntimeError("worker crashed before commit")
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'pending'"
                 " AND attempt_count = 0 AND locked_by IS NULL") == [{"n": 3}]


@pytest.mark.parametrize("round_", range(5))
def test_claim_batch_from_8_threads_gets_disjoint_sets_and_every_event(db, repo, fetch, round_):
    ids = seed(repo, 200)

    def worker(i):
        mine = []
        while True:
            with db.atomic():
                batch = repo.claim_batch(f"w{i}", limit=7)
            if not batch:
                return mine
            mine.extend(e.id for e in batch)

    results, errors = run_threads(8, worker, db)
    assert errors == []
    claimed = Counter(i for ids_ in results for i in ids_)
    assert sorted(claimed) == ids
    assert max(claimed.values()) == 1  # disjoint: no event handed out twice
    rows = fetch("SELECT locked_by, COUNT(*) AS n, MAX(attempt_count) AS a FROM outbox_event"
                 " WHERE status = 'processing' GROUP BY locked_by")
    assert sum(r["n"] for r in rows) == 200 and all(r["a"] == 1 for r in rows)
    assert {r["locked_by"]: r["n"] for r in rows} == {
        f"w{i}": len(mine) for i, mine in enumerate(results) if mine}


def test_a_held_batch_is_skipped_without_waiting(db, repo, fetch):
    ids = seed(repo, 6)
    with db.atomic():
        held = repo.claim_batch("holder", limit=3)
        assert [e.id for e in held] == ids[:3]

        # A second worker on its own connection, which would wait 1 s and fail with
        # the lock-wait error if it touched a locked row.
        def other(_):
            FAMILY.limit_lock_waits(db, 1)
            with db.atomic():
                return [e.id for e in repo.claim_batch("other", limit=10)]

        results, errors = run_threads(1, other, db)
    assert errors == []
    assert results[0] == ids[3:]
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'processing'") == [
        {"n": 6}]


def test_claim_batch_does_not_block_a_writer_inserting_new_events(db, repo, fetch):
    seed(repo, 3)
    with db.atomic():
        assert len(repo.claim_batch("holder", limit=10)) == 3

        def writer(_):
            FAMILY.limit_lock_waits(db, 1)
            with db.atomic():
                return repo.create_in_transaction(event_type="e", aggregate_type="a",
                                                  aggregate_id="1", payload={}).id

        results, errors = run_threads(1, writer, db)
    assert errors == [] and results[0] is not None
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 4}]


@pytest.mark.parametrize("bad", [0, -1, 10_001, 2.5, "10", None, True])
def test_bad_limits_are_refused(db, repo, bad):
    with pytest.raises(InvalidEventError, match="limit"):
        repo.find_dispatchable(limit=bad)
    with db.atomic():
        with pytest.raises(InvalidEventError, match="limit"):
            repo.claim_batch("w", limit=bad)


@pytest.mark.parametrize("bad", ["", "  ", " w", "w" * 256, None, 7])
def test_bad_locked_by_is_refused(db, repo, fetch, bad):
    event = new_event(repo)
    with pytest.raises(InvalidEventError, match="locked_by"):
        repo.mark_processing(event.id, bad)
    with db.atomic():
        with pytest.raises(InvalidEventError, match="locked_by"):
            repo.claim_batch(bad)
    assert fetch("SELECT status FROM outbox_event") == [{"status": "pending"}]


@pytest.mark.parametrize("bad", [0, -5, "1", 1.0, None, True, 2 ** 63])
def test_bad_event_ids_are_refused(repo, bad):
    with pytest.raises(InvalidEventError, match="event_id"):
        repo.mark_processing(bad, "w")
    with pytest.raises(InvalidEventError, match="event_id"):
        repo.mark_published(bad, "w")


def test_claim_batch_pages_past_a_window_of_held_events(db, clock, fetch):
    from outbox_lite import OutboxRepository
    narrow = OutboxRepository(db, clock=clock, claim_window=1)  # a window of `limit` ids
    ids = seed(narrow, 10)
    with db.atomic():
        assert [e.id for e in narrow.claim_batch("holder", limit=3)] == ids[:3]

        def other(_):
            with db.atomic():
                return [e.id for e in narrow.claim_batch("other", limit=3)]

        results, errors = run_threads(1, other, db)
    assert errors == [] and results[0] == ids[3:6]
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE locked_by = 'other'") == [
        {"n": 3}]


# SPEC §2 (find_dispatchable: oldest available_at first, then id) and claim_batch's docstring
# promise it. Until issue 38 every server handed out the lowest ids among the candidates it read
# (limit times claim_window, in available_at order): LOCK_CANDIDATES kept the first `limit` by id.
@pytest.mark.parametrize("limit", [1, 3])
def test_claim_batch_hands_out_the_oldest_available_at_first_whatever_the_ids(
        db, repo, fetch, clock, limit):
    # available_at in reverse id order: claiming in id order would hand out the newest.
    ids = [new_event(repo, n, available_at=T0 - dt.timedelta(minutes=n)).id for n in range(6)]
    oldest_first = ids[::-1]
    with db.atomic():
        claimed = repo.claim_batch("w1", limit=limit)
    assert [e.id for e in claimed] == oldest_first[:limit]
    assert fetch("SELECT id FROM outbox_event WHERE status = 'processing' ORDER BY id") == [
        {"id": i} for i in sorted(oldest_first[:limit])]
