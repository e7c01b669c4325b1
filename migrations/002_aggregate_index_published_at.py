"""The aggregate index gains ``published_at``: (aggregate_type, aggregate_id, published_at).

``claim_batch(ordered=True)`` hands out only the head of each aggregate, its oldest unpublished
event. ``published_at`` is NULL exactly while an event is unpublished and NULLs sort first, so
with this third column the head is the first entry of the aggregate in the index: one index
read per candidate, however long the aggregate's published history is. The index still serves
every lookup by (aggregate_type, aggregate_id), so it replaces the two-column one instead of
standing beside it (a second index would cost every write for nothing).

One DDL statement, done in place without blocking writers (``LOCK=NONE`` fails rather than
locking the table if the server cannot do that).
"""

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


def is_applied(database):
    """Whether the aggregate index ends in ``published_at`` already."""
    return bool(database.execute_sql(
        "SELECT 1 FROM information_schema.statistics WHERE table_schema = DATABASE()"
        " AND table_name = 'outbox_event' AND index_name = 'ix_outbox_event_aggregate'"
        " AND seq_in_index = 3 AND column_name = 'published_at'").fetchone())


def migrate(migrator, database, *, fake=False):
    migrator.sql(MIGRATE)


def rollback(migrator, database, *, fake=False):
    migrator.sql(ROLLBACK)
