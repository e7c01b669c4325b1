"""The PostgreSQL family: PostgreSQL 15+ through psycopg 3 or psycopg2 (whichever the Peewee
database uses: ``PostgresqlDatabase``, pooled, ``PostgresqlExtDatabase``, psycopg 3's).

Here: the database check, SQLSTATEs and what each means (a driver error at connect carries
none: its text says), the write of an event (``INSERT … ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id``, which never sends the duplicate to the server as an error, with
``pg_notify('outbox_event', '')`` in the same statement), the session question (isolation,
encodings), the schema the tables must have, the ``postgresql://`` URL, creating and dropping
a database, and the LISTEN wake-up. The statements are in :mod:`.postgresql_sql`. Every
difference from MySQL found so far is in /work/team/pg-notes.md and the README.
"""

from __future__ import annotations

import importlib
import re
import select
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import peewee as pw

from ..errors import DuplicateEventError, InvalidEventError, LockConflictError
from . import postgresql_sql as sql
from .contract import Column, Family, LockCounters, SessionAnswer
from .contract import clock_middle as _middle
from .url import DatabaseUrl, DatabaseUrlError, text_option

# ---------------------------------------------------------------------------
# The driver's errors
# ---------------------------------------------------------------------------

UNIQUE_VIOLATION = "23505"
#: Deadlock, lock not available (NOWAIT, lock_timeout), serialization failure.
LOCK_CONFLICTS = frozenset({"40P01", "55P03", "40001"})
UNDEFINED_TABLE, INSUFFICIENT_PRIVILEGE = "42P01", "42501"
DUPLICATE_DATABASE, INVALID_CATALOG_NAME = "42P04", "3D000"
INVALID_PASSWORD, INVALID_AUTHORIZATION = "28P01", "28000"
#: The server ended the session (admin shutdown, crash shutdown) or is starting or full.
_ENDED = frozenset({"57P01", "57P02"})
_GOING = frozenset({"57P03", "53300"})
#: What a driver error at connect (no SQLSTATE) says when the server cannot be reached.
_UNREACHABLE_WORDS = ("connection refused", "could not connect", "timeout expired",
                      "could not translate host name", "failed to resolve host",
                      "no route to host", "network is unreachable", "connection timed out",
                      "name or service not known")
_UNKNOWN_HOST_WORDS = ("could not translate host name", "failed to resolve host",
                       "name or service not known")
_NO_TLS_WORDS = ("server does not support ssl",)
#: A server that answers but cannot take writes (SPEC §12: the wrong host): a write refused
#: in a read-only transaction (a standby in recovery, default_transaction_read_only), and
#: libpq's words when no host of a URL's list is read-write (target_session_attrs).
READ_ONLY_TRANSACTION = "25006"
_READ_ONLY_WORDS = ("session is read-only", "server is in hot standby mode",
                    "connection is read-only")
#: libpq's words for a TLS connection whose certificate check failed (no SQLSTATE, no
#: ssl.SSLError: the drivers raise OperationalError with libpq's text), and what to change.
_CA_HINT = "sslrootcert must name the CA file that signed the server's certificate"
_TLS_FAILURES = (
    (re.compile(r"ssl error: (certificate verify failed)", re.I), _CA_HINT),
    (re.compile(r'(root certificate file "[^"]*" does not exist)', re.I), _CA_HINT),
    (re.compile(r'(server certificate for "[^"]*"(?: \(and \d+ other names?\))? does not match'
                r' host name "[^"]*")', re.I),
     "sslmode=verify-full needs a certificate issued for the URL's host"),
)
_RELATION_RE = re.compile(r'relation "([^"]+)" does not exist')
_DENIED_RE = re.compile(r"permission denied for (?:table|relation) (\S+)")
#: DDL on a table (ALTER, DROP, CREATE INDEX) is its owner's alone: no privilege grants it.
_NOT_OWNER_RE = re.compile(r"must be owner of (?:table|relation|index) (\S+)")


def _is_driver_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("psycopg", "psycopg2", "psycopg_binary")


