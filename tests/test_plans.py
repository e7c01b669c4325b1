"""Query plans: every statement uses the index it is written for (checked with EXPLAIN).

MySQL and MariaDB: ``ANALYZE TABLE`` then the tabular ``EXPLAIN``, one row per table read.
PostgreSQL: ``ANALYZE`` then ``EXPLAIN (FORMAT JSON)``, a tree of plan nodes (here flattened,
each node with its ``depth``); what the server read is counted by ``EXPLAIN (ANALYZE, FORMAT
JSON)``'s actual rows and loops per node, where MySQL has its Handler_read_* counters. Where
the servers differ: PostgreSQL locks only the rows a statement changes (no gap or next-key
locks), so a locking statement's index decides its cost, not what it locks, and its planner may
read the fenced outcomes (``status = 'processing' AND id = …``) through the status index (it
holds ``id`` since migration 003) rather than the primary key; and it has no loose index scan,
so the ordered claim's aggregates' read reads every dispatchable entry, then one index read
per head.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from outbox_lite._families.mysql_server import EXPLAIN

from _helpers import FAMILY, capture_sql, seed

PG = FAMILY.name == "postgresql"
ANALYZE = "ANALYZE outbox_event" if PG else "ANALYZE TABLE outbox_event"


def _nodes(plan: Any) -> list[dict[str, Any]]:
    """A PostgreSQL JSON plan's nodes, depth first, each with its ``depth``."""
    if isinstance(plan, str):
        plan = json.loads(plan)
    found: list[dict[str, Any]] = []

    def walk(node: dict[str, Any], depth: int) -> None:
        found.append({**{k: v for k, v in node.items() if k != "Plans"}, "depth": depth})
        for child in node.get("Plans", []):
            walk(child, depth + 1)

    walk(plan[0]["Plan"], 0)
    return found


