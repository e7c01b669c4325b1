"""Create ``outbox_event``: 16 columns, ``DATETIME(6)`` UTC instants, its indexes.

One DDL statement, because MySQL DDL is not transactional: a failure leaves no half-made table.
Hand-written: peewee-migrate's auto mode loses ``DATETIME(6)`` and mangles JSON columns.
"""

CREATE_OUTBOX_EVENT = """
CREATE TABLE outbox_event (
    id                 BIGINT       NOT NULL AUTO_INCREMENT,
    event_type         VARCHAR(255) NOT NULL,
    aggregate_type     VARCHAR(255) NOT NULL,
    aggregate_id       VARCHAR(255) NOT NULL,
    dedupe_key         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload            JSON         NOT NULL,
    status             VARCHAR(16)  NOT NULL DEFAULT 'pending',
    attempt_count      INT UNSIGNED NOT NULL DEFAULT 0,
    available_at       DATETIME(6)  NOT NULL,
    locked_at          DATETIME(6)  NULL,
    locked_by          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    published_at       DATETIME(6)  NULL,
    last_error_code    VARCHAR(64)  NULL,
    last_error_message TEXT         NULL,
    created_at         DATETIME(6)  NOT NULL,
    updated_at         DATETIME(6)  NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_outbox_event_dedupe_key (dedupe_key),
    KEY ix_outbox_event_status_available_at (status, available_at),
    KEY ix_outbox_event_locked_at (locked_at),
    KEY ix_outbox_event_aggregate (aggregate_type, aggregate_id),
    CONSTRAINT ck_outbox_event_status
        CHECK (status IN ('pending', 'processing', 'published', 'failed'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
"""


def is_applied(database):
    """Whether the table exists (``outbox_lite.migrate`` then records this migration)."""
    return bool(database.execute_sql(
        "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE()"
        " AND table_name = 'outbox_event'").fetchone())


def migrate(migrator, database, *, fake=False):
    migrator.sql(CREATE_OUTBOX_EVENT)


def rollback(migrator, database, *, fake=False):
    migrator.sql("DROP TABLE outbox_event")