def driver_error(exc: BaseException | None) -> BaseException | None:
    """The psycopg (3 or 2) error behind a Peewee exception (Peewee passes it as its first
    argument and chains it), or None when ``exc`` is not one of theirs."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        cause = todo.pop(0)
        if cause is None or any(cause is s for s in seen) or len(seen) > 8:
            continue
        seen.append(cause)
        if _is_driver_error(cause):
            return cause
        args = getattr(cause, "args", ())
        todo += [a for a in args[:1] if isinstance(a, BaseException)]
        todo += [getattr(cause, "orig", None), cause.__cause__, cause.__context__]
    return None


def sqlstate_of(exc: BaseException | None) -> str | None:
    """The SQLSTATE of the driver error behind ``exc`` (None at connect, or not PostgreSQL's)."""
    error = driver_error(exc)
    if error is None:
        return None
    return getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)


def tls_why(exc: BaseException | None) -> str | None:
    """Why the certificate check of a TLS connection failed, in one line with what to
    change, when libpq's text behind ``exc`` says it did; else None."""
    error = driver_error(exc)
    if error is None:
        return None
    text = _first_line(error)
    for pattern, hint in _TLS_FAILURES:
        found = pattern.search(text)
        if found:
            return f"{found[1]} ({hint})"
    return None


def _first_line(exc: BaseException | None) -> str:
    error = driver_error(exc) or exc
    text = str(error).strip()
    return text.splitlines()[0].strip() if text else type(error).__name__


def _encoding_name(encoding: Any) -> str:
    """An encoding's name as the server gives it (SQL_ASCII's setting comes from psycopg 3 as
    bytes)."""
    if isinstance(encoding, (bytes, bytearray)):
        return bytes(encoding).decode("ascii", "replace")
    return str(encoding)


def _is_utf8(encoding: str) -> bool:
    return encoding.upper().replace("-", "") == "UTF8"


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Server:
    """A PostgreSQL server, as ``server_version`` describes it (e.g. ``15.20 (Debian …)``)."""

    version_text: str
    is_mariadb = False
    kind = "PostgreSQL"

    @property
    def version(self) -> tuple[int, int, int]:
        match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", self.version_text)
        if match is None:
            raise ValueError(f"cannot read a version from {self.version_text!r}")
        return tuple(int(part or 0) for part in match.groups())  # type: ignore[return-value]

    def __str__(self) -> str:
        return f"PostgreSQL {'.'.join(map(str, self.version[:2]))}"


# ---------------------------------------------------------------------------
# The family
# ---------------------------------------------------------------------------

_EXACT = 'COLLATE "C"'
_INSTANT = "timestamp(6) without time zone"
_PRECISION_RE = re.compile(r"\((\d+)\)")
#: Why a ``timestamptz`` column will not do: the library writes and reads naive UTC instants,
#: which such a column takes as times of the session's TimeZone (stored shifted by its offset,
#: read back as that zone's wall time, a wrong instant); right only in sessions on UTC.
_ZONED = ("the library's UTC instants would be taken as times of the session's TimeZone: "
          "stored and read back shifted by its offset in any zone but UTC")
#: Why a ``jsonb`` column will not do (measured on PostgreSQL 15 through the library): it keeps
#: a parsed value, not the text written, so consumers would read other text back, silently.
_BINARY_JSON = ("jsonb does not keep the JSON text written: keys come back reordered and "
                "numbers rewritten, 1e+16 as 10000000000000000")


