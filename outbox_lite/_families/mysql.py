"""The MySQL family: MySQL 8+ and MariaDB 10.6+ through PyMySQL (MariaDB a flag of the server,
:attr:`~outbox_lite._families.mysql_server.Server.is_mariadb`, as peewee's ``MySQLDatabase``
has its ``mariadb``).

Here: the database check (a ``MySQLDatabase`` speaking utf8mb4), the driver's error numbers
and what each means, the write of an event (which statement at which isolation level, the
duplicate key, the id from ``lastrowid``, ``max_allowed_packet``), MySQL's changed-row counts,
the session questions, the schema the tables must have, the ``mysql://`` URL with its TLS
options, and creating and dropping a database. The statements are in :mod:`.mysql_sql`.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Callable, Sequence

import peewee as pw
import pymysql
from pymysql.constants.CLIENT import MULTI_STATEMENTS as _MULTI_STATEMENTS

from ..errors import DuplicateEventError, LockConflictError, PayloadError, WriteSetTooLargeError
from . import mysql_packet
from . import mysql_sql as sql
from .contract import Column, Family, SessionAnswer
from .contract import clock_middle as _middle
from .mysql_server import LockCounters, Server, peewee_query, server_of
from .url import DatabaseUrl, DatabaseUrlError, flag_option, text_option


class MySQLDatabase(pw.MySQLDatabase):
    """``peewee.MySQLDatabase`` that connects with PyMySQL's current keyword, ``database=``.

    Peewee 3 passes ``db=``, which PyMySQL 1.1+ answers with a DeprecationWarning on every
    connection; Peewee 4 connects exactly like this.
    """

    def _connect(self) -> Any:
        return pymysql.connect(database=self.database, autocommit=True, **self.connect_params)


class FirstWritable:
    """A Peewee MySQL database over several hosts (a URL listing them): each new connection
    goes to the first host, in the URL's order, that answers and can take writes (SPEC §12).
    Mixed in before the database's own class by :meth:`MySQLUrl.database`, so a pooled or
    reconnecting database keeps its own ``_connect`` around each host's attempt.

    A host is passed over when it cannot be reached or its connection breaks, and when it
    answers but cannot take writes (:func:`not_writable`); the answer to that question is kept
    on the connection for the session question (:meth:`MySQLFamily.ask_session`), so it costs
    no round trip of its own. When no host will do, the driver's OperationalError says why for
    each: 1290 (the wrong host, :data:`WRONG_HOST`) when one answered, else 2003."""

    hosts: tuple[tuple[str, int], ...] = ()
    connect_params: dict[str, Any]

    def _connect(self) -> Any:
        # Peewee opens connections under the database's lock: the parameters are this
        # attempt's alone while it runs.
        saved = self.connect_params
        refusals: list[str] = []
        wrong_host = False
        try:
            for host, port in self.hosts:
                self.connect_params = {**saved, "host": host, "port": port}
                try:
                    conn = super()._connect()  # type: ignore[misc]
                    why = not_writable(conn)
                except pymysql.MySQLError as exc:
                    trouble = FAMILY.connection_trouble(exc)
                    if trouble is None:
                        raise  # a login or a database refused: so it would be on every host
                    wrong_host = wrong_host or trouble == "wrong host"
                    refusals.append(f"{host}:{port}: {exc}")
                    continue
                if why is None:
                    return conn
                wrong_host = True
                refusals.append(f"{host}:{port}: {why}")
                conn.close()
        finally:
            self.connect_params = saved
        raise pymysql.err.OperationalError(
            ER_OPTION_PREVENTS_STATEMENT if wrong_host else 2003,
            "no host of the URL can take writes: " + "; ".join(refusals))


_FIRST_WRITABLE: dict[type, type] = {}


def first_writable(kind: type) -> type:
    """``kind`` (a Peewee MySQL database class) over several hosts (:class:`FirstWritable`)."""
    made = _FIRST_WRITABLE.get(kind)
    if made is None:
        made = _FIRST_WRITABLE[kind] = type(kind.__name__, (FirstWritable, kind),
                                            {"__module__": kind.__module__})
    return made


def not_writable(conn: Any) -> str | None:
    """Why the server of a new PyMySQL connection ``conn`` cannot take writes, or None when it
    can: one round trip, whose answer also serves as the session question's. Raises the
    driver's error for a server that refuses the question (a Galera node not ready: 1047)."""
    mariadb = Server(str(conn.server_version)).is_mariadb
    with conn.cursor() as cur:
        cur.execute(sql.WRITABLE_MARIADB if mariadb else sql.WRITABLE_MYSQL)
        row = cur.fetchone()
    conn._outbox_session = row  # read by ask_session
    read_only, state = int(row[2] or 0), row[3]
    if read_only:
        return "the server is read-only (read_only or super_read_only)"
    if state is None:
        return None
    state = state.decode() if isinstance(state, bytes) else str(state)
    if state != "Synced":
        return f"the Galera node is {state}, not Synced"
    return None


