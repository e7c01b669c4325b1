"""The one rule for a connection that broke (:func:`lost_connection`, :func:`reconnect`), and
:func:`execute`, which runs one statement of the library under those rules. What an error of
the driver means is the family's to say (:mod:`outbox_lite._families`); the URLs are the
families' too (:mod:`outbox_lite._families.url`).

:func:`tls_failure` says in one line why a connection's TLS failed (a certificate the client
would not trust, a server without TLS).
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, Sequence

import peewee as pw

from . import _session
from ._families import connection_trouble, driver_errors, family_of, lock_conflict, tls_refused
from .errors import (ConnectionLostError, LockConflictError, OutboxError, SchemaError,
                     WrongHostError)

__all__ = ["CONNECTION_ERRORS", "DEFAULT_URL", "execute", "is_connection_error", "is_retryable",
           "lost_connection", "reconnect", "tls_failure"]

logger = logging.getLogger(__name__)
#: Peewee's wrapper that turns a driver's error into Peewee's class of it (what execute_sql
#: raises), for the results read after execute_sql.
_PEEWEE_ERRORS = getattr(pw, "__exception_wrapper__")

DEFAULT_URL = "mysql://root@127.0.0.1:3306/outbox_lite"


# ---------------------------------------------------------------------------
# Broken connections
# ---------------------------------------------------------------------------

#: What a caller catches for a broken or missing connection: ConnectionLostError from the
#: repository's calls; Peewee's OperationalError and InterfaceError from the caller's own
#: statements and from ``atomic()``, whose BEGIN, COMMIT or ROLLBACK meets the dead
#: connection (a ROLLBACK after a lost connection raises ``InterfaceError(0, '')``).
CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    ConnectionLostError, pw.OperationalError, pw.InterfaceError)



def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` means the connection is gone or cannot be opened now: the remedy is
    :func:`reconnect` (outside any transaction) and a retry, not a fix of the code."""
    if isinstance(exc, (ConnectionLostError, pw.InterfaceError)):
        return True
    return isinstance(exc, pw.OperationalError) and connection_trouble(exc) is not None


def is_retryable(exc: BaseException) -> bool:
    """True when the server rolled ``exc``'s transaction back for a conflict with another
    transaction, so that running the whole transaction again is the remedy: a
    LockConflictError, or the driver's error (as Peewee raised it) for a deadlock, a lock-wait
    timeout, a serialization failure or a COMMIT a cluster refused (Galera's 1213, Group
    Replication's 3101 and 1180, PostgreSQL's 40001 and 40P01): what a service's own
    ``db.atomic()`` raises from its COMMIT. False for anything else, a lost connection
    included: a COMMIT whose answer was lost may have committed."""
    if isinstance(exc, LockConflictError):
        return True
    return (isinstance(exc, (pw.DatabaseError, *driver_errors()))
            and lock_conflict(exc) is not None)


def _drop(database: pw.Database) -> None:
    """Forget the calling thread's connection (a dead one may complain while closing)."""
    try:
        database.close()  # resets Peewee's connection state even when it raises
    except Exception:  # noqa: BLE001 - closing a dead connection may fail in many ways
        logger.debug("closing a broken connection failed", exc_info=True)


def lost_connection(database: pw.Database, exc: Exception) -> ConnectionLostError | None:
    """The ConnectionLostError to raise for a driver error ``exc`` that means there is no
    working connection, or None when ``exc`` means something else.

    Outside a transaction the broken connection is dropped first, so that with
    ``autoconnect=True`` the next call opens a new one; inside one it is left to the
    caller's ``atomic()`` block, which must end. The message says what to do next.
    """
    trouble = family_of(database).connection_trouble(exc)
    never_opened = (isinstance(exc, pw.InterfaceError) and database.is_closed()
                    and not getattr(database, "deferred", False))
    if never_opened:
        return ConnectionLostError(
            "no connection to the server is open and the database was made with "
            "autoconnect=False: call database.connect() (or outbox_lite.reconnect(database))"
            " before using the outbox")
    if trouble == "unreachable":
        tls = tls_failure(exc)
        if tls is not None:  # no later try helps: the URL's ssl_ options must change
            return ConnectionLostError(f"cannot open a connection to the server: {tls}")
        return ConnectionLostError(f"cannot reach the server ({exc}); try again later")
    if trouble == "wrong host":
        return _wrong_host(database, exc)
    if not (trouble == "lost" or isinstance(exc, pw.InterfaceError)):
        return None
    if database.in_transaction():
        return ConnectionLostError(
            f"lost the connection to the server inside a transaction ({exc}); the server "
            "rolled the transaction back: let the atomic() block end (Peewee's ROLLBACK on "
            "the dead connection raises peewee.InterfaceError), call "
            "outbox_lite.reconnect(database), then retry the whole transaction")
    _drop(database)
    if getattr(database, "autoconnect", True):
        return ConnectionLostError(
            f"lost the connection to the server ({exc}); the next call opens a new one")
    return ConnectionLostError(
        f"lost the connection to the server ({exc}); the database was made with "
        "autoconnect=False: call database.connect() (or outbox_lite.reconnect(database)) "
        "before the next call")


