"""Create ``inbox_message``: the consumers' inbox (``outbox_lite.inbox``), one row per message a
consumer has handled.

The primary key (consumer, message_id) is what ``Inbox.accept`` inserts into: its duplicate
check is the whole mechanism. Both columns compare exactly (binary collation; leading and
trailing white space is refused before any SQL, since a PAD SPACE collation ignores trailing
spaces), and at 4 bytes a character 64 + 704 characters fill InnoDB's 3,072-byte key.
``received_at`` (UTC, microseconds) is indexed for ``purge``, which pages through it.

One DDL statement, because MySQL DDL is not transactional; a service that never uses the
inbox pays for an empty table and nothing else (no trigger, no foreign key).

PostgreSQL: the same table, both key columns ``COLLATE "C"`` (bytes), its index in a statement
of its own. A btree entry there holds at most about 2,700 bytes: a key of 768 four-byte
characters (3,072 bytes) would be refused, where ASCII ids of any allowed length fit.
"""

from outbox_lite._families import family_of

CREATE_INBOX_MESSAGE = """
CREATE TABLE inbox_message (
    consumer    VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id  VARCHAR(704) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    received_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY ix_inbox_message_received_at (received_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
"""


POSTGRESQL = (
    """
CREATE TABLE inbox_message (
    consumer    VARCHAR(64)  COLLATE "C" NOT NULL,
    message_id  VARCHAR(704) COLLATE "C" NOT NULL,
    received_at TIMESTAMP(6) NOT NULL,
    CONSTRAINT inbox_message_pkey PRIMARY KEY (consumer, message_id)
)
""",
    "CREATE INDEX ix_inbox_message_received_at ON inbox_message (received_at)",
)


def _postgresql(database):
    return family_of(database).name == "postgresql"


def is_applied(database):
    """Whether the table exists (``outbox_lite.migrate`` then records this migration)."""
    if _postgresql(database):
        return bool(database.execute_sql(
            "SELECT to_regclass('inbox_message') IS NOT NULL").fetchone()[0])
    return bool(database.execute_sql(
        "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE()"
        " AND table_name = 'inbox_message'").fetchone())


def migrate(migrator, database, *, fake=False):
    for statement in POSTGRESQL if _postgresql(database) else (CREATE_INBOX_MESSAGE,):
        migrator.sql(statement)


def rollback(migrator, database, *, fake=False):
    migrator.sql("DROP TABLE inbox_message")
