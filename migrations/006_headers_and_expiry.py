"""Headers and expiry (SPEC §11): ``headers`` (JSON, NULL when none) and ``expires_at`` (an
instant, UTC, NULL: never) at the end of ``outbox_event``.

One DDL statement that changes only the table's metadata, so it takes milliseconds however
many rows there are, and writers go on:

* MySQL and MariaDB: ``ALGORITHM=INSTANT`` (MySQL 8.0.12+, MariaDB 10.3+), which refuses
  rather than copy the table on a server that cannot do it in place. Measured on 1,000,000
  rows with a writer inserting throughout (``scripts/bench.py migration``): 0.07-0.11 s, the
  writer's slowest INSERT meanwhile 49-63 ms.
* PostgreSQL: adding a nullable column without a default rewrites nothing (``json``, as the
  payload, and ``timestamp(6)`` holding UTC, as every instant).

What such a change still needs is a moment of the table's exclusive lock (MySQL's metadata
lock, PostgreSQL's ACCESS EXCLUSIVE): it waits for every transaction that has touched the
table, and writers that come after it wait behind it. So the session's lock wait is bounded to
5 seconds while it runs: behind a long transaction the migration fails (run it again) instead
of stopping every writer. The rollback drops both columns the same way (INSTANT on MySQL
8.0.29+ and MariaDB 10.4+).
"""

from outbox_lite._families import family_of

MIGRATE = ("ALTER TABLE outbox_event ADD COLUMN headers JSON NULL,"
           " ADD COLUMN expires_at DATETIME(6) NULL, ALGORITHM=INSTANT")
ROLLBACK = "ALTER TABLE outbox_event DROP COLUMN headers, DROP COLUMN expires_at, ALGORITHM=INSTANT"
LOCK_WAIT = ("SET SESSION lock_wait_timeout = 5", "SET SESSION lock_wait_timeout = DEFAULT")

POSTGRESQL_MIGRATE = ("ALTER TABLE outbox_event ADD COLUMN headers JSON NULL,"
                      " ADD COLUMN expires_at TIMESTAMP(6) NULL")
POSTGRESQL_ROLLBACK = "ALTER TABLE outbox_event DROP COLUMN headers, DROP COLUMN expires_at"
POSTGRESQL_LOCK_WAIT = ("SET lock_timeout = '5s'", "RESET lock_timeout")


def _postgresql(database):
    return family_of(database).name == "postgresql"


def _run(migrator, database, mysql, postgresql):
    bound, unbound = POSTGRESQL_LOCK_WAIT if _postgresql(database) else LOCK_WAIT
    migrator.sql(bound)
    migrator.sql(postgresql if _postgresql(database) else mysql)
    migrator.sql(unbound)


def is_applied(database):
    """Whether ``expires_at`` exists (the two columns come in one statement)."""
    schema = "current_schema()" if _postgresql(database) else "DATABASE()"
    return bool(database.execute_sql(
        f"SELECT 1 FROM information_schema.columns WHERE table_schema = {schema}"
        " AND table_name = 'outbox_event' AND column_name = 'expires_at'").fetchone())


def migrate(migrator, database, *, fake=False):
    _run(migrator, database, MIGRATE, POSTGRESQL_MIGRATE)


def rollback(migrator, database, *, fake=False):
    _run(migrator, database, ROLLBACK, POSTGRESQL_ROLLBACK)