def _wrong_host(database: pw.Database, exc: Exception) -> WrongHostError:
    """The server answers but cannot take writes (read-only, a standby, a cluster node not
    ready): the connection is dropped (outside a transaction) so the next one goes to the
    next host of the URL, or, with one host, to the same one once it can."""
    hosts = family_of(database).host_count(database)
    then = ("the next connection goes to the first host of the URL that can" if hosts > 1 else
            "the URL names this one host only: wait until it can (a failover, a node synced)")
    if database.in_transaction():
        return WrongHostError(
            f"the server cannot take writes ({exc}); the transaction was not committed: let "
            f"the atomic() block end, call outbox_lite.reconnect(database), then retry; {then}")
    _drop(database)
    return WrongHostError(f"the server cannot take writes ({exc}); {then}")


def _chain(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and what it wraps: Peewee's ``orig``, then ``__cause__`` or ``__context__``."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        orig = getattr(exc, "orig", None)
        exc = orig if isinstance(orig, BaseException) else (exc.__cause__ or exc.__context__)
    return chain


def tls_failure(exc: BaseException) -> str | None:
    """Why TLS failed, when ``exc`` (or what it wraps) says it did, in one line with no
    secret: the certificate check's own words (``certificate verify failed: self-signed
    certificate in certificate chain``), the handshake's, or that the server offers no TLS
    although the URL asks for it. None for any other failure."""
    for cause in _chain(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            why = str(cause.verify_message).rstrip(".")
            hint = ("ssl_verify_identity needs a certificate issued for the URL's host"
                    if "mismatch" in why else
                    "ssl_ca must name the CA file that signed the server's certificate")
            return f"certificate verify failed: {why} ({hint})"
        if isinstance(cause, ssl.SSLError):
            return f"TLS failed: {cause.reason or cause.strerror or type(cause).__name__}"
        no_tls = tls_refused(cause)
        if no_tls is not None:
            return no_tls
    return None


def reconnect(database: pw.Database) -> bool:
    """Replace the calling thread's connection to ``database`` with a new one, after one of
    :data:`CONNECTION_ERRORS`. Returns True when connected, False when the server cannot be
    reached (or refuses the login) yet: call it again later.

    Works alike for ``autoconnect=True`` and ``False``, for pooled databases (a dead pooled
    connection is discarded when the pool next hands it out) and for ReconnectMixin. Call
    it outside any transaction: the caller's ``atomic()`` block must have ended (raises
    OutboxError otherwise, changing nothing).
    """
    if database.in_transaction():
        raise OutboxError(
            "reconnect() runs outside a transaction: let the atomic() block end first")
    _drop(database)
    try:
        database.connect()
    except (pw.OperationalError, pw.InterfaceError) as exc:
        logger.warning("reconnecting failed: %s", exc)
        _drop(database)
        return False
    return True


def execute(database: pw.Database, sql: str, params: Sequence[Any]) -> Any:
    """Run one statement on ``database`` and return its cursor. Outside the caller's
    transaction the statement commits on its own, whatever the session's autocommit was
    (:mod:`outbox_lite._session`). A lock conflict (the family says which errors are one:
    MySQL's deadlock and lock-wait timeout) raises LockConflictError; a broken connection
    raises :func:`lost_connection`'s ConnectionLostError; a database that does not exist (a
    connection opened here for it) SchemaError, as a missing table does; anything else
    Peewee's own error. A statement of several (a family's ``Statement`` whose ``results``
    is more than 1, sent as one packet) has each result read here, each refusal raised as
    the first one's would be; the cursor returned is on the last result."""
    try:
        conn = _session.prepare(database)
        cursor = database.execute_sql(sql, params)
        for _ in range(getattr(sql, "results", 1) - 1):
            with _PEEWEE_ERRORS:  # Peewee's error classes, as execute_sql raises them
                cursor.nextset()
        if database.connection() is not conn:
            # It ran on another connection (a ReconnectMixin database reconnects and retries
            # inside execute_sql): prepare that one now, so that a session with autocommit
            # off commits it (SET autocommit = 1 commits).
            _session.prepare(database)
        return cursor
    except (pw.OperationalError, pw.InternalError, pw.InterfaceError) as exc:
        ours = _translated(database, exc)
        if ours is exc:
            raise
        raise ours from exc


def ask(database: pw.Database, tables: Sequence[str] | None = None,
        ) -> list[tuple[Any, ...]] | None:
    """Open the calling thread's connection to ``database`` and, when it is a new one, ask
    the session question (:mod:`outbox_lite._session`), with the columns of ``tables``
    when given: those rows, or None when the connection had been asked already. Raises
    what :func:`execute` raises."""
    try:
        if tables is None:
            _session.prepare(database)
            return None
        return _session.ask(database, tables)
    except (pw.OperationalError, pw.InternalError, pw.InterfaceError) as exc:
        ours = _translated(database, exc)
        if ours is exc:
            raise
        raise ours from exc


def _translated(database: pw.Database, exc: Exception) -> Exception:
    """What :func:`execute` raises for the driver's error ``exc`` (``exc`` itself when it
    means nothing of ours)."""
    family = family_of(database)
    conflict = family.lock_conflict(exc) or family.write_set_too_large(exc)
    if conflict is not None:
        return conflict
    if family.missing_database(exc):
        return SchemaError(f"database {database.database} does not exist"
                           " (run: outbox-lite migrate)")
    lost = lost_connection(database, exc)
    if lost is not None:
        return lost
    return exc