# ---------------------------------------------------------------------------
# The driver's errors
# ---------------------------------------------------------------------------

def errno_of(exc: BaseException | None) -> int | None:
    """The MySQL error number behind a Peewee or PyMySQL exception, or None."""
    orig = getattr(exc, "orig", exc)
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


#: Driver errors that mean the connection is gone: server gone away / lost during a query /
#: lost reading the handshake (2006, 2013, 2055), killed (MariaDB 1927), disconnected for
#: inactivity (MySQL 4031).
LOST = frozenset({2006, 2013, 2055, 1927, 4031})
#: Driver errors that mean no connection could be opened: the server is not reachable.
UNREACHABLE = frozenset({2002, 2003})
#: Also worth a reconnect: the server is shutting down (1053), or full for now (1040).
GOING = frozenset({1040, 1053})
ER_DUP_ENTRY = 1062
ER_BAD_NULL_ERROR = 1048  # READ_THEN_INSERT's refusal of a taken key (status NULL)
ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK = 1205, 1213
#: A COMMIT a cluster refused: Group Replication's rollback of a transaction that lost
#: certification (3101), and "Got error 149 … during COMMIT" (1180; 149 is the handler's
#: deadlock). Galera's certification failure is 1213, raised by the COMMIT.
ER_ERROR_DURING_COMMIT, ER_TRANSACTION_ROLLBACK_DURING_COMMIT = 1180, 3101
#: Every error after which the server has rolled the statement or the transaction back for a
#: conflict with another one: retrying the whole transaction is the remedy.
CONFLICTS = frozenset({ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK, ER_ERROR_DURING_COMMIT,
                       ER_TRANSACTION_ROLLBACK_DURING_COMMIT})
ER_NO_SUCH_TABLE = 1146
#: A transaction over a cluster's write-set limit: Galera's 1105 "Maximum writeset size
#: exceeded" (wsrep_max_ws_size), and Group Replication's 3100 "Error on observer while running
#: replication hook 'before_commit'" at COMMIT (group_replication_transaction_size_limit; the
#: member's error log names the limit). The server rolled the whole transaction back.
ER_UNKNOWN_ERROR, ER_RUN_HOOK_ERROR = 1105, 3100
_TOO_LARGE = {ER_UNKNOWN_ERROR: "writeset size", ER_RUN_HOOK_ERROR: "before_commit"}
#: A server that answers but cannot take writes: read-only (1290, "running with the
#: --read-only / --super-read-only option"), or a Galera node not ready (1047, "WSREP has not
#: yet prepared node for application use"). Each is the wrong host (SPEC §12), worth a
#: reconnect to another one; 1290 for another option (--secure-file-priv …) is not.
ER_OPTION_PREVENTS_STATEMENT, ER_UNKNOWN_COM_ERROR = 1290, 1047
_WRONG_HOST_WORDS = ("read-only", "read_only", "wsrep", "no host of the url")
#: A table (1142) or column (1143) privilege is missing.
DENIED = frozenset({1142, 1143})
ER_BAD_DB_ERROR, ER_DBACCESS_DENIED, ER_DB_CREATE_EXISTS = 1049, 1044, 1007
CR_SSL_CONNECTION_ERROR = 2026
#: MySQL refused a JSON value whose binary form is longer than max_allowed_packet.
ER_JSON_TOO_BIG = 1301
#: "Duplicate entry 'x' for key 'outbox_event.uq_outbox_event_dedupe_key'" (MySQL 8 names the
#: table too; MariaDB the key alone). The value may hold anything: the key is the last quote.
_DUPLICATE_KEY_RE = re.compile(r"for key '(?:[^']*\.)?([^'.]*)'\s*$")