class PostgreSQLFamily(Family):
    """PostgreSQL 15+. One instance serves every database of the family."""

    name = "postgresql"
    schemes = ("postgresql", "postgres")
    sql = sql
    #: An exactly compared column's collation: "C" compares and sorts bytes (every built-in
    #: collation is deterministic, equality is exact anyway; "C" also pins it against a
    #: nondeterministic ICU default).
    exact_collation = "C"
    instant_type = _INSTANT
    modify_column = "ALTER COLUMN {name} TYPE {definition}"
    #: The claim runs at READ COMMITTED: at REPEATABLE READ and SERIALIZABLE PostgreSQL fails
    #: a locking read of a row changed after the snapshot (40001), which concurrent claimers
    #: do all the time.
    claim_level = "READ COMMITTED"
    refused_claim_levels = frozenset({"SERIALIZABLE"})
    claim_refusal = "concurrent claimers would fail with serialization errors"
    #: One statement at every level (:meth:`write_event`): ``INSERT … ON CONFLICT DO NOTHING``.
    write_reads_isolation = False

    def claim_level_for(self, session_level: str) -> str | None:
        """READ COMMITTED for the relay's own claim unless the session's is already."""
        return None if session_level == self.claim_level else self.claim_level

    def refused_type(self, name: str, kind: str, needed: Column) -> tuple[str, str] | None:
        """(what is wrong, the repair) for an instant column of ``timestamp with time zone``
        or a JSON column of ``jsonb``; None for any other type (the schema check's own
        comparison judges it). A timestamptz column's repair converts at UTC (``USING …
        AT TIME ZONE 'UTC'``): without it PostgreSQL would convert at the repairing
        session's TimeZone."""
        if needed.kind == _INSTANT and kind.endswith("with time zone"):
            precision = _PRECISION_RE.search(kind)
            why = _ZONED
            if precision is not None and int(precision[1]) < 6:
                why += ", and they would lose their microseconds"
            return (f"{name} is {kind}, not {_INSTANT} ({why})",
                    f"ALTER COLUMN {name} TYPE {needed.definition} USING {name} AT TIME ZONE"
                    " 'UTC'")
        if needed.kind == "json" and kind == "jsonb":
            return (f"{name} is jsonb, not json ({_BINARY_JSON})",
                    self.modify_column.format(name=name, definition=needed.definition))
        return None

    @property
    def driver_errors(self) -> tuple[type[BaseException], ...]:  # type: ignore[override]
        """The base errors of the drivers imported so far (one not imported raised none)."""
        modules = (sys.modules.get(name) for name in ("psycopg", "psycopg2"))
        return tuple(module.Error for module in modules if module is not None)

    @classmethod
    def accepts(cls, database: Any) -> bool:
        return isinstance(database, pw.PostgresqlDatabase)

    @staticmethod
    def check_database(database: Any) -> None:
        """Nothing to check before connecting: the encodings are asked with the session
        (:meth:`ask_session`)."""

    # -- errors -------------------------------------------------------------------------

    @staticmethod
    def lock_conflict(exc: BaseException) -> LockConflictError | None:
        state = sqlstate_of(exc)
        if state in LOCK_CONFLICTS:
            return LockConflictError(state, _first_line(exc), "PostgreSQL")  # type: ignore[arg-type]
        return None

    @staticmethod
    def write_set_too_large(exc: BaseException) -> None:
        """None: PostgreSQL has no write-set limit (a standby replays any transaction)."""
        return None

    @staticmethod
    def connection_trouble(exc: BaseException) -> str | None:
        error = driver_error(exc)
        if error is None:
            return None
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state is not None:
            if state.startswith("08") or state in _ENDED:
                return "lost"
            if state == READ_ONLY_TRANSACTION:
                return "wrong host"
            return "going" if state in _GOING else None
        if type(error).__name__ not in ("OperationalError", "InterfaceError"):
            return None
        if tls_why(error) is not None:
            return "unreachable"  # no connection opens until the URL's TLS options change
        text = _first_line(error).lower()
        if any(word in str(error).lower() for word in _READ_ONLY_WORDS):
            return "wrong host"
        if "fatal:" in text or any(word in text for word in _NO_TLS_WORDS):
            return None  # a login or a database refused, TLS refused: no retry helps
        if any(word in text for word in _UNREACHABLE_WORDS):
            return "unreachable"
        return "lost"

    no_tls = "the server offers no TLS, and the URL asks for it (sslmode=require or stricter)"

    @staticmethod
    def tls_refused(exc: BaseException) -> bool | str:
        """True for a server without the TLS the URL asks for; the why of a failed
        certificate check (:func:`tls_why`); else False."""
        error = driver_error(exc)
        if error is None:
            return False
        return tls_why(error) or any(word in _first_line(error).lower()
                                     for word in _NO_TLS_WORDS)

    @staticmethod
    def duplicate_key(exc: BaseException) -> str | None:
        if sqlstate_of(exc) != UNIQUE_VIOLATION:
            return None
        diag = getattr(driver_error(exc), "diag", None)
        return getattr(diag, "constraint_name", None) or _first_line(exc)

    @staticmethod
    def missing_table(exc: BaseException) -> bool:
        return sqlstate_of(exc) == UNDEFINED_TABLE

    @staticmethod
    def missing_database(exc: BaseException) -> bool:
        """The database does not exist: 3D000 when the server says it with a SQLSTATE; at
        connect the drivers give none, only libpq's text."""
        if driver_error(exc) is None:
            return False
        return (sqlstate_of(exc) == INVALID_CATALOG_NAME
                or re.search(r'database "[^"]*" does not exist', _first_line(exc).lower())
                is not None)

    @staticmethod
    def denied(exc: BaseException) -> bool:
        return sqlstate_of(exc) == INSUFFICIENT_PRIVILEGE

    @staticmethod
    def payload_refused(exc: BaseException) -> Any:
        return None

    def describe(self, exc: BaseException, url: DatabaseUrl | None,
                 privilege_hint: str) -> str | None:
        """The command line's one line for a server error, or None."""
        if driver_error(exc) is None or url is None:
            return None
        state = sqlstate_of(exc)
        text = _first_line(exc)
        lower = text.lower()
        if (state in (INVALID_PASSWORD, INVALID_AUTHORIZATION)
                or "password authentication failed" in lower
                or re.search(r'role "[^"]*" does not exist', lower)):
            return f"access denied for user {url.user} (check the user and password)"
        if self.missing_database(exc):
            return f"database {url.name} does not exist (run: outbox-lite migrate)"
        if re.search(r'permission denied for database "[^"]*"', lower):
            # At connect, without CONNECT on the database (REVOKE CONNECT … FROM PUBLIC):
            # libpq's text is two lines (its DETAIL); MySQL's 1044 says the same in one.
            return f"access denied to database {url.name} for user {url.user}"
        if state == INSUFFICIENT_PRIVILEGE:
            not_owner = _NOT_OWNER_RE.search(text)
            if not_owner:
                return (f"user {url.user} is not the owner of table {not_owner[1]}, which alone"
                        f" may alter it: {privilege_hint}")
            denied = _DENIED_RE.search(text)
            what = f"on table {denied[1]}" if denied else "it needs"
            return f"user {url.user} lacks a privilege {what}: {privilege_hint}"
        if state == UNDEFINED_TABLE:
            missing = _RELATION_RE.search(text)
            table = missing[1] if missing else "outbox_event"
            return f"table {table} is missing in {url.name} (run: outbox-lite migrate)"
        if any(word in lower for word in _UNKNOWN_HOST_WORDS):
            return f"unknown PostgreSQL server host {url.host}"
        if self.connection_trouble(exc) == "unreachable":
            return f"cannot reach the PostgreSQL server at {url.netloc}"
        return None

    def tls_message(self, url: DatabaseUrl, why: str) -> str:
        return f"TLS with the PostgreSQL server at {url.netloc} failed: {why}"

    @staticmethod
    def host_count(database: pw.Database) -> int:
        """How many hosts the database connects to (libpq's list, ``host=h1,h2``)."""
        return str(getattr(database, "connect_params", {}).get("host", "")).count(",") + 1

    # -- sessions -----------------------------------------------------------------------

    @staticmethod
    def ask_session(database: pw.Database, conn: Any, *, clock: bool = False,
                    tables: Sequence[str] | None = None) -> SessionAnswer:
        """(autocommit, isolation level, the server) of a connection, and with ``clock`` the
        server's clock, with ``tables`` their columns: one round trip
        (:func:`.postgresql_sql.session_question`). PostgreSQL has no autocommit on the
        server (Peewee's connections are autocommit on the driver's side). Raises ValueError
        for a database or connection whose encoding is not UTF8: SQL_ASCII would hand text
        back as bytes, LATIN1 refuse most characters."""
        question = sql.session_question(clock, tables is not None)
        before = time.monotonic()
        rows = database.execute_sql(*question.bind(
            {"tables": list(tables or ())})).fetchall()
        after = time.monotonic()
        first = next(row for row in rows if row[0] == 0)
        _kind, isolation, version, server_encoding, client_encoding, now, spent = first[:7]
        database_encoding = _encoding_name(server_encoding)
        if not _is_utf8(database_encoding):
            raise ValueError(
                f"the database's encoding is {database_encoding}, not UTF8: events would not "
                "be stored and read back as they are (create the database with ENCODING "
                "'UTF8', as outbox-lite migrate does)")
        connection_encoding = _encoding_name(client_encoding)
        if not _is_utf8(connection_encoding):  # the database is UTF8: the connection is wrong
            raise ValueError(
                f"the connection's encoding is {connection_encoding}, not UTF8: events would "
                "not be stored and read back as they are (the database is UTF8; connect with "
                "client_encoding UTF8: the driver's client_encoding option, PGCLIENTENCODING, "
                "or the role's or database's client_encoding setting)")
        columns = None if tables is None else [tuple(row[7:11]) for row in rows if row[0] == 1]
        return SessionAnswer(True, str(isolation), Server(str(version)),
                             now if clock else None, _middle(before, after, spent) if clock else None,
                             columns)

    @staticmethod
    def session_id(conn: Any) -> Any:
        info = getattr(conn, "info", None)
        pid = getattr(info, "backend_pid", None)  # psycopg 3
        if pid is None and callable(getattr(conn, "get_backend_pid", None)):
            pid = conn.get_backend_pid()  # psycopg2
        return pid

    #: The most bytes of UTF-8 consumer + message_id an inbox key may hold: a btree entry holds
    #: at most 2,704 bytes, 16 of them the entry's and the two values' headers. PostgreSQL
    #: compresses a long key when it can, so some longer ones would fit; this bound holds for
    #: every key (measured: 3,072 bytes of random 4-byte characters refused with 54000).
    max_inbox_key_bytes = 2688

    def check_inbox_key(self, consumer: str, message_id: str) -> None:
        """InvalidEventError, before any SQL, for an inbox key the primary key cannot hold
        (the server's refusal would abort the caller's transaction)."""
        size = len(consumer.encode("utf-8")) + len(message_id.encode("utf-8"))
        if size > self.max_inbox_key_bytes:
            raise InvalidEventError(
                f"consumer and message_id are {size} bytes of UTF-8 together; PostgreSQL's "
                f"index of the inbox holds at most {self.max_inbox_key_bytes} (704 ASCII "
                "characters always fit)")

    @staticmethod
    def stored_text(text: str) -> str:
        """``text`` as a text column can hold it: PostgreSQL's text holds no NUL character
        (the driver refuses it), so a NUL in an error message is stored as U+FFFD."""
        return text.replace("\x00", "\ufffd")

    @staticmethod
    def id_list(ids: Sequence[Any]) -> list[Any]:
        """A list of ids as ``= ANY(%(ids)s)`` takes it: a list (sent as an array)."""
        return list(ids)

    # -- writing an event -----------------------------------------------------------------

    def write_event(self, database: pw.Database, values: dict[str, Any], *, given_key: bool,
                    isolation: str, payload: Any, execute: Any) -> int:
        """Insert the event and notify the relays, in one statement; its id. A duplicate
        ``dedupe_key`` (the caller's) is no row: DuplicateEventError, and the caller's
        transaction goes on (nothing failed on the server). PostgreSQL has no statement size
        limit below 1 GB, so ``max_payload_bytes`` is the only bound. The same statement at
        every isolation level: ``isolation`` is not read (the repository passes "")."""
        statement = sql.INSERT_UNLESS_TAKEN if given_key else sql.INSERT
        row = execute(*statement.bind(values)).fetchone()
        if row is None:
            raise DuplicateEventError(values["dedupe_key"])
        return int(row[0])

    @staticmethod
    def extend_locks(values: dict[str, Any], count: int, execute: Any) -> int:
        """Renew the claims; PostgreSQL's row count is the rows matched."""
        return int(execute(*sql.EXTEND_LOCKS.bind(values)).rowcount)

    # -- the schema, the server ------------------------------------------------------------

    @staticmethod
    def table_state(database: pw.Database, table: str, execute: Any) -> tuple[bool, bool]:
        """(whether ``table`` exists, whether the user may read it), with no error."""
        exists, readable = execute(*sql.TABLE_STATE.bind({"table": table})).fetchone()
        return bool(exists), bool(readable)

    @staticmethod
    def lock_counters(database: pw.Database, settle: float = 10.0) -> LockCounters:
        """The database's deadlocks (``pg_stat_database``), once the other sessions of the
        database have ended (waiting at most ``settle`` seconds): a live session reports its
        counts late (at most once a second, or after 10 s idle), one that ended has reported
        them all. PostgreSQL counts no lock waits: 0 here (see :meth:`lock_waits_now`)."""
        deadline = time.monotonic() + settle
        while database.execute_sql(sql.OTHER_SESSIONS).fetchone()[0] \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        database.execute_sql("SELECT pg_stat_force_next_flush()")  # this session's own
        (deadlocks,) = database.execute_sql(sql.DEADLOCKS).fetchone()
        return LockCounters(int(deadlocks or 0), 0)

    @staticmethod
    def lock_waits_now(database: pw.Database) -> set[tuple[Any, ...]]:
        """The row-lock waits going on now in the database's sessions, each as (session,
        instant its wait began): PostgreSQL keeps no count of lock waits, so the contention
        suite looks at pg_locks often during a scenario and counts the distinct ones it saw."""
        return {tuple(row) for row in database.execute_sql(sql.LOCK_WAITS_NOW).fetchall()}

    def listener(self, database: pw.Database) -> "Listener":
        """The relay's LISTEN on ``outbox_event``, on a connection of its own."""
        return Listener(database)

    url_class: type[DatabaseUrl]

    #: What each table needs, column by column (the migrations' result).
    schema_columns = {
        "outbox_event": {
            "id": Column("BIGINT", "bigint", False),
            "event_type": Column("VARCHAR(255)", "character varying(255)", False),
            "aggregate_type": Column(f"VARCHAR(255) {_EXACT}", "character varying(255)",
                                     True, True),
            "aggregate_id": Column(f"VARCHAR(255) {_EXACT}", "character varying(255)", True,
                                   True),
            "dedupe_key": Column(f"VARCHAR(255) {_EXACT}", "character varying(255)", True),
            "payload": Column("JSON", "json", False),
            "status": Column("VARCHAR(16)", "character varying(16)", False),
            "attempt_count": Column("INTEGER", "integer", False),
            "available_at": Column("TIMESTAMP(6)", _INSTANT, False),
            "locked_at": Column("TIMESTAMP(6)", _INSTANT, False),
            "locked_by": Column(f"VARCHAR(255) {_EXACT}", "character varying(255)", True),
            "published_at": Column("TIMESTAMP(6)", _INSTANT, False),
            "last_error_code": Column(f"VARCHAR(64) {_EXACT}", "character varying(64)", True,
                                      True),
            "last_error_message": Column("TEXT", "text", False),
            "created_at": Column("TIMESTAMP(6)", _INSTANT, False),
            "updated_at": Column("TIMESTAMP(6)", _INSTANT, False),
            # Migration 006 (SPEC §11); a missing one is ``outbox-lite migrate``'s to add.
            "headers": Column("JSON", "json", False, True),
            "expires_at": Column("TIMESTAMP(6)", _INSTANT, False, True),
        },
        "inbox_message": {
            "consumer": Column(f"VARCHAR(64) {_EXACT}", "character varying(64)", True),
            "message_id": Column(f"VARCHAR(704) {_EXACT}", "character varying(704)", True),
            "received_at": Column("TIMESTAMP(6)", _INSTANT, False),
        },
    }