def _explain(db: Any, sql: str, params: Any, analyze: bool = False) -> list[dict[str, Any]]:
    if PG:
        options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
        return _nodes(db.execute_sql(f"EXPLAIN ({options}) {sql}", params).fetchone()[0])
    cursor = db.execute_sql(f"{EXPLAIN} {sql}", params)
    names = [c[0] for c in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _scans(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes that read a table or an index (PostgreSQL)."""
    return [n for n in nodes if n["Node Type"].endswith("Scan") and n["Node Type"] not in (
        "Subquery Scan", "Function Scan", "Values Scan")]


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
    db.execute_sql(ANALYZE)
    plans = []

    def explain(sql, params):
        if sql.startswith(("SELECT", "INSERT", "UPDATE", "DELETE")):
            plans.append((sql, _explain(db, sql, params)))

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
    if PG:  # under the LIMIT, the status index in its order: no Sort node, no table scan
        for sql, nodes in reads:
            assert nodes[0]["Node Type"] == "Limit", (sql, nodes)
            [scan] = _scans(nodes)
            assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (sql, scan)
            assert scan["Index Name"] == "ix_outbox_event_status_available_at", (sql, scan)
            assert "status" in scan["Index Cond"] and "available_at" in scan["Index Cond"]
            assert not any(n["Node Type"] in ("Sort", "Incremental Sort") for n in nodes), nodes
        return
    for sql, [plan] in reads:
        assert plan["key"] == "ix_outbox_event_status_available_at", (sql, plan)
        assert plan["type"] == "range"
        assert "filesort" not in (plan["Extra"] or ""), plan


def test_every_locking_statement_goes_by_primary_key(db, captured):
    locking = [(s, p) for s, p in captured
               if s.startswith(("UPDATE", "DELETE")) or "FOR UPDATE" in s]
    kinds = {s.split()[0] for s, _ in locking}
    assert kinds == {"UPDATE", "DELETE", "SELECT"}
    if PG:
        # No locking statement reads the whole table: each reads by an index, the primary
        # key, or the status index for the fenced outcomes, or (the expired claims' release)
        # the locked_at index, as the planner finds cheaper (PostgreSQL 15 and 18 differ;
        # PostgreSQL locks the rows it changes only, whatever it reads them by). The claim's
        # own statements (the locking read, the UPDATE of the ids it locked) go by the
        # primary key.
        for sql, nodes in locking:
            scans = _scans(nodes)
            assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), (sql, nodes)
            assert {n.get("Index Name") for n in scans if "Index Name" in n} <= {
                "outbox_event_pkey", "ix_outbox_event_status_available_at",
                "ix_outbox_event_locked_at"}, (sql, scans)
        claim_path = [(s, n) for s, n in locking if "FOR UPDATE" in s or (
            s.startswith("UPDATE outbox_event SET status = 'processing'") and "ANY(" in s)]
        assert len(claim_path) >= 4, claim_path  # two claims: a locking read and an UPDATE each
        for sql, nodes in claim_path:
            assert any(n.get("Index Name") == "outbox_event_pkey" for n in nodes), (sql, nodes)
        return
    for sql, plans in locking:
        for plan in plans:
            assert plan["key"] == "PRIMARY", (sql, plan)
            assert plan["type"] in ("range", "const", "eq_ref"), (sql, plan)


def test_the_ordered_claim_reads_the_status_index_alone_then_one_head_per_aggregate(
        db, captured):
    [(sql, plans)] = [(s, p) for s, p in captured if s.startswith("SELECT (SELECT o.id")]
    if PG:
        # Each aggregate's head: a subplan reading ix_outbox_event_aggregate (aggregate_type,
        # aggregate_id, id) alone by the aggregate, in id order: its LIMIT 1 stops at the
        # first entry, no sort. The aggregates' read is one pass over the dispatchable rows
        # (no loose index scan on PostgreSQL): the status index or the table, as the planner
        # finds cheaper; never a read per aggregate.
        [subplan] = [n for n in plans if n.get("Parent Relationship") == "SubPlan"]
        below = [n for n in plans[plans.index(subplan) + 1:] if n["depth"] > subplan["depth"]]
        [head] = _scans(below)
        assert subplan["Node Type"] == "Limit", subplan
        assert head["Node Type"] in ("Index Only Scan", "Index Scan"), head
        assert (head["Index Name"], head["Alias"]) == ("ix_outbox_event_aggregate", "o"), head
        assert "aggregate_type" in head["Index Cond"] and "aggregate_id" in head["Index Cond"]
        assert not any(n["Node Type"] == "Sort" for n in below), below
        aggregates = [n for n in _scans(plans) if n is not head]
        assert len(aggregates) == 1 and aggregates[0]["Alias"] == "outbox_event", aggregates
        assert aggregates[0].get("Index Name") in (None, "ix_outbox_event_status_available_at")
        return
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


def _pg_reads(db: Any, statement: Any, params: dict[str, Any]) -> tuple[int, int, int]:
    """PostgreSQL's count of the HEADS statement's reads (EXPLAIN ANALYZE runs it): (rows it
    returned, entries the aggregates' read returned, head reads: the subplan's loops)."""
    nodes = _explain(db, *statement.bind(params), analyze=True)
    [subplan] = [n for n in nodes if n.get("Parent Relationship") == "SubPlan"]
    [outer_read] = [n for n in _scans(nodes) if n["Alias"] == "outbox_event"]
    return (nodes[0]["Actual Rows"], outer_read["Actual Rows"] * outer_read["Actual Loops"],
            subplan["Actual Loops"])


def test_an_ordered_claim_reads_as_many_entries_as_it_needs_and_one_head_per_aggregate(
        db, repo, clock):
    """Counted by the server (its Handler_read_* counters), on both kinds of server: the
    aggregates' read stops once it has the ones it wants, and a backlog of one aggregate
    costs one head read, not one per event. PostgreSQL, counted by EXPLAIN ANALYZE: the
    aggregates' read reads every dispatchable entry (no loose index scan), and the heads are
    one index read per aggregate handed out, however many events wait behind each."""
    if PG:
        from outbox_lite._families import postgresql_sql as pg_sql

        seed(repo, 2000)
        clock.advance(seconds=1)
        db.execute_sql(ANALYZE)
        heads = {"now": clock().replace(tzinfo=None), "size": 50}
        assert _pg_reads(db, pg_sql.HEADS, heads) == (50, 2000, 50)
        with db.atomic():
            db.execute_sql("DELETE FROM outbox_event")
        seed(repo, 2000, aggregate_id="hot")
        clock.advance(seconds=1)
        db.execute_sql(ANALYZE)
        heads["now"] = clock().replace(tzinfo=None)
        assert _pg_reads(db, pg_sql.HEADS, heads) == (1, 2000, 1)  # one head read, not 2,000
        return
    from outbox_lite._families import mysql_sql as _sql

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
    if PG:
        # The dead letters by the status index; what waits behind them is joined by the
        # aggregate, as the planner finds cheaper at this size (a hash join over the table,
        # or ix_outbox_event_aggregate); never the status index for them.
        [dead] = [n for n in _scans(plans)
                  if n.get("Index Name") == "ix_outbox_event_status_available_at"]
        assert "'failed'" in dead["Index Cond"], dead
        assert {n.get("Alias") for n in _scans(plans)} >= {"f", "e"}, plans
        [behind] = [n for n in _scans(plans) if n.get("Alias") == "e"]
        assert behind.get("Index Name") in (None, "ix_outbox_event_aggregate"), behind
        return
    dead, behind = plans
    assert dead["table"] == "f" and dead["key"] == "ix_outbox_event_status_available_at"
    assert behind["table"] == "e" and behind["key"] == "ix_outbox_event_aggregate", behind
    refs = [part.rsplit(".", 1)[-1] for part in behind["ref"].split(",")]
    assert refs == ["aggregate_type", "aggregate_id", "const"], behind
