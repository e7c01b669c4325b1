"""The aggregate index gains ``published_at``: (aggregate_type, aggregate_id, published_at).

``claim_batch(ordered=True)`` hands out only the head of each aggregate, its oldest unpublished
event. ``published_at`` is NULL exactly while an event is unpublished and NULLs sort first, so
with this third column the head is the first entry of the aggregate in the index: one index
read per candidate, however long the aggregate's published history is. The index still serves
every lookup by (aggregate_type, aggregate_id), so it replaces the two-column one instead of
standing beside it (a second index would cost every write for nothing).

One DDL statement, done in place without blocking writers (``LOCK=NONE`` fails rather than
locking the table if the server cannot do that).

PostgreSQL: a btree puts NULLs last and orders equal keys by their place in the heap, not by
id, so the index there is partial instead: (aggregate_type, aggregate_id, id) WHERE
published_at IS NULL, the unpublished events only, whose first entry per aggregate is its head.
``CREATE INDEX`` (not CONCURRENTLY: the migration is one transaction) blocks writers while it
builds.
"""

from outbox_lite._families import family_of

MIGRATE = (
    "ALTER TABLE outbox_event DROP INDEX ix_outbox_event_aggregate,"
    " ADD INDEX ix_outbox_event_aggregate (aggregate_type, aggregate_id, published_at),"
    " ALGORITHM=INPLACE, LOCK=NONE"
)
ROLLBACK = (
    "ALTER TABLE outbox_event DROP INDEX ix_outbox_event_aggregate,"
    " ADD INDEX ix_outbox_event_aggregate (aggregate_type, aggregate_id),"
    " ALGORITHM=INPLACE, LOCK=NONE"
)


POSTGRESQL = (
    "DROP INDEX ix_outbox_event_aggregate",
    "CREATE INDEX ix_outbox_event_aggregate ON outbox_event (aggregate_type, aggregate_id, id)"
    " WHERE published_at IS NULL",
)
POSTGRESQL_ROLLBACK = (
    "DROP INDEX ix_outbox_event_aggregate",
    "CREATE INDEX ix_outbox_event_aggregate ON outbox_event (aggregate_type, aggregate_id)",
)


def _postgresql(database):
    return family_of(database).name == "postgresql"


def is_applied(database):
    """Whether the aggregate index ends in ``published_at`` already (PostgreSQL: whether it is
    the partial index of unpublished events)."""
    if _postgresql(database):
        return bool(database.execute_sql(
            "SELECT 1 FROM pg_indexes WHERE schemaname = current_schema()"
            " AND indexname = 'ix_outbox_event_aggregate'"
            " AND indexdef LIKE '%%WHERE (published_at IS NULL)%%'").fetchone())
    return bool(database.execute_sql(
        "SELECT 1 FROM information_schema.statistics WHERE table_schema = DATABASE()"
        " AND table_name = 'outbox_event' AND index_name = 'ix_outbox_event_aggregate'"
        " AND seq_in_index = 3 AND column_name = 'published_at'").fetchone())


def migrate(migrator, database, *, fake=False):
    for statement in POSTGRESQL if _postgresql(database) else (MIGRATE,):
        migrator.sql(statement)


def rollback(migrator, database, *, fake=False):
    for statement in POSTGRESQL_ROLLBACK if _postgresql(database) else (ROLLBACK,):
        migrator.sql(statement)
