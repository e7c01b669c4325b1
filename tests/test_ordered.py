"""claim_batch(ordered=True): only the head of each aggregate is claimable (SPEC §4)."""

from __future__ import annotations

import datetime as dt
import threading
from collections import defaultdict

import pytest

from outbox_lite import InvalidEventError

from _helpers import FAMILY, T0, run_threads


def _events(repo, plan):
    """Create events in one transaction from [(aggregate_id, n), ...]; returns their ids."""
    with repo.database.atomic():
        return [repo.create_in_transaction(event_type="job.step", aggregate_type="job",
                                           aggregate_id=agg, payload={"n": n}).id
                for agg, n in plan]


def _claim(db, repo, worker="w", limit=100, ordered=True):
    with db.atomic():
        return repo.claim_batch(worker, limit=limit, ordered=ordered)


def _dead_letter(repo, event_id, worker="w"):
    assert repo.mark_failed(event_id, worker, "poison", "cannot publish", retryable=False)


def test_only_the_oldest_unpublished_event_of_each_aggregate_is_claimed(db, repo, fetch):
    a1, b1, a2, b2, c1, a3 = _events(repo, [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("c", 1),
                                            ("a", 3)])
    assert [e.id for e in _claim(db, repo)] == [a1, b1, c1]
    assert fetch("SELECT id FROM outbox_event WHERE status = 'processing' ORDER BY id") == [
        {"id": a1}, {"id": b1}, {"id": c1}]
    assert _claim(db, repo) == []  # every head is in flight: nothing else is claimable
    assert repo.mark_published_many([a1, b1], "w") == 2
    assert [e.id for e in _claim(db, repo)] == [a2, b2]
    assert repo.mark_published_many([a2], "w") == 1
    assert [e.id for e in _claim(db, repo)] == [a3]


def test_the_unordered_claim_still_takes_everything(db, repo):
    ids = _events(repo, [("a", 1), ("a", 2), ("a", 3)])
    assert [e.id for e in _claim(db, repo, ordered=False)] == ids


@pytest.mark.parametrize("blocker", ["pending_in_backoff", "processing", "failed"])
def test_an_older_unpublished_event_blocks_its_aggregate_only(db, repo, clock, fetch, blocker):
    a1, a2, b1, b2 = _events(repo, [("a", 1), ("a", 2), ("b", 1), ("b", 2)])
    assert repo.mark_processing(a1, "w")
    if blocker == "pending_in_backoff":  # a retry waiting for its backoff keeps the order
        assert repo.mark_failed(a1, "w", "flaky", "retry later")
    elif blocker == "failed":
        _dead_letter(repo, a1)
    claimed = [e.id for e in _claim(db, repo)]
    assert claimed == [b1]
    assert fetch("SELECT status FROM outbox_event WHERE id = %s", a2) == [{"status": "pending"}]
    if blocker == "pending_in_backoff":
        clock.advance(hours=2)  # past the backoff: the retry itself is the head again
        assert [e.id for e in _claim(db, repo)] == [a1]


def test_requeue_and_delete_of_a_dead_letter_unblock_its_aggregate(db, repo, fetch):
    a1, a2, b1, b2 = _events(repo, [("a", 1), ("a", 2), ("b", 1), ("b", 2)])
    assert [e.id for e in _claim(db, repo)] == [a1, b1]
    _dead_letter(repo, a1)
    _dead_letter(repo, b1)
    assert _claim(db, repo) == []  # both aggregates wait for a person
    assert repo.requeue_failed([a1]) == 1
    assert [e.id for e in _claim(db, repo)] == [a1]  # the requeued event goes first again
    assert repo.delete_failed([b1]) == 1
    assert [e.id for e in _claim(db, repo)] == [b2]
    assert fetch("SELECT id, status FROM outbox_event ORDER BY id") == [
        {"id": a1, "status": "processing"}, {"id": a2, "status": "pending"},
        {"id": b2, "status": "processing"}]


def test_a_not_yet_available_head_is_not_claimed_and_holds_back_its_successors(db, repo, clock):
    later = T0 + dt.timedelta(minutes=5)
    with db.atomic():
        a1 = repo.create_in_transaction(event_type="e", aggregate_type="job", aggregate_id="a",
                                        payload={}, available_at=later).id
        a2 = repo.create_in_transaction(event_type="e", aggregate_type="job", aggregate_id="a",
                                        payload={}).id
    assert _claim(db, repo) == []
    clock.advance(minutes=5)
    assert [e.id for e in _claim(db, repo)] == [a1]
    assert repo.mark_published(a1, "w")
    assert [e.id for e in _claim(db, repo)] == [a2]


