"""Query plans: every statement uses the index it is written for (checked with EXPLAIN)."""

from __future__ import annotations

import pytest

from outbox_lite._server import EXPLAIN

from _helpers import capture_sql, seed


@pytest.fixture
def captured(db, repo, clock):
    """Run every repository method once on a realistic table (a published history, a few dead
    letters, a backlog); collect each statement with the plan EXPLAIN gives for it just
    before it runs (after, deleted rows have no plan)."""
    history = seed(repo, 600)
    with db.atomic():
        published = [e.id for e in repo.claim_batch("old", limit=590)]
    assert repo.mark_published_many(published[:580], "old") == 580
    for event_id in published[580:]:
        assert repo.mark_failed(event_id, "old", "e", "m", retryable=False)
    ids = seed(repo, 300)
    assert len(history) + len(ids) == 900
    clock.advance(seconds=1)
    db.execute_sql("ANALYZE TABLE outbox_event")
    plans = []

    def explain(sql, params):
        if sql.startswith(("SELECT", "INSERT", "UPDATE", "DELETE")):
            cursor = db.execute_sql(f"{EXPLAIN} {sql}", params)
            names = [c[0] for c in cursor.description]
            plans.append((sql, [dict(zip(names, row)) for row in cursor.fetchall()]))

    with capture_sql(db, before=explain) as statements:
        repo.find_dispatchable(limit=10)
        with db.atomic():
            batch = repo.claim_batch("w", limit=10)
        with db.atomic():
            heads = repo.claim_batch("w", limit=3, ordered=True)
        assert repo.extend_locks([e.id for e in heads], "w") == 3
        assert repo.mark_processing(ids[-1], "w")
        assert repo.mark_published(batch[0].id, "w")
        assert repo.mark_published_many([batch[3].id, batch[4].id], "w") == 2
        assert repo.mark_failed(batch[1].id, "w", "e", "m")
        assert repo.mark_failed(batch[2].id, "w", "e", "m", retryable=False)
        assert repo.mark_failed(heads[0].id, "w", "e", "m", retryable=False)
        assert repo.delete_failed([heads[0].id]) == 1
        clock.advance(hours=1)
        repo.release_expired_locks(60)
        repo.requeue_failed()
        clock.advance(days=30)
        repo.purge_published(60)
        assert repo.mark_processing(ids[100], "w")  # a dead letter for held_back to count
        assert repo.mark_failed(ids[100], "w", "e", "m", retryable=False)
        repo.stats(lock_timeout=60)
    assert [sql for sql, _ in plans] == [sql for sql, _ in statements
                                         if sql not in ("BEGIN", "COMMIT")]
    return plans


def test_find_and_claim_candidates_use_the_status_available_at_index(db, captured):
    reads = [(s, p) for s, p in captured
             if s.startswith("SELECT") and "status = 'pending' AND available_at <=" in s
             and "ORDER BY available_at" in s and "FOR UPDATE" not in s and "AS e" not in s]
    assert len(reads) >= 2  # find_dispatchable and the claim's candidate read
    for sql, [plan] in reads:
        assert plan["key"] == "ix_outbox_event_status_available_at", (sql, plan)
        assert plan["type"] == "range"
        assert "filesort" not in (plan["Extra"] or ""), plan


def test_every_locking_statement_goes_by_primary_key(db, captured):
    locking = [(s, p) for s, p in captured
               if s.startswith(("UPDATE", "DELETE")) or "FOR UPDATE" in s]
    kinds = {s.split()[0] for s, _ in locking}
    assert kinds == {"UPDATE", "DELETE", "SELECT"}
    for sql, plans in locking:
        for plan in plans:
            assert plan["key"] == "PRIMARY", (sql, plan)
            assert plan["type"] in ("range", "const", "eq_ref"), (sql, plan)