FAMILY = PostgreSQLFamily()


# ---------------------------------------------------------------------------
# LISTEN: the relay's wake-up on PostgreSQL
# ---------------------------------------------------------------------------

#: The drivers, in the order a URL without ``driver=`` tries them: psycopg 3 is what the
#: ``[postgresql]`` extra installs.
DRIVERS = ("psycopg", "psycopg2")


def _driver(wanted: str | None = None) -> Any:
    """The driver module ``wanted`` (a name of DRIVERS), else psycopg 3 when installed, else
    psycopg2; ImportError naming what to install when it is missing."""
    for name in (wanted,) if wanted else DRIVERS:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    if wanted == "psycopg2":
        raise ImportError("the URL asks for driver=psycopg2, which is not installed:"
                          " pip install psycopg2-binary")
    raise ImportError("PostgreSQL needs a driver: pip install 'outbox-lite[postgresql]'")


def _driver_of(database: Any) -> str | None:
    """The driver a Peewee database drives: ``psycopg``, ``psycopg2`` or None (unknown)."""
    adapter = type(getattr(database, "_adapter", None)).__name__
    if adapter in ("Psycopg3Adapter", "Psycopg2Adapter"):
        return "psycopg" if adapter == "Psycopg3Adapter" else "psycopg2"
    if type(database).__name__ == "Psycopg3Database":  # Peewee 3's playhouse.psycopg3_ext
        return "psycopg"
    return "psycopg2" if isinstance(database, pw.PostgresqlDatabase) else None