#: The CLI's one line per error number.
_SERVER_ERRORS = {
    ER_DBACCESS_DENIED: "access denied to database {url.name} for user {url.user}",
    1045: "access denied for user {url.user} (check the user and password)",
    1698: "access denied for user {url.user} (check the user and password)",
    ER_BAD_DB_ERROR: "database {url.name} does not exist (run: outbox-lite migrate)",
    ER_NO_SUCH_TABLE: "table outbox_event is missing in {url.name} (run: outbox-lite migrate)",
    2003: "cannot reach the MySQL server at {url.netloc}",
    2005: "unknown MySQL server host {url.host}",
}
#: "CREATE command denied to user 'app'@'host' for table `db`.`t`" (MariaDB; MySQL: 't').
_DENIED_RE = re.compile(r"(\w+) command denied to user '([^']*)'@'[^']*' for table "
                        r"[`']?(?:[^`'.]*[`']?\.[`']?)?([^`'.]+)[`']?")


_LIMIT_RE = re.compile(r"max_allowed_packet \((\d+)\)")


def _taken(exc: BaseException) -> bool:
    """Whether ``exc`` is :data:`~.mysql_sql.READ_THEN_INSERT`'s refusal: its read found the
    key committed (or the transaction's own), so its INSERT gave status NULL (1048)."""
    return (errno_of(exc) == ER_BAD_NULL_ERROR
            and f"'{sql.TAKEN_COLUMN}'" in str(getattr(exc, "orig", exc)))


def refused(exc: BaseException) -> PayloadError | None:
    """The PayloadError for an INSERT that MySQL refused because the payload's binary JSON
    is longer than ``max_allowed_packet`` (1301), else None. MySQL undid that statement
    alone: the caller's transaction goes on."""
    if errno_of(exc) != ER_JSON_TOO_BIG:
        return None
    limit = _LIMIT_RE.search(str(getattr(exc, "orig", exc)))
    return PayloadError(
        "the server refused the payload: its binary JSON form is larger than the server's "
        f"max_allowed_packet ({limit[1] + ' bytes' if limit else 'see the server'}); send a "
        "smaller payload, or raise max_allowed_packet on the server")


# ---------------------------------------------------------------------------
# The family
# ---------------------------------------------------------------------------

_EXACT = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
_INSTANT = "datetime(6)"


