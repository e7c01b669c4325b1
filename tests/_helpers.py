"""What the tests share, imported by them (``from _helpers import …``), never from conftest.

The server is read from one place, ``OUTBOX_TEST_DATABASE_URL``, whose scheme picks the family
(``mysql://`` for MySQL and MariaDB; ``postgresql://`` or ``postgres://`` for PostgreSQL), as
peewee's own ``tests/base.py`` picks its backend. :data:`FAMILY` is what the tests ask of that
family's server when they must know it: the DDL of the tests' own ``job`` table, a table's
schema as the catalog shows it, how to empty tables, a session's id, how long a lock wait may
last. Everything runs through a Peewee database's ``execute_sql``, so the tests name no driver.
Where servers differ a test asks (``FAMILY.name``, the ``server`` fixture) and states what each
must answer; none is skipped.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import threading
import time
from typing import Any, Callable, Iterator

import peewee as pw
from playhouse.pool import PooledMySQLDatabase

from outbox_lite import OutboxRepository
from outbox_lite._families.mysql import MySQLDatabase as QuietMySQLDatabase
from outbox_lite._families.url import DatabaseUrl


class OracleDatabase(pw.Database):
    """A Peewee database of no family outbox_lite knows (never opened): what the library
    must refuse with a TypeError naming it."""


URL_TEXT = os.environ.get("OUTBOX_TEST_DATABASE_URL",
                          "mysql://root@127.0.0.1:3306/outbox_lite_test")
TEST_URL = DatabaseUrl.parse(URL_TEXT)
T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)

__all__ = ["FAMILY", "T0", "TEST_URL", "FakeClock", "QuietMySQLDatabase",
           "QuietPooledMySQLDatabase", "capture_sql", "claim_all", "new_event", "rows_of",
           "run_threads", "seed"]


# ---------------------------------------------------------------------------
# The family of the test server
# ---------------------------------------------------------------------------

def rows_of(cursor: Any) -> list[dict[str, Any]]:
    """A driver cursor's rows as dicts by column name (the driver's own values); none for a
    statement that returns no rows (psycopg refuses fetchall() there, PyMySQL answers ())."""
    if cursor.description is None:
        return []
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


class MySQLFamily:
    """MySQL and MariaDB, as the tests see them."""

    name = "mysql"
    #: The scheme of the family's URLs, and the server's name in the library's messages.
    SCHEME = "mysql"
    SERVER_NAME = "MySQL"
    #: The tests' own business table, beside the outbox (a "business row").
    JOB_TABLE = "CREATE TABLE job (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(64) NOT NULL)"
    #: An id column that numbers itself, in a test's own tables.
    SERIAL_ID = "id BIGINT AUTO_INCREMENT PRIMARY KEY"
    #: The first word of the one statement that writes an event (create_in_transaction).
    WRITE_WORD = "INSERT"
    #: The server's clock in UTC, microseconds, as a DATETIME(6) column takes it.
    UTC_NOW = "UTC_TIMESTAMP(6)"
    #: A text column's clause that makes it compare exactly (byte for byte, case and accents).
    EXACT_TEXT = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    #: What sets the session's time zone to UTC+8.
    TIME_ZONE_PLUS_8 = "SET time_zone = '+08:00'"
    #: ``LockConflictError.errno`` of a lock wait that timed out, and of a deadlock.
    LOCK_WAIT = 1205
    DEADLOCK = 1213
    #: Whether a unique index's insert can wait on a *gap* (InnoDB's next-key and inherited
    #: gap locks, on MySQL and MariaDB alike): a key that is not the same one may wait.
    GAP_LOCKS = True

    @staticmethod
    def quote(identifier: str) -> str:
        return f"`{identifier}`"

    @staticmethod
    def limit_lock_waits(database: Any, seconds: int, *, metadata: bool = False) -> None:
        """A session's waits for a row lock (and with ``metadata``, for a table's metadata
        lock) end after ``seconds`` with the server's lock-wait error."""
        database.execute_sql(f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}")
        if metadata:
            database.execute_sql(f"SET SESSION lock_wait_timeout = {int(seconds)}")

    @staticmethod
    def session_id(database: Any) -> int:
        return int(database.execute_sql("SELECT CONNECTION_ID()").fetchone()[0])

    @staticmethod
    def error_code(exc: BaseException) -> Any:
        """The server's error number behind a Peewee or PyMySQL exception (None if none)."""
        args = getattr(exc, "args", ())
        return args[0] if args and isinstance(args[0], int) else None

    @staticmethod
    def interval(amount: str) -> str:
        """An interval literal: ``interval("10 DAY")`` (to add to or take from an instant)."""
        return f"INTERVAL {amount}"

    @staticmethod
    def seconds_from_now(column: str) -> str:
        """SQL: ``column`` (a UTC instant) minus the server's clock, in seconds."""
        return f"TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), {column}) / 1e6"

    #: What the library's read of the server's clock contains (the family's ``sql.NOW``).
    CLOCK_WORD = "UTC_TIMESTAMP"
    #: What the library's one check of its tables' columns reads (the family's SCHEMA_COLUMNS).
    CATALOG_WORD = "information_schema"

    @staticmethod
    def json_as_text(conn: Any) -> None:
        """Make the driver connection ``conn`` hand JSON columns back as the server's text
        (PyMySQL always does)."""

    @staticmethod
    def insert_id(database: Any, sql: str, params: Any = ()) -> int:
        """Run the INSERT ``sql`` of one row into a table whose key is ``id``; its id."""
        return int(database.execute_sql(sql, params).lastrowid)

    @staticmethod
    def isolation_options(level: str) -> dict[str, Any]:
        """``url.database(**…)`` options whose sessions start at isolation ``level`` (as a
        server default or the driver's options would make them)."""
        return {"init_command": f"SET SESSION TRANSACTION ISOLATION LEVEL {level}"}

    @staticmethod
    def multi_statements(url: Any) -> Any:
        """``url`` with the option that lets its connections send several statements in one
        packet (``multi_statements=true``: PyMySQL's ``CLIENT.MULTI_STATEMENTS``)."""
        from outbox_lite._families.url import DatabaseUrl
        text = url.secret_text()
        return DatabaseUrl.parse(text + ("&" if "?" in text else "?") + "multi_statements=true")

    @staticmethod
    def session_options(server: Any, isolation: str | None = None, wait: int | None = None,
                        ) -> dict[str, Any]:
        """``url.database(**…)`` options whose sessions start at ``isolation`` (when given) and
        wait at most ``wait`` s for a row lock (when given): one SET in ``init_command``, with
        the isolation variable the server knows (MariaDB 10.11 only ``tx_isolation``)."""
        settings = [f"{server.isolation_variable} = '{isolation}'"] if isolation else []
        settings += [f"innodb_lock_wait_timeout = {int(wait)}"] if wait is not None else []
        return {"init_command": f"SET SESSION {', '.join(settings)}"} if settings else {}

    @staticmethod
    def waits_for_lock(fetch: Callable[..., list[dict[str, Any]]], session: int) -> bool:
        """Whether ``session``'s transaction waits for a row lock now (INNODB_TRX, the same on
        both servers; InnoDB refreshes it when it was not read for 0.1 s: poll no faster)."""
        return innodb_trx(fetch, "SELECT trx_state AS state FROM information_schema.INNODB_TRX"
                          " WHERE trx_mysql_thread_id = %s", session) == [{"state": "LOCK WAIT"}]

    @staticmethod
    def kill_sql(session: int) -> str:
        """What ends another session (its connection) from an administrator's connection."""
        return f"KILL CONNECTION {int(session)}"

    #: The sessions connected to database %s but the asking one, as rows with ``id``.
    OTHER_SESSIONS = ("SELECT id FROM information_schema.processlist WHERE db = %s"
                      " AND id <> CONNECTION_ID()")
    #: Whether session %s is still connected (a row) or gone (none).
    SESSION_ALIVE = "SELECT id FROM information_schema.processlist WHERE id = %s"
    #: How many databases are named %s (0 or 1), asked on a server connection.
    DATABASE_COUNT = "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = %s"
    #: What a driver's error says when the server ended the connection under it.
    LOST_CONNECTION_WORDS = ("Lost connection", "gone away", "(0, '')")
    #: ``url.database(**…)`` options for a connection in plain text (tests/_proxy.py reads it).
    PLAIN_TEXT: dict[str, Any] = {"ssl_disabled": True}
    #: How long after a session's transaction the server's lock counters show it, at most.
    COUNTERS_LAG = 0.0

    @staticmethod
    def deadlocks(fetch: Callable[..., list[dict[str, Any]]]) -> int:
        """The server's deadlock count since it started (InnoDB's counter, all sessions)."""
        from outbox_lite._families.mysql_server import server_of
        query = lambda sql: [tuple(row.values()) for row in fetch(sql)]  # noqa: E731
        return int(server_of(query).lock_counters(query).deadlocks)

    @staticmethod
    def transaction_counters(database: Any) -> dict[str, int] | None:
        """The session's own counts of transaction statements (``Com_begin`` …), or None where
        the server keeps none per session (PostgreSQL)."""
        names = ("Com_begin", "Com_commit", "Com_rollback", "Com_savepoint",
                 "Com_rollback_to_savepoint", "Com_release_savepoint")
        rows = database.execute_sql("SHOW SESSION STATUS WHERE Variable_name IN (%s)"
                                    % ", ".join(["%s"] * len(names)), names).fetchall()
        return {name: int(value) for name, value in rows}

    @staticmethod
    def tables(database: Any) -> list[str]:
        cursor = database.execute_sql(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()")
        return sorted(str(name) for (name,) in cursor.fetchall())

    @classmethod
    def schema_of(cls, database: Any) -> dict[str, str]:
        """Each table's SHOW CREATE TABLE, without its AUTO_INCREMENT counter."""
        shown = {}
        for table in cls.tables(database):
            text = database.execute_sql(f"SHOW CREATE TABLE {cls.quote(table)}").fetchone()[1]
            shown[table] = re.sub(r" AUTO_INCREMENT=\d+", "", text)
        return shown

    @staticmethod
    def columns(fetch: Callable[..., list[dict[str, Any]]], table: str) -> list[dict[str, Any]]:
        """``table``'s columns in order: ``name``, ``type`` (as information_schema's
        column_type shows it, lower case), ``nullable`` (YES/NO) and ``coll`` (the collation,
        None for a column without one). Aliased lower-case names: information_schema answers in
        upper case on MySQL."""
        rows = fetch("SELECT column_name AS name, column_type AS type, is_nullable AS nullable,"
                     " collation_name AS coll FROM information_schema.columns"
                     " WHERE table_schema = DATABASE() AND table_name = %s"
                     " ORDER BY ordinal_position", table)
        return [{**row, "type": row["type"].lower()} for row in rows]

    @staticmethod
    def indexes(fetch: Callable[..., list[dict[str, Any]]], table: str,
                ) -> dict[str, tuple[bool, list[str]]]:
        """``table``'s indexes: name -> (unique, its columns in order). The primary key is
        ``PRIMARY`` here."""
        found: dict[str, tuple[bool, list[str]]] = {}
        for row in fetch("SELECT index_name AS name, non_unique AS non_unique,"
                         " column_name AS col FROM information_schema.statistics"
                         " WHERE table_schema = DATABASE() AND table_name = %s"
                         " ORDER BY index_name, seq_in_index", table):
            found.setdefault(row["name"], (not int(row["non_unique"]), []))[1].append(row["col"])
        return found

    #: The primary key's index name in :meth:`indexes` for ``table``.
    @staticmethod
    def primary_key(table: str) -> str:
        return "PRIMARY"

    @staticmethod
    def foreign_keys(fetch: Callable[..., list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return fetch("SELECT constraint_name AS name"
                     " FROM information_schema.referential_constraints"
                     " WHERE constraint_schema = DATABASE()")

    @staticmethod
    def triggers(fetch: Callable[..., list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return fetch("SELECT trigger_name AS name FROM information_schema.triggers"
                     " WHERE trigger_schema = DATABASE()")

    @classmethod
    def truncate(cls, database: Any, tables: list[str]) -> None:
        """Empty ``tables`` and start their ids again from 1."""
        for table in tables:
            database.execute_sql(f"TRUNCATE TABLE {cls.quote(table)}")

    @staticmethod
    def database_class() -> Any:
        """Peewee's database class as a service uses it (connecting with PyMySQL's
        database=, so that Peewee 3's deprecated db= does not fail the run)."""
        return QuietMySQLDatabase

    @staticmethod
    def pooled_class() -> Any:
        return QuietPooledMySQLDatabase

    @staticmethod
    def rollback_error_on_a_dead_connection(database: Any) -> Any:
        """What Peewee's ROLLBACK raises on a connection the server closed (atomic()'s end)."""
        import peewee
        return peewee.InterfaceError

    @staticmethod
    def lost_connection_error() -> Exception:
        """What Peewee raises when the connection died under a statement (a COMMIT)."""
        import peewee
        return peewee.OperationalError(2013, "Lost connection to MySQL server during query")

    @staticmethod
    def server(query: Callable[[str], Any]) -> Any:
        """The server behind ``query(sql) -> rows``: what differs between MariaDB and MySQL."""
        from outbox_lite._families.mysql_server import server_of
        return server_of(query)


class PostgreSQLFamily:
    """PostgreSQL 15+, as the tests see it (see /work/team/pg-findings.md for why each is so)."""

    name = "postgresql"
    SCHEME = "postgresql"
    SERVER_NAME = "PostgreSQL"
    JOB_TABLE = "CREATE TABLE job (id BIGSERIAL PRIMARY KEY, name VARCHAR(64) NOT NULL)"
    SERIAL_ID = "id BIGSERIAL PRIMARY KEY"
    #: INSERT … [ON CONFLICT (dedupe_key) DO NOTHING] RETURNING id, pg_notify(…): the write
    #: and its wake-up in one statement.
    WRITE_WORD = "INSERT"
    UTC_NOW = "(now() AT TIME ZONE 'UTC')"
    EXACT_TEXT = 'COLLATE "C"'
    TIME_ZONE_PLUS_8 = "SET TIME ZONE 'Asia/Shanghai'"
    LOCK_WAIT = "55P03"  # lock_not_available (lock_timeout)
    DEADLOCK = "40P01"  # deadlock_detected
    #: No gap locks: a unique index's insert waits only for an uncommitted row of its own key.
    GAP_LOCKS = False

    @staticmethod
    def quote(identifier: str) -> str:
        return '"' + identifier.replace('"', '""') + '"'

    @staticmethod
    def limit_lock_waits(database: Any, seconds: int, *, metadata: bool = False) -> None:
        """``lock_timeout`` bounds every lock wait (rows and tables alike): 55P03 after it."""
        database.execute_sql(f"SET lock_timeout = '{int(seconds)}s'")

    @staticmethod
    def session_id(database: Any) -> int:
        return int(database.execute_sql("SELECT pg_backend_pid()").fetchone()[0])

    @staticmethod
    def error_code(exc: BaseException) -> Any:
        """The SQLSTATE of the driver's error behind a Peewee exception (its ``__context__``:
        Peewee re-raises with the message only) or of a driver's own."""
        for error in (exc, exc.__context__):
            code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
            if code:
                return code
        return None

    @staticmethod
    def interval(amount: str) -> str:
        return f"INTERVAL '{amount}'"

    @staticmethod
    def seconds_from_now(column: str) -> str:
        return f"EXTRACT(EPOCH FROM {column} - (now() AT TIME ZONE 'UTC'))"

    CLOCK_WORD = "clock_timestamp"  # SELECT clock_timestamp() AT TIME ZONE 'UTC'
    CATALOG_WORD = "pg_catalog.pg_attribute"

    @staticmethod
    def json_as_text(conn: Any) -> None:
        """psycopg 3 and psycopg2 decode json and jsonb themselves: here they hand back the
        text, as PyMySQL does, so a test reads what the server stored."""
        if type(conn).__module__.startswith("psycopg2"):
            import psycopg2.extras
            psycopg2.extras.register_default_json(conn, loads=lambda text: text)
            psycopg2.extras.register_default_jsonb(conn, loads=lambda text: text)
        else:
            from psycopg.types.string import TextLoader
            conn.adapters.register_loader("json", TextLoader)
            conn.adapters.register_loader("jsonb", TextLoader)

    @staticmethod
    def insert_id(database: Any, sql: str, params: Any = ()) -> int:
        return int(database.execute_sql(f"{sql} RETURNING id", params).fetchone()[0])

    @staticmethod
    def isolation_options(level: str) -> dict[str, Any]:
        """libpq's ``options``: the setting for the session, before its first statement."""
        value = level.lower().replace(" ", "\\ ")
        return {"options": f"-c default_transaction_isolation={value}"}

    @staticmethod
    def multi_statements(url: Any) -> Any:
        """``url`` itself: psycopg has no switch for several statements in one packet, and
        the write is one statement at every level without it."""
        return url

    @staticmethod
    def session_options(server: Any, isolation: str | None = None, wait: int | None = None,
                        ) -> dict[str, Any]:
        """libpq's ``options``: ``default_transaction_isolation`` and ``lock_timeout``."""
        settings = []
        if isolation:
            value = isolation.lower().replace(" ", "\\ ")
            settings.append(f"-c default_transaction_isolation={value}")
        if wait is not None:
            settings.append(f"-c lock_timeout={int(wait)}s")
        return {"options": " ".join(settings)} if settings else {}

    @staticmethod
    def waits_for_lock(fetch: Callable[..., list[dict[str, Any]]], session: int) -> bool:
        return fetch("SELECT wait_event_type AS kind FROM pg_stat_activity WHERE pid = %s",
                     session) == [{"kind": "Lock"}]

    @staticmethod
    def kill_sql(session: int) -> str:
        return f"SELECT pg_terminate_backend({int(session)})"

    OTHER_SESSIONS = ("SELECT pid AS id FROM pg_stat_activity WHERE datname = %s"
                      " AND pid <> pg_backend_pid()")
    SESSION_ALIVE = "SELECT pid AS id FROM pg_stat_activity WHERE pid = %s"
    DATABASE_COUNT = "SELECT COUNT(*) FROM pg_database WHERE datname = %s"
    LOST_CONNECTION_WORDS = ("terminating connection", "server closed the connection",
                             "connection is closed", "connection already closed")
    COUNTERS_LAG = 2.0
    PLAIN_TEXT: dict[str, Any] = {}  # tests/_proxy.py answers the client's SSLRequest "N"

    @staticmethod
    def deadlocks(fetch: Callable[..., list[dict[str, Any]]]) -> int:
        """The database's deadlock count (pg_stat_database; a backend reports it when it
        flushes its statistics: at its transaction's end at most once a second, and when it
        exits, so a test polls for it)."""
        return int(fetch("SELECT deadlocks AS n FROM pg_stat_database"
                         " WHERE datname = current_database()")[0]["n"])

    @staticmethod
    def transaction_counters(database: Any) -> dict[str, int] | None:
        """None: PostgreSQL counts transactions per database (pg_stat_database), not per
        session, and late (flushed at most once a second)."""
        return None

    @staticmethod
    def tables(database: Any) -> list[str]:
        cursor = database.execute_sql(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = current_schema()")
        return sorted(str(name) for (name,) in cursor.fetchall())

    @classmethod
    def schema_of(cls, database: Any) -> dict[str, str]:
        """Each table as the catalog shows it: its columns (type, NOT NULL, default,
        collation), its constraints and its indexes. Sequence positions are not part of it."""
        shown = {}
        for table in cls.tables(database):
            columns = database.execute_sql(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
                " pg_get_expr(d.adbin, d.adrelid), co.collname"
                " FROM pg_attribute a"
                " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
                " LEFT JOIN pg_collation co ON co.oid = a.attcollation"
                "  AND a.attcollation <> (SELECT oid FROM pg_collation WHERE collname = 'default')"
                " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped"
                " ORDER BY a.attnum", (cls.quote(table),)).fetchall()
            constraints = database.execute_sql(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = %s::regclass ORDER BY conname", (cls.quote(table),)).fetchall()
            indexes = database.execute_sql(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()"
                " AND tablename = %s ORDER BY indexname", (table,)).fetchall()
            lines = [f"{name} {kind}{' NOT NULL' if not_null else ''}"
                     f"{f' DEFAULT {default}' if default else ''}"
                     f"{f' COLLATE {collation}' if collation else ''}"
                     for name, kind, not_null, default, collation in columns]
            lines += [f"CONSTRAINT {name} {definition}" for name, definition in constraints]
            lines += [definition for (definition,) in indexes]
            shown[table] = "\n".join(lines)
        return shown

    @staticmethod
    def columns(fetch: Callable[..., list[dict[str, Any]]], table: str) -> list[dict[str, Any]]:
        """As on MySQL, the type as ``format_type`` shows it (``character varying(255)``,
        ``timestamp(6) without time zone``), the collation only where it is not the
        database's default."""
        return fetch(
            "SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type,"
            " CASE WHEN a.attnotnull THEN 'NO' ELSE 'YES' END AS nullable,"
            " CASE WHEN a.attcollation = 0 OR co.collname = 'default' THEN NULL"
            "  ELSE co.collname END AS coll"
            " FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation"
            " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped"
            " ORDER BY a.attnum", PostgreSQLFamily.quote(table))

    @staticmethod
    def indexes(fetch: Callable[..., list[dict[str, Any]]], table: str,
                ) -> dict[str, tuple[bool, list[str]]]:
        """The primary key is ``<table>_pkey`` here."""
        found: dict[str, tuple[bool, list[str]]] = {}
        for row in fetch(
                "SELECT i.relname AS name, ix.indisunique AS uniq, a.attname AS col"
                " FROM pg_index ix JOIN pg_class i ON i.oid = ix.indexrelid"
                " CROSS JOIN LATERAL unnest(ix.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)"
                " JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.attnum"
                " WHERE ix.indrelid = to_regclass(%s) ORDER BY i.relname, k.ord",
                PostgreSQLFamily.quote(table)):
            found.setdefault(row["name"], (bool(row["uniq"]), []))[1].append(row["col"])
        return found

    @staticmethod
    def primary_key(table: str) -> str:
        return f"{table}_pkey"

    @staticmethod
    def foreign_keys(fetch: Callable[..., list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return fetch("SELECT conname AS name FROM pg_constraint WHERE contype = 'f'"
                     " AND connamespace = current_schema()::regnamespace")

    @staticmethod
    def triggers(fetch: Callable[..., list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return fetch("SELECT tgname AS name FROM pg_trigger WHERE NOT tgisinternal")

    @classmethod
    def truncate(cls, database: Any, tables: list[str]) -> None:
        if tables:
            database.execute_sql(
                f"TRUNCATE TABLE {', '.join(map(cls.quote, tables))} RESTART IDENTITY")

    @staticmethod
    def database_class() -> Any:
        """Peewee's PostgresqlDatabase (Peewee 4: psycopg2 when installed, else psycopg 3;
        Peewee 3 without psycopg2: playhouse.psycopg3_ext's Psycopg3Database)."""
        import peewee
        if _peewee3_without_psycopg2():
            from playhouse.psycopg3_ext import Psycopg3Database  # type: ignore
            return Psycopg3Database
        return peewee.PostgresqlDatabase

    @staticmethod
    def rollback_error_on_a_dead_connection(database: Any) -> Any:
        """psycopg2: InterfaceError "connection already closed"; psycopg 3: OperationalError
        "the connection is closed" (pg-findings.md §4)."""
        import peewee
        return peewee.InterfaceError if driver_of(database) == "psycopg2" else (
            peewee.OperationalError)

    @staticmethod
    def lost_connection_error() -> Exception:
        import peewee
        return peewee.OperationalError("server closed the connection unexpectedly")

    @staticmethod
    def pooled_class() -> Any:
        if _peewee3_without_psycopg2():
            from playhouse.psycopg3_ext import PooledPsycopg3Database  # type: ignore
            return PooledPsycopg3Database
        from playhouse.pool import PooledPostgresqlDatabase
        return PooledPostgresqlDatabase

    @staticmethod
    def server(query: Callable[[str], Any]) -> Any:
        return PostgreSQLServer(str(query("SELECT version()")[0][0]))


def driver_of(database: Any) -> str:
    """The PostgreSQL driver a Peewee database connects with: ``psycopg2`` or ``psycopg``
    (Peewee 4 names it by its adapter; Peewee 3 by the class, playhouse.psycopg3_ext's)."""
    adapter = getattr(database, "_adapter", None)
    if adapter is not None:
        return "psycopg2" if "Psycopg2" in type(adapter).__name__ else "psycopg"
    return "psycopg" if "Psycopg3" in "".join(c.__name__ for c in type(database).__mro__) else (
        "psycopg2")


def _peewee3_without_psycopg2() -> bool:
    """Peewee 3's PostgresqlDatabase is psycopg2's only: with psycopg 3 alone a service uses
    playhouse.psycopg3_ext (gone in Peewee 4, whose PostgresqlDatabase takes either)."""
    import importlib.util

    import peewee
    return (int(peewee.__version__.split(".")[0]) < 4
            and importlib.util.find_spec("psycopg2") is None)


class PostgreSQLServer:
    """A PostgreSQL server as ``SELECT version()`` describes it (``PostgreSQL 15.20 (Debian …``)."""

    is_mariadb = False
    kind = "PostgreSQL"
    #: The payload column is ``json``: the text outbox_lite wrote, kept byte for byte.
    keeps_json_text = True

    def __init__(self, version_text: str) -> None:
        self.version_text = version_text

    @property
    def version(self) -> tuple[int, int]:
        match = re.search(r"PostgreSQL (\d+)\.(\d+)", self.version_text)
        if match is None:
            raise ValueError(f"cannot read a version from {self.version_text!r}")
        return int(match[1]), int(match[2])

    def __str__(self) -> str:
        return f"PostgreSQL {'.'.join(map(str, self.version))}"


_FAMILIES = {"mysql": MySQLFamily, "postgresql": PostgreSQLFamily, "postgres": PostgreSQLFamily}
_SCHEME = URL_TEXT.partition("://")[0].lower()
if _SCHEME not in _FAMILIES:
    raise RuntimeError(f"OUTBOX_TEST_DATABASE_URL: unknown scheme {_SCHEME!r} "
                       "(mysql://, postgresql:// or postgres://)")
#: The family of ``OUTBOX_TEST_DATABASE_URL``'s server.
FAMILY: Any = _FAMILIES[_SCHEME]


class QuietPooledMySQLDatabase(PooledMySQLDatabase, QuietMySQLDatabase):
    """PooledMySQLDatabase connecting with PyMySQL's database= keyword, as the library's own
    databases do (outbox_lite/_families/mysql.py): Peewee 3's db= would be a DeprecationWarning, which
    fails the run. How it pools and reconnects is Peewee's, unchanged."""


# ---------------------------------------------------------------------------
# Time, events, threads, statements
# ---------------------------------------------------------------------------

class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: dt.datetime = T0) -> None:
        self.now = now
        self._lock = threading.Lock()

    def __call__(self) -> dt.datetime:
        with self._lock:
            return self.now

    def advance(self, **delta: float) -> dt.datetime:
        with self._lock:
            self.now += dt.timedelta(**delta)
            return self.now


class _SpyCursor:
    """A driver cursor that reports each statement before running it."""

    def __init__(self, cursor: Any, report: Callable[[str, Any], None]) -> None:
        self._cursor = cursor
        self._report = report

    def execute(self, sql: str, params: Any = None) -> Any:
        self._report(sql, params)
        return self._cursor.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)


@contextlib.contextmanager
def capture_sql(database: Any, before: Callable[[str, Any], None] | None = None,
                ) -> Iterator[list[tuple[str, Any]]]:
    """Yield a list that receives ``(sql, params)`` for every statement run on ``database``.

    Works on Peewee 3 and 4 alike: it wraps the driver cursors ``database.cursor()`` hands
    out, the one path every statement takes (queries, ``execute_sql``, ``BEGIN``, from any
    thread). ``before(sql, params)``, if given, runs just before each statement; what it runs
    itself on ``database`` is neither recorded nor passed to it again.
    """
    statements: list[tuple[str, Any]] = []
    inside = threading.local()

    def report(sql: str, params: Any) -> None:
        if getattr(inside, "active", False):
            return
        statements.append((sql, params))
        if before is not None:
            inside.active = True
            try:
                before(sql, params)
            finally:
                inside.active = False

    shadowed = "cursor" in vars(database)  # an outer spy's, when spies nest
    cursor = database.cursor
    database.cursor = lambda *args, **kwargs: _SpyCursor(cursor(*args, **kwargs), report)
    try:
        yield statements
    finally:
        if shadowed:
            database.cursor = cursor
        else:
            del database.cursor  # back to the class's own method


@contextlib.contextmanager
def migrated_database(url: DatabaseUrl) -> Iterator[Any]:
    """A database made afresh for ``url`` and migrated, dropped when the block ends."""
    from outbox_lite import migrate as schema
    url.drop_database()
    url.create_database()
    database = url.database()
    schema.migrate(database)
    try:
        yield database
    finally:
        database.close()
        url.drop_database()


def new_event(repo: OutboxRepository, n: int = 0, **overrides: Any) -> Any:
    """Create one event in a transaction of its own."""
    fields = dict(event_type="job.created", aggregate_type="ai_job", aggregate_id=str(n),
                  payload={"n": n})
    fields.update(overrides)
    with repo.database.atomic():
        return repo.create_in_transaction(**fields)


def seed(repo: OutboxRepository, count: int, **overrides: Any) -> list[int]:
    """Create ``count`` events in one transaction (the n-th of aggregate ``ai_job:n`` unless
    ``overrides`` say otherwise); returns their ids."""
    with repo.database.atomic():
        return [repo.create_in_transaction(**{
                    "event_type": "job.created", "aggregate_type": "ai_job",
                    "aggregate_id": str(n), "payload": {"n": n}, **overrides}).id
                for n in range(count)]


def claim_all(repo: OutboxRepository, worker: str, count: int) -> list[int]:
    """Seed ``count`` events and claim them all for ``worker``; returns their ids."""
    seed(repo, count)
    with repo.database.atomic():
        return [e.id for e in repo.claim_batch(worker, limit=count)]


def run_threads(count: int, target: Callable[[int], Any], database: Any = None,
                ) -> tuple[list[Any], list[BaseException]]:
    """Start ``count`` threads released together by a Barrier; return results and errors.

    Each thread has its own connection to ``database`` (Peewee's are per thread) and closes
    it at the end.
    """
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []
    lock = threading.Lock()

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - collected for the main thread
            with lock:
                errors.append(exc)
        finally:
            if database is not None and not database.is_closed():
                database.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return results, errors


# --- pg-server ---
# What the server-specific tests (autocommit, packet limit, charset, spy, plans …) ask a server
# of either family past the library: committed state on a connection of their own, and how a
# session's transaction stands.

def committed(url: DatabaseUrl, sql: str, *params: Any) -> list[dict[str, Any]]:
    """Run ``sql`` on a new connection to ``url``'s database that commits each statement
    (MySQL: ``SET autocommit = 1`` first, whatever the server's default and the handshake
    say; PostgreSQL: the driver's autocommit, Peewee's), rows as dicts, JSON as text."""
    database = url.database()
    try:
        FAMILY.json_as_text(database.connection())
        if FAMILY.name == "mysql":
            database.execute_sql("SET autocommit = 1")
        return rows_of(database.execute_sql(sql, params))
    finally:
        database.close()


_innodb_trx_lock = threading.Lock()
_innodb_trx_read_at = [0.0]


def innodb_trx(fetch: Callable[..., list[dict[str, Any]]], sql: str, *params: Any
               ) -> list[dict[str, Any]]:
    """``fetch(sql, *params)`` of a query on INNODB_TRX, answered from a fresh snapshot.

    InnoDB answers INNODB_TRX from a cache it refills only when nobody has read it for 0.1 s,
    and MySQL 8+ stamps every read (MariaDB stamps each refill): reads less than 0.1 s apart,
    from two threads or one loop, get the same old snapshot forever (CI saw a committed
    transaction listed for 2 s that way). So this process reads it one at a time, 0.12 s
    after the last read ended."""
    with _innodb_trx_lock:
        time.sleep(max(0.0, _innodb_trx_read_at[0] + 0.12 - time.monotonic()))
        try:
            return fetch(sql, *params)
        finally:
            _innodb_trx_read_at[0] = time.monotonic()


def transaction_state(fetch: Callable[..., list[dict[str, Any]]], session: int) -> str:
    """Whether ``session`` (a MySQL connection id, a PostgreSQL backend pid) has a transaction
    open now, asked from another session: ``"idle"`` or ``"in transaction"``. MySQL: a row
    in INNODB_TRX (a transaction that has read or written InnoDB; a fresh snapshot,
    :func:`innodb_trx`); PostgreSQL: its pg_stat_activity state (``idle in transaction``,
    aborted or not; the backend reports it before it answers its client)."""
    if FAMILY.name == "mysql":
        rows = innodb_trx(fetch, "SELECT COUNT(*) AS n FROM information_schema.INNODB_TRX"
                                 " WHERE trx_mysql_thread_id = %s", session)
        return "in transaction" if int(rows[0]["n"]) else "idle"
    [row] = fetch("SELECT state FROM pg_stat_activity WHERE pid = %s", session)
    return "in transaction" if row["state"].startswith("idle in transaction") else str(row["state"])


def sqlstate_or_errno(fn: Callable[[], Any]) -> Any:
    """The server's error code (MySQL errno, PostgreSQL SQLSTATE) of what ``fn()`` raises."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the code is the answer
        return FAMILY.error_code(exc)
    raise AssertionError("no error")


# --- pg-grants ---
# Logins and their grants, as each family writes them. MySQL's accounts are user@host, and a
# grant names its database; PostgreSQL's roles are the whole server's, a grant on a table is
# made on a connection to the table's database, and a role that holds a grant (or owns
# something) in a database cannot be dropped before it is revoked there.

def _rows(cursor: Any) -> list[tuple[Any, ...]]:
    return [] if cursor.description is None else [tuple(row) for row in cursor.fetchall()]


def as_admin(url: Any, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` as the test server's administrator (``url``'s user) on ``url``'s database
    (on MySQL, and for ``url=None``, the server's: name the database in ``sql``); its rows."""
    if url is None or FAMILY.name == "mysql":
        url = url or TEST_URL
        conn = url.server_connection()
        try:
            cur = conn.cursor()
            cur.execute(sql, params or None)
            return _rows(cur)
        finally:
            conn.close()
    database = url.database()
    try:
        return _rows(database.execute_sql(sql, params or None))
    finally:
        database.close()


def login_name(user: str) -> str:
    """How a statement names the test's login ``user``: ``'user'@'127.0.0.1'`` on MySQL (the
    tests log in over TCP to 127.0.0.1), the role ``"user"`` on PostgreSQL."""
    return f"'{user}'@'127.0.0.1'" if FAMILY.name == "mysql" else FAMILY.quote(user)


def create_login(user: str, password: str) -> None:
    """A login ``user`` with ``password`` and no privilege (one left by an earlier run is
    dropped first). PostgreSQL takes no parameter in CREATE ROLE: the server quotes both
    (format's %I and %L) and the statement it made is run."""
    drop_login(user)
    if FAMILY.name == "mysql":
        as_admin(None, f"CREATE USER {login_name(user)} IDENTIFIED BY %s", password)
        return
    [(statement,)] = as_admin(None, "SELECT format('CREATE ROLE %%I LOGIN PASSWORD %%L',"
                                        " %s::text, %s::text)", user, password)
    as_admin(None, statement)


def drop_login(user: str, *urls: Any) -> None:
    """Drop the login ``user`` if it exists. On PostgreSQL its grants (and what it owns) in
    each of ``urls``' databases that exists are revoked (handed to the administrator) first,
    and so is what it owns server-wide (a database)."""
    if FAMILY.name == "mysql":
        as_admin(None, f"DROP USER IF EXISTS {login_name(user)}")
        return
    if not as_admin(None, "SELECT 1 FROM pg_roles WHERE rolname = %s", user):
        return
    role = login_name(user)
    for url in urls:
        if as_admin(None, "SELECT 1 FROM pg_database WHERE datname = %s", url.name):
            as_admin(url, f"REASSIGN OWNED BY {role} TO CURRENT_USER")
            as_admin(url, f"DROP OWNED BY {role}")
    as_admin(None, f"REASSIGN OWNED BY {role} TO CURRENT_USER")
    as_admin(None, f"DROP OWNED BY {role}")
    as_admin(None, f"DROP ROLE IF EXISTS {role}")


def grant(privileges: str, url: Any, table: str, user: str) -> None:
    """GRANT ``privileges`` on ``table`` of ``url``'s database to the login ``user``."""
    if FAMILY.name == "mysql":
        as_admin(url, f"GRANT {privileges} ON {FAMILY.quote(url.name)}.{FAMILY.quote(table)}"
                      f" TO {login_name(user)}")
    else:
        as_admin(url, f"GRANT {privileges} ON TABLE {FAMILY.quote(table)} TO {login_name(user)}")


def let_migrate(url: Any, user: str) -> None:
    """Give the login ``user`` what the grants page gives the migrator on ``url``'s database
    (which exists): MySQL, CREATE, ALTER, INDEX, DROP and DML on ``db``.*; PostgreSQL, the
    database itself (its owner owns its schema public, PostgreSQL 15+, and may create in it)."""
    if FAMILY.name == "mysql":
        as_admin(url, "GRANT CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE ON"
                      f" {FAMILY.quote(url.name)}.* TO {login_name(user)}")
    else:
        as_admin(None, f"ALTER DATABASE {FAMILY.quote(url.name)} OWNER TO {login_name(user)}")


def url_as(url: Any, user: str, password: str) -> str:
    """``url`` logged in as ``user`` with ``password``: the full text (password included), for
    a child process or ``DatabaseUrl.parse``."""
    import dataclasses
    return dataclasses.replace(url, user=user, password=password).secret_text()
