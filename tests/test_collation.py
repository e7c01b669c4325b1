"""Aggregate ids (and error codes) compare exactly: migration 005 made them ``utf8mb4_bin``.

Before it the columns compared by ``utf8mb4_unicode_ci``, which takes each pair below for one
value: ordered claims handed out one head per pair, and a dead letter of one held the other
back. On PostgreSQL every built-in collation is deterministic (``=`` compares bytes), so the
pairs are distinct there whatever the database's locale; the columns are ``COLLATE "C"``
anyway, so that a nondeterministic default could not merge them.
"""

from __future__ import annotations

import pytest

from outbox_lite import migrate as schema

from _helpers import FAMILY, seed

PAIRS = [("Order-1", "order-1"), ("cafe", "café"), ("straße", "strasse"), ("A1", "Ａ１"),
         ("user-😀", "user-🍕")]


def test_what_each_server_answers_for_the_pairs(fetch):
    """Asked of the server itself: MySQL and MariaDB take every pair for one value under
    utf8mb4_unicode_ci (the columns' collation before 005) and two under utf8mb4_bin;
    PostgreSQL takes them for two under the database's default collation and under "C", both
    deterministic (its catalog says so)."""
    for first, second in PAIRS:
        if FAMILY.name == "mysql":
            [row] = fetch("SELECT CONVERT(%s USING utf8mb4) COLLATE utf8mb4_unicode_ci"
                          " = CONVERT(%s USING utf8mb4) AS loose,"
                          " CONVERT(%s USING utf8mb4) COLLATE utf8mb4_bin"
                          " = CONVERT(%s USING utf8mb4) AS exact", first, second, first, second)
            assert (row["loose"], row["exact"]) == (1, 0), (first, second)
        else:
            [row] = fetch("SELECT %s::text = %s::text AS loose,"
                          " %s::text COLLATE \"C\" = %s::text AS exact",
                          first, second, first, second)
            assert (row["loose"], row["exact"]) == (False, False), (first, second)
    if FAMILY.name == "postgresql":
        assert fetch("SELECT collname AS name, collisdeterministic AS exact FROM pg_collation"
                     " WHERE collname IN ('default', 'C') ORDER BY collname") == [
            {"name": "C", "exact": True}, {"name": "default", "exact": True}]


@pytest.mark.parametrize("first, second", PAIRS)
def test_ids_one_collation_would_confuse_are_distinct_aggregates(repo, db, fetch, first,
                                                                  second):
    with db.atomic():
        ids = [repo.create_in_transaction(event_type="t", aggregate_type="order",
                                          aggregate_id=aggregate, payload={"n": n})
               for n, aggregate in enumerate((first, second, first, second))]
    with db.atomic():
        heads = repo.claim_batch("w", limit=10, ordered=True)
    assert sorted(e.id for e in heads) == [ids[0].id, ids[1].id]  # two heads, one each
    assert [e.aggregate_id for e in heads] == [first, second]
    # A dead letter of one holds back that one only.
    assert repo.mark_failed(ids[0].id, "w", "boom", "broken", retryable=False)
    assert repo.mark_published(ids[1].id, "w")
    with db.atomic():
        [head] = repo.claim_batch("w", limit=10, ordered=True)
    assert (head.id, head.aggregate_id) == (ids[3].id, second)
    assert repo.stats().held_back == 1
    rows = fetch("SELECT id, status FROM outbox_event ORDER BY id")
    assert [r["status"] for r in rows] == ["failed", "published", "pending", "processing"]


def test_error_codes_compare_exactly(repo, db, fetch):
    ids = seed(repo, 2)
    with db.atomic():
        repo.claim_batch("w", limit=2)
    for event_id, code in zip(ids, ("Timeout", "timeout")):
        assert repo.mark_failed(event_id, "w", code, "x", retryable=False)
    assert repo.stats().dead_letters_by_code == {"Timeout": 1, "timeout": 1}
    assert repo.requeue_failed(error_code="timeout") == 1
    assert [r["status"] for r in fetch("SELECT status FROM outbox_event ORDER BY id")] == [
        "failed", "pending"]


def test_the_migration_converts_a_table_with_rows_and_keeps_them(db_url, repo, db, fetch):
    database = db_url.database()
    assert schema.rollback(database) == "006_headers_and_expiry"
    assert schema.rollback(database) == "005_exact_aggregate_ids"
    aggregates = [aggregate for pair in PAIRS for aggregate in pair]
    for n, aggregate in enumerate(aggregates):  # the library refuses the old schema
        fetch("INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key,"
              " payload, available_at, created_at, updated_at)"
              " VALUES ('t', 'order', %s, %s, '{}', '2026-01-01', '2026-01-01', '2026-01-01')",
              aggregate, f"k{n}")
    before = fetch("SELECT * FROM outbox_event ORDER BY id")
    assert schema.migrate(database) == ["005_exact_aggregate_ids", "006_headers_and_expiry"]
    database.close()
    assert [{**row, "headers": None, "expires_at": None} for row in before] == fetch(
        "SELECT * FROM outbox_event ORDER BY id")  # 006 adds the two columns, empty
    if FAMILY.name == "mysql":  # InnoDB's own check of the converted table and its indexes
        assert fetch("CHECK TABLE outbox_event")[0]["Msg_text"] == "OK"
    with db.atomic():
        heads = repo.claim_batch("w", limit=100, ordered=True)
    assert sorted(e.aggregate_id for e in heads) == sorted(aggregates)  # ten aggregates