def _connect(dbname: str, params: dict[str, Any], driver_name: str | None = None) -> Any:
    """A driver connection of its own, in autocommit."""
    driver = _driver(driver_name)
    if driver.__name__ == "psycopg":
        return driver.connect(dbname=dbname, autocommit=True, **params)
    conn = driver.connect(dbname=dbname, **params)
    conn.autocommit = True
    return conn


class Listener:
    """``LISTEN outbox_event`` on a connection of its own (autocommit, never in a
    transaction, which would hold notifications back), ringing the relay's bell for each
    notification: the wake transport of :mod:`outbox_lite.wake` on PostgreSQL."""

    def __init__(self, database: pw.Database) -> None:
        self.dbname = str(database.database)
        params = dict(getattr(database, "connect_params", {}))
        self.params = {k: v for k, v in params.items()
                       if k in ("host", "port", "user", "password", "sslmode", "sslrootcert",
                                "sslcert", "sslkey", "sslpassword", "connect_timeout",
                                "application_name", "options", "service",
                                "target_session_attrs")}
        self.driver = _driver_of(database)
        self.channel = sql.CHANNEL
        hosts = str(self.params.get("host", "localhost")).split(",")
        ports = str(self.params.get("port", 5432)).split(",")
        where = ",".join(f"{host}:{ports[min(i, len(ports) - 1)]}"  # libpq: one port for all
                         for i, host in enumerate(hosts))
        self.where = f"PostgreSQL LISTEN {sql.CHANNEL} on {where}/{self.dbname}"
        self._lock = threading.Lock()

    def publish(self, channel: str) -> None:  # the INSERT notifies: nothing to send
        return None

    def drop(self) -> None:
        return None

    def listen(self, channel: str, bell: Any, stop: threading.Event,
               ready: Callable[[], None]) -> None:
        conn = _connect(self.dbname, self.params, self.driver)
        try:
            conn.cursor().execute(f"LISTEN {sql.CHANNEL}")
            ready()
            if hasattr(conn, "notifies") and callable(conn.notifies):  # psycopg 3
                while not stop.is_set():
                    for _ in conn.notifies(timeout=0.25, stop_after=1):
                        bell.ring()
                    if conn.closed:
                        raise ConnectionError("the LISTEN connection closed")
            else:  # psycopg2
                while not stop.is_set():
                    if select.select([conn], [], [], 0.25)[0]:
                        conn.poll()
                        if conn.notifies:
                            conn.notifies.clear()
                            bell.ring()
                    if conn.closed:
                        raise ConnectionError("the LISTEN connection closed")
        finally:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass


