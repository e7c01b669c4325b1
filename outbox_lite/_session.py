"""The session a statement of the library runs in, as the server says it is.

Peewee assumes every connection is in autocommit and PyMySQL believes the handshake's status
flag, but the flag can say "autocommit" while the session's is off: MySQL's handshake reports
it on even when the server's default (``--autocommit=0``) is off, and on both servers
``init_connect='SET autocommit=0'`` turns it off after the handshake for ordinary accounts.
Then every statement opens a transaction that nothing ever commits. So the first time the
library uses a connection it asks the server (one ``SELECT``; the answer is kept per
connection object, so a pooled connection is asked once), and outside the caller's
transaction it turns autocommit on (``SET autocommit = 1``, which also commits what the
session had left open), with one warning per database. Inside the caller's transaction it
changes nothing: the caller's ``atomic()`` ends that transaction, and the next statement the
library runs outside it turns autocommit on.

The answer also gives the session's isolation level, which the claim needs
(:func:`claim_isolation`, :func:`claim_transaction`).

The same statement asks what else a new connection needs once (issue 30: one round trip, not
four): on MySQL its ``max_allowed_packet`` (kept on the connection by the family); the
server's clock, for a database whose :class:`~outbox_lite._clock.ServerClock` asked for it
(:func:`read_clock_too`; the clock takes the reading with :func:`take_clock`); and, when the
schema check is what opens the connection (:func:`ask`), the tables' columns.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import peewee as pw

from ._families import family_of

logger = logging.getLogger(__name__)

SERIALIZABLE = "SERIALIZABLE"


@dataclass
class Session:
    """What the server answered for one connection (levels as ``REPEATABLE READ``)."""

    autocommit: bool
    isolation: str
    #: The server, as the connection's handshake named it (no statement asked): the family's
    #: description of it (for MySQL, :class:`~outbox_lite._families.mysql_server.Server`).
    server: Any
    #: The server's clock as the question read it (naive UTC, and ``time.monotonic()`` at
    #: the middle of its round trip) until the clock takes it (:func:`take_clock`).
    clock: tuple[Any, float] | None = None


#: Each connection's Session is kept on the connection object, in this attribute (one
#: ``getattr`` a statement, where a WeakKeyDictionary made a weak reference to look it up);
#: a connection object that takes no attribute keeps it in ``_sessions``.
_ATTRIBUTE = "_outbox_lite_session"
_sessions: "weakref.WeakKeyDictionary[Any, Session]" = weakref.WeakKeyDictionary()
_warned: "weakref.WeakSet[pw.Database]" = weakref.WeakSet()
#: The databases whose server clock reads the clock with the session question.
_clocked: "weakref.WeakSet[pw.Database]" = weakref.WeakSet()
_lock = threading.Lock()


def level(text: str) -> str:
    """An isolation level as SQL writes it: ``REPEATABLE-READ`` -> ``REPEATABLE READ``."""
    return " ".join(text.replace("-", " ").replace("_", " ").upper().split())


def _connection(database: pw.Database) -> Any:
    """The calling thread's connection, opened as Peewee's ``cursor()`` would open it (not at
    all when the database was made with ``autoconnect=False``)."""
    if database.is_closed() and not getattr(database, "autoconnect", True):
        raise pw.InterfaceError("Error, database connection not opened.")
    return database.connection()


def _ask(database: pw.Database, tables: Sequence[str] | None = None,
         ) -> tuple[Any, Session, list[tuple[Any, ...]] | None]:
    """Ask the server about the calling thread's connection: one round trip, which reads the
    clock too for a database whose clock asked for it, and the columns of ``tables``."""
    answer = family_of(database).ask_session(
        database, _connection(database), clock=database in _clocked, tables=tables)
    session = Session(autocommit=answer.autocommit, isolation=level(answer.isolation),
                      server=answer.server)
    if answer.clock is not None and answer.monotonic is not None:
        session.clock = (answer.clock, answer.monotonic)
    conn = database.connection()  # the one that answered (ReconnectMixin may replace one)
    _keep(conn, session)
    return conn, session, answer.columns


def _keep(conn: Any, session: Session) -> None:
    """Keep ``session`` as what the server answered for ``conn``."""
    try:
        setattr(conn, _ATTRIBUTE, session)
    except (AttributeError, TypeError):  # a connection type with no room for it
        with _lock:
            _sessions[conn] = session


def _kept(conn: Any) -> Session | None:
    """The Session asked for ``conn``, or None when it has not been asked about."""
    session = getattr(conn, _ATTRIBUTE, None)
    # a dict read, atomic under the GIL; writes take the lock
    return session if session is not None else _sessions.get(conn)


def prepare(database: pw.Database) -> Any:
    """Before a statement of the library's: make sure the calling thread's connection to
    ``database`` was asked about (the first time it is used) and, when no transaction of the
    caller's is open, is in autocommit. Returns that connection.

    Raises Peewee's errors for a connection that cannot be had or used."""
    # Runs before every statement of the library's: _connection and _kept written out here.
    if database.is_closed() and not getattr(database, "autoconnect", True):
        raise pw.InterfaceError("Error, database connection not opened.")
    conn = database.connection()
    session = getattr(conn, _ATTRIBUTE, None)
    if session is None:
        session = _sessions.get(conn)
        if session is None:
            conn, session, _ = _ask(database)
    if not session.autocommit:
        _autocommit(database, session)
    return conn