class MySQLFamily(Family):
    """MySQL and MariaDB. One instance serves every database of the family."""

    name = "mysql"
    schemes = ("mysql",)
    sql = sql
    driver_errors: tuple[type[BaseException], ...] = (pymysql.MySQLError,)
    #: How information_schema names a column compared exactly.
    exact_collation = "utf8mb4_bin"

    @classmethod
    def accepts(cls, database: Any) -> bool:
        return isinstance(database, pw.MySQLDatabase)

    @staticmethod
    def check_database(database: Any) -> None:
        """A MySQLDatabase whose connections speak utf8mb4, so that every character is stored
        and read back as it is: on a 3-byte ``utf8`` connection (Peewee 3's default) the
        server stores a 4-byte character such as an emoji as '?', and MySQL also hands JSON
        back through it, with no error. Raises ValueError for another character set."""
        charset = database.connect_params.get("charset", "utf8mb4")  # PyMySQL's default
        if str(charset).lower() != "utf8mb4":
            raise ValueError(
                f"the database connects with charset {charset!r}, which cannot carry 4-byte "
                "characters (an emoji would be stored as '?'): make it with charset='utf8mb4'"
                + (" (Peewee 3's default is utf8)" if str(charset).lower() == "utf8" else ""))

    # -- errors -------------------------------------------------------------------------

    @staticmethod
    def lock_conflict(exc: BaseException) -> LockConflictError | None:
        """The LockConflictError for a deadlock (1213: also Galera's certification failure at
        COMMIT), a lock-wait timeout (1205), or a COMMIT Group Replication refused (3101, 1180)."""
        errno = errno_of(exc)
        if errno in CONFLICTS:
            return LockConflictError(errno, str(getattr(exc, "orig", exc)))
        return None

    @staticmethod
    def write_set_too_large(exc: BaseException) -> WriteSetTooLargeError | None:
        """The WriteSetTooLargeError for a transaction a cluster refused for its size (Galera's
        1105 over wsrep_max_ws_size, Group Replication's 3100 at COMMIT over
        group_replication_transaction_size_limit), else None."""
        errno = errno_of(exc)
        args: tuple[Any, ...] = getattr(getattr(exc, "orig", exc), "args", ())
        message = str(args[1]) if len(args) > 1 else str(exc)
        if errno not in _TOO_LARGE or _TOO_LARGE[errno] not in message.lower():
            return None
        setting = ("wsrep_max_ws_size" if errno == ER_UNKNOWN_ERROR
                   else "group_replication_transaction_size_limit")
        return WriteSetTooLargeError(
            f"the cluster refused the transaction: its write set is over {setting} (MySQL "
            f"error {errno}: {message}); nothing of it was written: make the transaction "
            "smaller (fewer events or smaller payloads), or raise the limit")

    @staticmethod
    def connection_trouble(exc: BaseException) -> str | None:
        """``"lost"`` (the connection is gone), ``"unreachable"`` (none could be opened),
        ``"going"`` (the server is shutting down or full: worth a reconnect), ``"wrong host"``
        (the server answers but cannot take writes: read-only, a Galera node not ready), or
        None."""
        errno = errno_of(exc)
        if errno in LOST:
            return "lost"
        if errno in UNREACHABLE:
            return "unreachable"
        if errno in GOING:
            return "going"
        if errno in (ER_OPTION_PREVENTS_STATEMENT, ER_UNKNOWN_COM_ERROR) and any(
                word in str(getattr(exc, "orig", exc)).lower() for word in _WRONG_HOST_WORDS):
            return "wrong host"
        return None

    #: Why a connection failed when the server has no TLS and the URL asks for it.
    no_tls = ("the server offers no TLS, and the URL asks for it (ssl_ca, ssl_cert, ssl_key, "
              "ssl_verify_cert or ssl_verify_identity)")

    @staticmethod
    def tls_refused(exc: BaseException) -> bool:
        """The server offers no TLS though the URL asks for it."""
        return errno_of(exc) == CR_SSL_CONNECTION_ERROR

    @staticmethod
    def duplicate_key(exc: BaseException) -> str | None:
        """The unique key (constraint) a refused duplicate hit, or None for another error."""
        if errno_of(exc) != ER_DUP_ENTRY:
            return None
        message = str(getattr(exc, "orig", exc))
        match = _DUPLICATE_KEY_RE.search(message)
        return match[1] if match else message

    @staticmethod
    def missing_table(exc: BaseException) -> bool:
        return errno_of(exc) == ER_NO_SUCH_TABLE

    @staticmethod
    def missing_database(exc: BaseException) -> bool:
        """The database does not exist (told only to a user who may know; 1044 to others)."""
        return errno_of(exc) == ER_BAD_DB_ERROR

    @staticmethod
    def denied(exc: BaseException) -> bool:
        """A table or column privilege is missing (a table the user may not read looks the
        same whether it exists or not)."""
        return errno_of(exc) in DENIED

    @staticmethod
    def payload_refused(exc: BaseException) -> Any:
        """The PayloadError for an INSERT the server refused for its payload, else None."""
        return refused(exc)

    def describe(self, exc: BaseException, url: DatabaseUrl | None,
                 privilege_hint: str) -> str | None:
        """The command line's one line for a server error, or None (say the error itself).
        ``privilege_hint`` is what a missing table privilege needs (``{history}``-free)."""
        errno = errno_of(exc)
        if errno in DENIED:
            denied = _DENIED_RE.search(str(getattr(exc, "orig", exc)))
            if denied:
                what, user, table = denied.groups()
                return f"user {user} lacks the {what} privilege on table {table}: {privilege_hint}"
        if url is not None and errno in _SERVER_ERRORS:
            return _SERVER_ERRORS[errno].format(url=url)
        return None

    def tls_message(self, url: DatabaseUrl, why: str) -> str:
        return f"TLS with the MySQL server at {url.netloc} failed: {why}"

    # -- sessions -----------------------------------------------------------------------

    @staticmethod
    def ask_session(database: pw.Database, conn: Any, *, clock: bool = False,
                    tables: Sequence[str] | None = None) -> SessionAnswer:
        """What the calling thread's new connection ``conn`` is, in one round trip
        (:func:`.mysql_sql.session_question`): autocommit, the isolation level as the server
        writes it, the server (from the handshake); its ``max_allowed_packet``, kept on the
        connection for :func:`.mysql_packet.packet_limit`; with ``clock`` the server's clock;
        with ``tables`` their columns. A connection of a URL listing several hosts was asked
        its session when it opened (:func:`not_writable`): then nothing more is asked here,
        and the clock, the packet limit and the columns are read by their own statements."""
        server = Server(str(conn.server_version))
        row = getattr(conn, "_outbox_session", None)  # asked at connect (FirstWritable)
        if row is not None:
            return SessionAnswer(bool(int(row[0])), str(row[1]), server)
        question = sql.session_question(server.is_mariadb, clock, tables is not None)
        before = time.monotonic()
        rows = database.execute_sql(*question.bind({"tables": tuple(tables or ())})).fetchall()
        after = time.monotonic()
        first = next(row for row in rows if row[0] == 0)
        _kind, autocommit, isolation, packet, version, now, spent = first[:7]
        # on the connection that answered (a ReconnectMixin database may have replaced conn)
        mysql_packet.remember(database.connection(), int(packet), str(version))
        columns = None if tables is None else [tuple(row[7:11]) for row in rows if row[0] == 1]
        return SessionAnswer(bool(int(autocommit)), str(isolation), server,
                             now if clock else None, _middle(before, after, spent) if clock else None,
                             columns)

    @staticmethod
    def host_count(database: pw.Database) -> int:
        """How many hosts the database connects to (a URL may list several)."""
        return len(getattr(database, "hosts", ())) or 1

    @staticmethod
    def session_id(conn: Any) -> Any:
        """The server's id of a connection's session (None when the driver cannot say)."""
        thread_id = getattr(conn, "thread_id", None)
        return thread_id() if callable(thread_id) else None

    @staticmethod
    def check_inbox_key(consumer: str, message_id: str) -> None:
        """Every key of the allowed lengths fits: 4 x (64 + 704) is InnoDB's 3,072 bytes."""

    @staticmethod
    def stored_text(text: str) -> str:
        """``text`` as a TEXT column holds it (every character, NUL too)."""
        return text

    @staticmethod
    def id_list(ids: Sequence[int]) -> tuple[int, ...]:
        """A list of ids as the ``%(ids)s`` of this family's statements takes it."""
        return tuple(ids)

    # -- writing an event -----------------------------------------------------------------

    #: Levels at which INSERT … WHERE NOT EXISTS reads without locking, on both servers.
    _ONE_STATEMENT_LEVELS = frozenset({"READ COMMITTED", "READ UNCOMMITTED"})

    def write_event(self, database: pw.Database, values: dict[str, Any], *, given_key: bool,
                    isolation: str, payload: Any, execute: Any) -> int:
        """Insert the event ``values`` (the INSERT's parameters by name) and return its id.

        With the caller's ``dedupe_key`` (``given_key``), so that a refused duplicate holds up
        no other writer's event: one statement at READ COMMITTED or READ UNCOMMITTED
        (:data:`~.mysql_sql.INSERT_UNLESS_TAKEN`, 0 rows: a committed duplicate); the
        lock-free read :data:`~.mysql_sql.DEDUPE_KEY_TAKEN`, then the INSERT, at REPEATABLE
        READ or SERIALIZABLE, where a refused INSERT would hold up other writers on either
        server (the measurements are in :mod:`.mysql_sql`): in one round trip
        (:data:`~.mysql_sql.READ_THEN_INSERT`) when the connection allows multiple
        statements, else two. Raises DuplicateEventError, and PayloadError for a payload the
        server's ``max_allowed_packet`` would refuse (before any SQL) or refused.
        ``execute(statement, params)`` runs a statement."""
        statement, read_first = sql.INSERT, False
        limit = mysql_packet.packet_limit(database, execute)
        if given_key:
            if isolation in self._ONE_STATEMENT_LEVELS:
                statement = sql.INSERT_UNLESS_TAKEN
            elif getattr(database.connection(), "client_flag", 0) & _MULTI_STATEMENTS:
                statement = sql.READ_THEN_INSERT
            else:
                read_first = True
        params = statement.params(values)
        mysql_packet.check_insert(limit, statement, payload, values["payload"], params)
        key = values["dedupe_key"]
        if read_first and execute(sql.DEDUPE_KEY_TAKEN,
                                  sql.DEDUPE_KEY_TAKEN.params(values)).fetchone():
            raise DuplicateEventError(key)  # committed before: found without a lock
        try:
            cursor = execute(statement, params)
        except pw.IntegrityError as exc:
            if "dedupe_key" in (self.duplicate_key(exc) or "") or _taken(exc):
                raise DuplicateEventError(key) from exc
            raise
        except pw.OperationalError as exc:
            too_big = refused(exc)
            if too_big is not None:
                raise too_big from exc
            raise
        if cursor.rowcount == 0:  # INSERT_UNLESS_TAKEN found the key committed
            raise DuplicateEventError(key)
        return int(cursor.lastrowid)

    @staticmethod
    def extend_locks(values: dict[str, Any], count: int, execute: Any) -> int:
        """Renew the claims in ``values`` (ids, locked_by, now) of ``count`` ids; how many
        the caller still holds. MySQL counts changed rows, not matched ones: a claim taken
        at this very instant matched without changing, so fewer than ``count`` changed are
        counted again as those held at ``now``."""
        changed = int(execute(*sql.EXTEND_LOCKS.bind(values)).rowcount)
        if changed < count:
            changed = int(execute(*sql.RENEWED.bind(values)).fetchone()[0])
        return changed

    # -- the schema, the server ------------------------------------------------------------

    #: How a repair changes a column's definition (ALTER TABLE t <this>).
    modify_column = "MODIFY {name} {definition}"

    def refused_type(self, name: str, kind: str, needed: Column) -> tuple[str, str] | None:
        """(what is wrong, the repair) for an instant column of ``timestamp``: MySQL's
        zoned type, which takes the library's naive UTC instants as times of the session's
        ``time_zone`` and ends in 2038. None for any other type (the schema check's own
        comparison judges it)."""
        if needed.kind == self.instant_type and kind.startswith("timestamp"):
            return (f"{name} is {kind}, not {self.instant_type} (a TIMESTAMP takes the "
                    "library's UTC instants as times of the session's time_zone, so a session "
                    "in another zone reads them shifted, and it ends in 2038; run the repair "
                    "in a session with time_zone '+00:00')",
                    self.modify_column.format(name=name, definition=needed.definition))
        return None
    #: The claim's level when the session's would break it: SERIALIZABLE claimers wait for
    #: each other and deadlock, REPEATABLE READ does not (``_session.claim_transaction``).
    claim_level = "REPEATABLE READ"
    refused_claim_levels = frozenset({"SERIALIZABLE"})
    claim_refusal = "claimers would wait for each other and deadlock"

    def claim_level_for(self, session_level: str) -> str | None:
        """The level the relay's own claim transaction must ask for, or None (the
        session's will do)."""
        return self.claim_level if session_level in self.refused_claim_levels else None

    @staticmethod
    def table_state(database: pw.Database, table: str, execute: Any) -> tuple[bool, bool]:
        """(whether ``table`` exists, whether the user may read it). information_schema
        hides a table the user holds no privilege on, so this asks the table itself: the
        server answers 1146 only to a user who may know, and 1142 (raised) to one who may not
        read it."""
        try:
            execute(sql.TABLE_PROBES[table], ())
        except (pw.ProgrammingError, pw.OperationalError) as exc:
            if errno_of(exc) == ER_NO_SUCH_TABLE:
                return False, False
            raise
        return True, True

    @staticmethod
    def lock_counters(database: pw.Database) -> LockCounters:
        """The server's deadlock and row-lock-wait counters (the contention suite's)."""
        query = peewee_query(database)
        return server_of(query).lock_counters(query)

    url_class: type[DatabaseUrl]

    #: The type information_schema gives an instant's column (with microseconds).
    instant_type = "datetime(6)"
    #: What each table needs, column by column (the migrations' result).
    schema_columns = {
        "outbox_event": {
            "id": Column("BIGINT NOT NULL AUTO_INCREMENT", "bigint", False),
            "event_type": Column("VARCHAR(255) NOT NULL", "varchar(255)", False),
            "aggregate_type": Column(f"VARCHAR(255) {_EXACT} NOT NULL", "varchar(255)", True,
                                     True),
            "aggregate_id": Column(f"VARCHAR(255) {_EXACT} NOT NULL", "varchar(255)", True,
                                   True),
            "dedupe_key": Column(f"VARCHAR(255) {_EXACT} NOT NULL", "varchar(255)", True),
            "payload": Column("JSON NOT NULL", "", False),
            "status": Column("VARCHAR(16) NOT NULL DEFAULT 'pending'", "varchar(16)", False),
            "attempt_count": Column("INT UNSIGNED NOT NULL DEFAULT 0", "int", False),
            "available_at": Column("DATETIME(6) NOT NULL", _INSTANT, False),
            "locked_at": Column("DATETIME(6) NULL", _INSTANT, False),
            "locked_by": Column(f"VARCHAR(255) {_EXACT} NULL", "varchar(255)", True),
            "published_at": Column("DATETIME(6) NULL", _INSTANT, False),
            "last_error_code": Column(f"VARCHAR(64) {_EXACT} NULL", "varchar(64)", True, True),
            "last_error_message": Column("TEXT NULL", "text", False),
            "created_at": Column("DATETIME(6) NOT NULL", _INSTANT, False),
            "updated_at": Column("DATETIME(6) NOT NULL", _INSTANT, False),
            # Migration 006 (SPEC §11); a missing one is ``outbox-lite migrate``'s to add.
            "headers": Column("JSON NULL", "", False, True),
            "expires_at": Column("DATETIME(6) NULL", _INSTANT, False, True),
        },
        "inbox_message": {
            "consumer": Column(f"VARCHAR(64) {_EXACT} NOT NULL", "varchar(64)", True),
            "message_id": Column(f"VARCHAR(704) {_EXACT} NOT NULL", "varchar(704)", True),
            "received_at": Column("DATETIME(6) NOT NULL", _INSTANT, False),
        },
    }


