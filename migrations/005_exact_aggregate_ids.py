"""Aggregate ids and error codes compare exactly: ``aggregate_type``, ``aggregate_id`` and
``last_error_code`` become ``utf8mb4_bin``, as ``dedupe_key`` and ``locked_by`` are.

Under the table's ``utf8mb4_unicode_ci`` the ordered claim took ``Order-1`` and ``order-1``,
``cafe`` and ``café``, ``straße`` and ``strasse``, ``A1`` and ``Ａ１``, ``user-😀`` and
``user-🍕`` for one aggregate (one head between them; a dead letter of one held the other
back), and ``requeue``/``delete`` by error code took ``Timeout`` for ``timeout``.

One DDL statement (MySQL DDL is not transactional). The two servers change a collation
differently, so the statement says what each may do, and fails rather than lock more:

* MariaDB rebuilds the aggregate's two indexes in place and lets writers go on
  (``ALGORITHM=NOCOPY, LOCK=NONE``; 6-14 s for a million rows, measured on a small machine).
* MySQL copies the table (``ALGORITHM=COPY``), and writers wait until it is done
  (``LOCK=SHARED``: reads go on; 16-37 s for a million rows).

``is_applied`` tells ``outbox_lite.migrate`` whether the change is in place already (a run
that stopped between the DDL and its history row), so that it is recorded, not redone.

PostgreSQL compares with every built-in collation by bytes already; the columns become
``COLLATE "C"`` all the same, so that a database whose default is a nondeterministic ICU
collation cannot merge keys, and ordering is by bytes as on MySQL. The table is not rewritten
(the type stays), its indexes on those columns are rebuilt, writers waiting meanwhile.
"""

from outbox_lite._families import family_of

COLUMNS = (
    "MODIFY aggregate_type VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL,"
    " MODIFY aggregate_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL,"
    " MODIFY last_error_code VARCHAR(64) CHARACTER SET utf8mb4 COLLATE {collation} NULL"
)
ONLINE = {True: "ALGORITHM=NOCOPY, LOCK=NONE", False: "ALGORITHM=COPY, LOCK=SHARED"}


POSTGRESQL_COLUMNS = (
    "ALTER COLUMN aggregate_type TYPE VARCHAR(255) COLLATE {collation},"
    " ALTER COLUMN aggregate_id TYPE VARCHAR(255) COLLATE {collation},"
    " ALTER COLUMN last_error_code TYPE VARCHAR(64) COLLATE {collation}"
)


def _postgresql(database):
    return family_of(database).name == "postgresql"


def _alter(database, collation):
    if _postgresql(database):
        collation = '"C"' if collation == "utf8mb4_bin" else '"default"'
        return f"ALTER TABLE outbox_event {POSTGRESQL_COLUMNS.format(collation=collation)}"
    mariadb = "mariadb" in database.execute_sql("SELECT VERSION()").fetchone()[0].lower()
    columns = COLUMNS.format(collation=collation)
    return f"ALTER TABLE outbox_event {columns}, {ONLINE[mariadb]}"


def is_applied(database):
    if _postgresql(database):
        return bool(database.execute_sql(
            "SELECT 1 FROM pg_attribute AS a JOIN pg_collation AS c ON c.oid = a.attcollation"
            " WHERE a.attrelid = to_regclass('outbox_event') AND a.attname = 'aggregate_id'"
            " AND c.collname = 'C'").fetchone())
    return bool(database.execute_sql(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = DATABASE()"
        " AND table_name = 'outbox_event' AND column_name = 'aggregate_id'"
        " AND collation_name = 'utf8mb4_bin'").fetchone())


def migrate(migrator, database, *, fake=False):
    if not fake:
        migrator.sql(_alter(database, "utf8mb4_bin"))


def rollback(migrator, database, *, fake=False):
    if not fake:
        migrator.sql(_alter(database, "utf8mb4_unicode_ci"))