def ask(database: pw.Database, tables: Sequence[str]) -> list[tuple[Any, ...]] | None:
    """:func:`prepare`, and when the calling thread's connection is a new one, the columns
    of ``tables`` read by the same round trip (rows as the family's ``SCHEMA_COLUMNS`` reads
    them); None when the connection had been asked about before."""
    conn = _connection(database)
    session = _kept(conn)
    columns = None
    if session is None:
        conn, session, columns = _ask(database, tables)
    _autocommit(database, session)
    return columns


def _autocommit(database: pw.Database, session: Session) -> None:
    if not session.autocommit and not database.in_transaction():
        database.execute_sql(family_of(database).sql.AUTOCOMMIT_ON)
        session.autocommit = True
        _warn(database)


def read_clock_too(database: pw.Database) -> None:
    """Have every new connection's question to ``database`` read the server's clock too."""
    with _lock:
        _clocked.add(database)


def take_clock(database: pw.Database) -> tuple[Any, float] | None:
    """The clock reading the question of the calling thread's connection made and no one has
    taken yet ((naive UTC instant, monotonic time at the middle of its round trip)), or
    None."""
    session = _kept(database.connection())
    if session is None:
        return None
    with _lock:
        reading, session.clock = session.clock, None
    return reading


def session_of(database: pw.Database) -> Session:
    """What the server answered for the calling thread's connection (asked when not yet)."""
    session = _kept(prepare(database))
    assert session is not None  # prepare() asked
    return session


def _warn(database: pw.Database) -> None:
    with _lock:
        if database in _warned:
            return
        _warned.add(database)
    params = getattr(database, "connect_params", {})
    logger.warning(
        "sessions on %s:%s/%s start with autocommit off (the server's default autocommit=0, "
        "or its init_connect): outbox_lite turns autocommit on for each connection it uses "
        "outside a transaction, or nothing it writes there would commit",
        params.get("host", "localhost"), params.get("port", 3306), database.database)


def claim_isolation(database: pw.Database) -> str:
    """The isolation level of the caller's open transaction on ``database`` (for the claim
    and for the write, :func:`transaction_isolation`): the level
    given to ``atomic(isolation_level=...)`` when there was one, else the session's. (A level
    set with a bare ``SET TRANSACTION`` statement is not visible to the server's
    variables, so not to this.)"""
    begun = getattr(database.top_transaction(), "_begin_args", None)  # Peewee 3.17+ and 4
    if begun is not None:
        args, kwargs = begun
        given = kwargs.get("isolation_level", args[0] if args else None)
        if isinstance(given, str) and given:
            return level(given)
    return session_of(database).isolation


def claim_transaction(database: pw.Database) -> Any:
    """``database.atomic()`` for a claim of the library's own (the relay's), at the level
    the family asks for when the session's would break the claim: on MySQL REPEATABLE READ
    when the session's level is SERIALIZABLE (claimers would wait for each other and
    deadlock); on PostgreSQL READ COMMITTED unless it is already (at REPEATABLE READ and
    SERIALIZABLE concurrent claims fail with serialization errors). The level applies to
    that transaction only. A COMMIT the server refuses for a conflict (a cluster's
    certification failure: Galera's 1213, Group Replication's 3101 or 1180; a serialization
    failure) raises LockConflictError, as a conflict inside the block does: the server has
    rolled the whole transaction back. One refused for its size (a cluster's write-set
    limit) raises WriteSetTooLargeError."""
    family = family_of(database)
    level = family.claim_level_for(session_of(database).isolation)
    atomic = database.atomic() if level is None else database.atomic(isolation_level=level)
    return _RefusedCommitIsConflict(atomic, family)


class _RefusedCommitIsConflict:
    """A transaction's context manager whose COMMIT, refused for a conflict, raises the
    family's LockConflictError (chained to the driver's error) instead of Peewee's."""

    __slots__ = ("_atomic", "_family")

    def __init__(self, atomic: Any, family: Any) -> None:
        self._atomic, self._family = atomic, family

    def __enter__(self) -> Any:
        return self._atomic.__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        if exc_type is not None:
            return self._atomic.__exit__(exc_type, exc, tb)
        try:
            return self._atomic.__exit__(None, None, None)  # the COMMIT
        except (pw.OperationalError, pw.InternalError) as refused:
            conflict = (self._family.lock_conflict(refused)
                        or self._family.write_set_too_large(refused))
            if conflict is None:
                raise
            raise conflict from refused


#: The isolation level of the caller's open transaction (the write asks it too).
transaction_isolation = claim_isolation