FAMILY = MySQLFamily()


# ---------------------------------------------------------------------------
# URLs: mysql://
# ---------------------------------------------------------------------------

_MAX_TIMEOUT = 31_536_000  # PyMySQL's own limit for connect_timeout, one year
FORM = ("expected mysql://user[:password]@host[:port]/database[?option=value&...], with "
        "the user and password percent-encoded (% as %25; / # ? @ may be written as they are)")


def _seconds(name: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= _MAX_TIMEOUT:
        raise DatabaseUrlError(
            f"URL parameter {name} must be a number of seconds above 0 and at most "
            f"{_MAX_TIMEOUT}")
    return int(seconds) if seconds.is_integer() else seconds


def _charset(name: str, value: str) -> str:
    if value.lower() != "utf8mb4":
        raise DatabaseUrlError(f"URL parameter {name} must be utf8mb4 (events are stored as it)")
    return "utf8mb4"


#: The query parameters a URL may carry, named as PyMySQL names them, with their readers.
OPTIONS: dict[str, Callable[[str, str], Any]] = {
    "ssl_ca": text_option, "ssl_cert": text_option, "ssl_key": text_option,
    "ssl_key_password": text_option, "ssl_verify_cert": flag_option,
    "ssl_verify_identity": flag_option, "ssl_disabled": flag_option,
    "charset": _charset, "connect_timeout": _seconds, "read_timeout": _seconds,
    "write_timeout": _seconds, "multi_statements": flag_option,
}


class MySQLUrl(DatabaseUrl):
    """A parsed ``mysql://`` URL; ``str()`` never shows the password."""

    scheme = "mysql"
    default_port = 3306
    default_user = "root"
    form = FORM
    OPTIONS = OPTIONS
    secret_options = frozenset({"ssl_key_password"})
    file_options = ("ssl_ca", "ssl_cert", "ssl_key")

    @classmethod
    def _check_options(cls, options: dict[str, Any]) -> None:
        if options.get("ssl_verify_identity") and options.get("ssl_verify_cert") is False:
            raise DatabaseUrlError("URL parameter ssl_verify_identity=true checks the "
                                   "certificate: it cannot go with ssl_verify_cert=false")
        if options.get("ssl_verify_identity") and "ssl_ca" not in options:
            # PyMySQL turns the host name check off when no CA file is given (check_hostname
            # = not hasnoca and ...): the asked-for check would silently not happen.
            raise DatabaseUrlError("URL parameter ssl_verify_identity=true needs ssl_ca "
                                   "(PyMySQL checks the host name only against a CA file it "
                                   "is given; the system's CAs: "
                                   "ssl_ca=/etc/ssl/certs/ca-certificates.crt)")

    def _params(self) -> dict[str, Any]:
        options = dict(self.options)
        if options.get("ssl_verify_identity"):
            # The name is checked on a verified certificate only (MySQL's VERIFY_IDENTITY
            # includes VERIFY_CA): PyMySQL 1.2 implies it, 1.1 raises ValueError without it.
            options["ssl_verify_cert"] = True
        if options.pop("multi_statements", False):
            # Lets the keyed write at REPEATABLE READ travel as one packet (READ_THEN_INSERT);
            # off by default, as in PyMySQL: it also lets one execute() run several statements.
            options["client_flag"] = _MULTI_STATEMENTS
        return {"host": self.host, "port": self.port, "user": self.user,
                "password": self.password, "charset": "utf8mb4", "connect_timeout": 5,
                **options}

    def database(self, database_class: Any = None, **kwargs: Any) -> Any:
        """A Peewee database for this URL (connects lazily), of ``database_class`` (default
        :class:`MySQLDatabase`; e.g. PooledMySQLDatabase); ``kwargs`` add to or override the
        URL's connection options. A URL listing several hosts gives that class with
        :class:`FirstWritable` mixed in: each connection goes to the first host that answers
        and can take writes."""
        kind = MySQLDatabase if database_class is None else database_class
        if not self.hosts:
            return kind(self.name, **{**self._params(), **kwargs})
        database = first_writable(kind)(self.name, **{**self._params(), **kwargs})
        database.hosts = self.hosts
        return database

    def server_connection(self) -> pymysql.connections.Connection:
        """A plain PyMySQL connection to the server, no database selected (the first host of
        a URL listing several that answers)."""
        params = self._params()
        for host, port in self.addresses[:-1]:
            try:
                return pymysql.connect(autocommit=True, **{**params, "host": host, "port": port})
            except pymysql.MySQLError as exc:
                if FAMILY.connection_trouble(exc) is None:
                    raise
        host, port = self.addresses[-1]
        return pymysql.connect(autocommit=True, **{**params, "host": host, "port": port})

    def exists(self) -> bool:
        """Whether the database exists on the server. A database the user has no privilege
        on is hidden from it, whether it exists or not: then the server's access-denied error
        (1044) is raised rather than a False that may be untrue."""
        conn = self.server_connection()
        try:
            with conn.cursor() as cur:
                if self._listed(cur):
                    return True
                try:  # 1049 only for a user who may know; 1044 for one who may not
                    cur.execute(f"USE `{self.name}`")
                except pymysql.MySQLError as exc:
                    if errno_of(exc) == ER_BAD_DB_ERROR:
                        return False
                    raise
                return True
        finally:
            conn.close()

    LISTED_SQL = "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s"
    CREATE_SQL = "CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
    DROP_SQL = "DROP DATABASE IF EXISTS `{name}`"

    def created_meanwhile(self, error: Exception) -> bool:
        return isinstance(error, pymysql.MySQLError) and errno_of(error) == ER_DB_CREATE_EXISTS


MySQLFamily.url_class = MySQLUrl
MySQLUrl.family = FAMILY