def test_aggregate_type_and_id_together_name_the_aggregate(db, repo):
    with db.atomic():
        ids = [repo.create_in_transaction(event_type="e", aggregate_type=t, aggregate_id=i,
                                          payload={}).id
               for t, i in [("job", "1"), ("user", "1"), ("job", "1"), ("job", "10")]]
    assert [e.id for e in _claim(db, repo)] == [ids[0], ids[1], ids[3]]


def test_ordered_claims_page_past_heads_other_workers_hold(db, repo, fetch):
    from outbox_lite import OutboxRepository
    narrow = OutboxRepository(db, clock=repo.clock, claim_window=1)
    ids = _events(narrow, [(str(n), n) for n in range(10)])
    with db.atomic():
        assert [e.id for e in narrow.claim_batch("holder", limit=3, ordered=True)] == ids[:3]

        def other(_):
            with db.atomic():
                return [e.id for e in narrow.claim_batch("other", limit=3, ordered=True)]

        results, errors = run_threads(1, other, db)
    assert errors == [] and results[0] == ids[3:6]


def test_ordered_claim_does_not_block_a_writer_of_the_same_aggregate(db, repo, fetch):
    _events(repo, [("a", 1), ("a", 2)])
    with db.atomic():
        assert len(repo.claim_batch("holder", ordered=True)) == 1

        def writer(_):
            FAMILY.limit_lock_waits(db, 1)
            with db.atomic():
                return repo.create_in_transaction(event_type="e", aggregate_type="job",
                                                  aggregate_id="a", payload={}).id

        results, errors = run_threads(1, writer, db)
    assert errors == [] and results[0] is not None
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 3}]


def test_ordered_must_be_a_bool(db, repo):
    with db.atomic():
        with pytest.raises(InvalidEventError, match="ordered"):
            repo.claim_batch("w", ordered="yes")


@pytest.mark.parametrize("round_", range(5))
def test_eight_threads_publish_each_aggregate_in_id_order_one_at_a_time(
        db, repo, fetch, round_):
    # 30 aggregates x 8 events, interleaved, two of them hot (40 events each).
    plan = [(f"agg-{n % 30}", n) for n in range(240)] + [("hot-1", n) for n in range(40)] \
        + [("hot-2", n) for n in range(40)]
    ids = _events(repo, plan)
    aggregate_of = dict(zip(ids, (agg for agg, _ in plan)))
    in_flight: dict[str, int] = {}
    overlaps: list[tuple[str, int, int]] = []
    published: list[int] = []
    lock = threading.Lock()

    def worker(i):
        name, mine = f"w{i}", []
        while True:
            with db.atomic():
                batch = repo.claim_batch(name, limit=5, ordered=True)
            if not batch:
                left = db.execute_sql("SELECT COUNT(*) FROM outbox_event"
                                      " WHERE status <> 'published'").fetchone()[0]
                if left == 0:
                    return mine
                continue
            with lock:  # the "broker": record the publish order and who is in flight
                for event in batch:
                    agg = aggregate_of[event.id]
                    if agg in in_flight:
                        overlaps.append((agg, in_flight[agg], event.id))
                    in_flight[agg] = event.id
                    published.append(event.id)
            mine += [e.id for e in batch]
            with lock:  # out of flight only once recorded, so an early claim is an overlap
                assert repo.mark_published_many([e.id for e in batch], name) == len(batch)
                for event in batch:
                    del in_flight[aggregate_of[event.id]]

    results, errors = run_threads(8, worker, db)
    assert errors == []
    assert overlaps == []
    assert sorted(published) == ids  # every event once
    per_aggregate = defaultdict(list)
    for event_id in published:
        per_aggregate[aggregate_of[event_id]].append(event_id)
    assert all(order == sorted(order) for order in per_aggregate.values())
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": len(ids)}]
    assert sum(bool(r) for r in results) >= 2  # the work was shared


@pytest.mark.parametrize("round_", range(3))
def test_racing_ordered_claimers_get_disjoint_heads_without_waiting(db, repo, fetch, round_):
    ids = _events(repo, [(str(n % 50), n) for n in range(200)])

    def claim(i):
        FAMILY.limit_lock_waits(db, 1)
        with db.atomic():
            return [e.id for e in repo.claim_batch(f"w{i}", limit=10, ordered=True)]

    results, errors = run_threads(8, claim, db)
    assert errors == []
    claimed = [i for r in results for i in r]
    assert len(claimed) == len(set(claimed)) == 50  # each of the 50 heads, once
    assert sorted(claimed) == ids[:50]
    rows = fetch("SELECT aggregate_id, COUNT(*) AS n FROM outbox_event"
                 " WHERE status = 'processing' GROUP BY aggregate_id HAVING COUNT(*) > 1")
    assert rows == []