# ---------------------------------------------------------------------------
# URLs: postgresql:// (also postgres://)
# ---------------------------------------------------------------------------

FORM = ("expected postgresql://user[:password]@host[:port]/database[?option=value&...] (or "
        "postgres://), with the user and password percent-encoded (% as %25; / # ? @ may be "
        "written as they are)")
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _sslmode(name: str, value: str) -> str:
    if value not in _SSLMODES:
        raise DatabaseUrlError(f"URL parameter {name} must be one of {', '.join(_SSLMODES)}")
    return value


def _whole_seconds(name: str, value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 31_536_000:
        raise DatabaseUrlError(f"URL parameter {name} must be a whole number of seconds from 1"
                               " to 31536000")
    return int(value)


_SESSION_ATTRS = ("any", "read-write", "read-only", "primary", "standby", "prefer-standby")


def _session_attrs(name: str, value: str) -> str:
    if value not in _SESSION_ATTRS:
        raise DatabaseUrlError(f"URL parameter {name} must be one of {', '.join(_SESSION_ATTRS)}")
    return value


def _driver_option(name: str, value: str) -> str:
    if value not in DRIVERS:
        raise DatabaseUrlError(f"URL parameter {name} must be one of {', '.join(DRIVERS)}")
    return value


#: The query parameters a URL may carry, named as libpq names them, with their readers.
OPTIONS: dict[str, Callable[[str, str], Any]] = {
    "sslmode": _sslmode, "sslrootcert": text_option, "sslcert": text_option,
    "sslkey": text_option, "sslpassword": text_option, "connect_timeout": _whole_seconds,
    "application_name": text_option, "driver": _driver_option,
    "target_session_attrs": _session_attrs,
}


class PostgresUrl(DatabaseUrl):
    """A parsed ``postgresql://`` (or ``postgres://``) URL; ``str()`` never shows the
    password."""

    scheme = "postgresql"
    default_port = 5432
    default_user = "postgres"
    name_re = re.compile(r"[A-Za-z0-9_$]{1,63}")
    name_rule = "1-63 letters, digits, _ or $"
    form = FORM
    OPTIONS = OPTIONS
    secret_options = frozenset({"sslpassword"})
    file_options = ("sslrootcert", "sslcert", "sslkey")

    @property
    def driver(self) -> str | None:
        """The URL's ``driver=`` (``psycopg`` or ``psycopg2``), None when it names none."""
        return dict(self.options).get("driver")

    def _params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user,
                                  "connect_timeout": 5, **dict(self.options)}
        if self.hosts:  # libpq's own list: the first host that is read-write, unless told
            params["host"] = ",".join(host for host, _ in self.hosts)
            params["port"] = ",".join(str(port) for _, port in self.hosts)
            params.setdefault("target_session_attrs", "read-write")
        params.pop("driver", None)  # ours, not libpq's
        if self.password:
            params["password"] = self.password
        return params

    def database(self, database_class: Any = None, **kwargs: Any) -> Any:
        """A Peewee database for this URL (connects lazily) driving the URL's ``driver=``, or
        psycopg 3 when installed, else psycopg2: of ``database_class`` when given, else
        Peewee's PostgresqlDatabase (on Peewee 3 with psycopg 3, playhouse's
        Psycopg3Database). ``kwargs`` add to or override the URL's connection options."""
        driver = _driver(self.driver).__name__
        kind = default_database_class(driver) if database_class is None else database_class
        extra: dict[str, Any] = {}
        if issubclass(kind, pw.PostgresqlDatabase) and hasattr(kind, "psycopg3_adapter"):
            extra["prefer_psycopg3"] = driver == "psycopg"  # Peewee 4 picks by this flag
        return kind(self.name, **{**self._params(), **extra, **kwargs})

    def server_connection(self) -> Any:
        """A plain driver connection to the server's maintenance database ``postgres``, in
        autocommit."""
        return _connect("postgres", self._params(), self.driver)

    LISTED_SQL = "SELECT 1 FROM pg_database WHERE datname = %s"
    CREATE_SQL = """CREATE DATABASE "{name}" ENCODING 'UTF8' TEMPLATE template0"""
    DROP_SQL = 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'  # its sessions ended first

    def created_meanwhile(self, error: Exception) -> bool:
        return sqlstate_of(error) == DUPLICATE_DATABASE


def default_database_class(driver: str) -> Any:
    """Peewee's PostgresqlDatabase (Peewee 4 drives either driver; Peewee 3 psycopg2 only),
    or on Peewee 3 with ``driver`` psycopg its playhouse.psycopg3_ext.Psycopg3Database."""
    if driver == "psycopg2" or not str(getattr(pw, "__version__", "")).startswith("3."):
        return pw.PostgresqlDatabase
    return importlib.import_module("playhouse.psycopg3_ext").Psycopg3Database


PostgreSQLFamily.url_class = PostgresUrl
PostgresUrl.family = FAMILY
