"""Query plans: every statement uses the index it is written for (checked with EXPLAIN)."""

from __future__ import annotations

import pytest

from conftest import capture_sql, seed


@pytest.fixture
def captured(db, repo, clock):
    """Run every repository method once on a realistic table; collect each statement with
    the plan EXPLAIN gives for it just before it runs (after, deleted rows have no plan)."""
    ids = seed(repo, 300)
    clock.advance(seconds=1)
    db.execute_sql("ANALYZE TABLE outbox_event")
    plans = []

    def explain(sql, params):
        if sql.startswith(("SELECT", "INSERT", "UPDATE", "DELETE")):
            cursor = db.execute_sql("EXPLAIN " + sql, params)
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


def test_the_ordered_head_test_reads_one_aggregate_index_entry_per_candidate(db, captured):
    [(sql, plans)] = [(s, p) for s, p in captured
                      if s.startswith("SELECT id FROM outbox_event AS e")]
    outer, head = plans
    assert outer["table"] == "e" and outer["key"] == "ix_outbox_event_status_available_at"
    assert outer["type"] == "range" and "filesort" not in (outer["Extra"] or "")
    # A dependent subquery by ref on (aggregate_type, aggregate_id, published_at IS NULL),
    # from the index alone: its ORDER BY id LIMIT 1 stops at the first entry.
    assert head["select_type"] == "DEPENDENT SUBQUERY" and head["table"] == "o"
    assert head["key"] == "ix_outbox_event_aggregate" and head["type"] == "ref"
    refs = [part.rsplit(".", 1)[-1] for part in head["ref"].split(",")]
    assert refs == ["aggregate_type", "aggregate_id", "const"], head
    assert "Using index" in head["Extra"] and "filesort" not in head["Extra"], head


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