def test_the_ordered_claim_reads_the_status_index_alone_then_one_head_per_aggregate(
        db, captured):
    [(sql, plans)] = [(s, p) for s, p in captured if s.startswith("SELECT (SELECT o.id")]
    [outer] = [p for p in plans if p["select_type"] == "PRIMARY"]
    [aggregates] = [p for p in plans if p["select_type"] == "DERIVED"]
    [head] = [p for p in plans if p["select_type"] == "DEPENDENT SUBQUERY"]
    assert outer["table"].startswith("<derived")
    # The distinct aggregates of the oldest dispatchable events, from the index alone (it
    # holds the aggregate since migration 003), in its order: no sort, no row read.
    assert aggregates["key"] == "ix_outbox_event_status_available_at", aggregates
    # MariaDB answers a range scan. MySQL answers a range scan too, or, when its sampled
    # statistics say most entries match, a scan of the same index in its order (type "index"):
    # seen in 1 run of 4 on the same table. Either way the read stops at the LIMIT, as the
    # Handler_read counters below show.
    assert aggregates["type"] in ("range", "index") and "Using index" in aggregates["Extra"], \
        aggregates
    assert "filesort" not in aggregates["Extra"], aggregates
    # Each aggregate's head: a dependent subquery by ref on (aggregate_type, aggregate_id,
    # published_at IS NULL), from the index alone, no sort: its LIMIT 1 stops at the first
    # entry. Written ORDER BY o.id, MySQL sorts the aggregate's unpublished entries here.
    assert head["table"] == "o" and head["key"] == "ix_outbox_event_aggregate", head
    assert head["type"] == "ref", head
    refs = [part.rsplit(".", 1)[-1] for part in head["ref"].split(",")]
    assert refs == ["aggregate_type", "aggregate_id", "const"], head
    assert "Using index" in head["Extra"] and "filesort" not in head["Extra"], head


def _handler_reads(db) -> dict[str, int]:
    rows = db.execute_sql("SHOW SESSION STATUS WHERE Variable_name IN"
                          " ('Handler_read_key', 'Handler_read_next')").fetchall()
    return {name: int(value) for name, value in rows}


def _reads_of(db, statement, params):
    before = _handler_reads(db)
    rows = db.execute_sql(statement, params).fetchall()
    after = _handler_reads(db)
    return rows, {name: after[name] - before[name] for name in after}


def test_an_ordered_claim_reads_as_many_entries_as_it_needs_and_one_head_per_aggregate(
        db, repo, clock):
    """Counted by the server (its Handler_read_* counters), on both kinds of server: the
    aggregates' read stops once it has the ones it wants, and a backlog of one aggregate
    costs one head read, not one per event."""
    from outbox_lite import _sql

    seed(repo, 2000)  # 2,000 aggregates of one event each
    clock.advance(seconds=1)
    now = clock().replace(tzinfo=None)
    rows, reads = _reads_of(db, _sql.HEADS, (now, 50))
    assert len(rows) == 50
    assert reads["Handler_read_next"] < 200, reads  # not the 2,000 there are
    # a head read per aggregate (MariaDB also counts its look-ups in the DISTINCT's table)
    assert reads["Handler_read_key"] <= 2 * 50 + 5, reads
    with db.atomic():
        db.execute_sql("DELETE FROM outbox_event")
    seed(repo, 2000, aggregate_id="hot")  # one aggregate of 2,000 events
    clock.advance(seconds=1)
    rows, reads = _reads_of(db, _sql.HEADS, (clock().replace(tzinfo=None), 50))
    assert len(rows) == 1
    assert reads["Handler_read_key"] <= 5, reads  # one head read, not 2,000
    assert reads["Handler_read_next"] <= 2000 + 5, reads  # each pending entry once


def test_lease_and_dead_letter_statements_were_checked(captured):
    kinds = {s.split(" SET ")[1][:9] for s, _ in captured if s.startswith("UPDATE")}
    assert "locked_at" in kinds  # extend_locks
    assert any(s.startswith("DELETE") and "'failed'" in s for s, _ in captured)


def test_held_back_goes_from_the_dead_letters_to_what_waits_behind_them(captured):
    [(sql, plans)] = [(s, p) for s, p in captured if s.startswith("SELECT COUNT(DISTINCT e.id)")]
    dead, behind = plans
    assert dead["table"] == "f" and dead["key"] == "ix_outbox_event_status_available_at"
    assert behind["table"] == "e" and behind["key"] == "ix_outbox_event_aggregate", behind
    refs = [part.rsplit(".", 1)[-1] for part in behind["ref"].split(",")]
    assert refs == ["aggregate_type", "aggregate_id", "const"], behind
