"""The database plumbing: ``mysql://`` URLs for the command line and the contention suite, and
the one rule for a connection that broke (:func:`lost_connection`, :func:`reconnect`), and
:func:`execute`, which runs one statement of the repository or the inbox under those rules.

A URL's password is never shown: errors about a URL quote none of its text, and ``str()``
masks the password (and ``ssl_key_password``). :func:`tls_failure` says in one line why a
connection's TLS failed (a certificate the client would not trust, a server without TLS).
"""

from __future__ import annotations

import logging
import math
import os
import re
import ssl
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence
from urllib.parse import quote, unquote

import peewee as pw
import pymysql

from . import _session
from ._compat import MySQLDatabase
from .errors import ConnectionLostError, LockConflictError, OutboxError, driver_errno

logger = logging.getLogger(__name__)

DEFAULT_URL = "mysql://root@127.0.0.1:3306/outbox_lite"
_NAME_RE = re.compile(r"[A-Za-z0-9_$]{1,64}")
_FORM = ("expected mysql://user[:password]@host[:port]/database[?option=value&...], with "
         "the user and password percent-encoded (% as %25; / # ? @ may be written as they are)")


class DatabaseUrlError(ValueError):
    """The URL is not ``mysql://user[:password]@host[:port]/database[?options]``."""


class DatabaseExistsError(OutboxError):
    """The database to create for a run exists already (and may hold someone's data)."""


# ---------------------------------------------------------------------------
# URLs
# ---------------------------------------------------------------------------

# Everything after the userinfo: what a password cannot be confused with, since the
# userinfo is taken up to the last '@' that leaves such a tail.
_TAIL_RE = re.compile(
    r"(?P<host>\[[0-9A-Fa-f:.]*\]|[^:/?#@\[\]]*)"
    r"(?::(?P<port>[^/?#@]*))?"
    r"(?:/(?P<name>[^/?#@]*))?"
    r"(?:\?(?P<query>[^#]*))?")
_HOST_RE = re.compile(r"[A-Za-z0-9._-]{1,255}|\[[0-9A-Fa-f:.]{2,45}\]")
_BAD_PERCENT_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_OPTION_NAME_RE = re.compile(r"[A-Za-z_]{1,40}")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_MAX_TIMEOUT = 31_536_000  # PyMySQL's own limit for connect_timeout, one year


def _text(name: str, value: str) -> str:
    if not value:
        raise DatabaseUrlError(f"URL parameter {name} must not be empty")
    return value


def _flag(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise DatabaseUrlError(f"URL parameter {name} must be true or false")


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
    "ssl_ca": _text, "ssl_cert": _text, "ssl_key": _text, "ssl_key_password": _text,
    "ssl_verify_cert": _flag, "ssl_verify_identity": _flag, "ssl_disabled": _flag,
    "charset": _charset, "connect_timeout": _seconds, "read_timeout": _seconds,
    "write_timeout": _seconds,
}
_SECRET_OPTIONS = frozenset({"ssl_key_password"})
_FILE_OPTIONS = ("ssl_ca", "ssl_cert", "ssl_key")


def _decode(part: str, what: str) -> str:
    if _BAD_PERCENT_RE.search(part):
        raise DatabaseUrlError(
            f"the {what} holds a % that does not start a percent-escape: write % as %25; "
            f"{_FORM}")
    try:
        return unquote(part, errors="strict")
    except UnicodeDecodeError:
        raise DatabaseUrlError(f"the {what}'s percent-escapes are not UTF-8; {_FORM}") from None


def _options(query: str) -> tuple[tuple[str, Any], ...]:
    options: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        raw_name, has_value, raw_value = item.partition("=")
        name = _decode(raw_name, "URL parameter's name")
        if name not in OPTIONS:
            shown = name if _OPTION_NAME_RE.fullmatch(name) else "(not a parameter name)"
            raise DatabaseUrlError(
                f"unknown URL parameter {shown}; supported: {', '.join(OPTIONS)}")
        if name in options:
            raise DatabaseUrlError(f"URL parameter {name} is given twice")
        if not has_value:
            raise DatabaseUrlError(f"URL parameter {name} needs a value ({name}=...)")
        options[name] = OPTIONS[name](name, _decode(raw_value, f"value of {name}"))
    if options.get("ssl_verify_identity") and options.get("ssl_verify_cert") is False:
        raise DatabaseUrlError("URL parameter ssl_verify_identity=true checks the certificate:"
                               " it cannot go with ssl_verify_cert=false")
    if options.get("ssl_verify_identity") and "ssl_ca" not in options:
        # PyMySQL turns the host name check off when no CA file is given (check_hostname =
        # not hasnoca and ...): the asked-for check would silently not happen.
        raise DatabaseUrlError("URL parameter ssl_verify_identity=true needs ssl_ca (PyMySQL "
                               "checks the host name only against a CA file it is given; the "
                               "system's CAs: ssl_ca=/etc/ssl/certs/ca-certificates.crt)")
    return tuple(sorted(options.items()))


def _split(rest: str) -> tuple[str | None, re.Match[str] | None]:
    """The userinfo (None when absent) and the tail's match: the userinfo runs to the last
    '@' that leaves a well-formed tail naming a valid database, so a password may hold
    unencoded / # ? @ characters."""
    candidates = [i for i, char in enumerate(rest) if char == "@"][::-1]
    first: tuple[str | None, re.Match[str] | None] = (None, None)
    for at in [*candidates, -1]:
        match = _TAIL_RE.fullmatch(rest[at + 1:])
        if match is None:
            continue
        userinfo = rest[:at] if at >= 0 else None
        if first[1] is None:
            first = (userinfo, match)
        name, port = match["name"], match["port"]
        if (name and _NAME_RE.fullmatch(name) and (not port or port.isdigit())
                and (not match["host"] or _HOST_RE.fullmatch(match["host"]))):
            return userinfo, match
    return first


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed ``mysql://`` URL; ``str()`` never shows the password."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    name: str
    #: (name, value) pairs of the URL's query parameters, PyMySQL connection arguments.
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, url: str) -> "DatabaseUrl":
        """Read ``mysql://user[:password]@host[:port]/database[?option=value&...]``.

        Raises DatabaseUrlError, whose message quotes no part of ``url``.
        """
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() != "mysql":
            shown = f" {scheme!r}" if sep and _OPTION_NAME_RE.fullmatch(scheme) else ""
            raise DatabaseUrlError(f"unsupported URL scheme{shown}; {_FORM}")
        userinfo, match = _split(rest)
        if match is None:
            raise DatabaseUrlError(f"bad database URL; {_FORM}")
        port_text, name = match["port"], match["name"]
        if port_text and not (port_text.isdigit() and 1 <= int(port_text) <= 65535):
            raise DatabaseUrlError(f"bad database URL: the port must be a number from 1 to "
                                   f"65535; {_FORM}")
        host = match["host"]
        if host and not _HOST_RE.fullmatch(host):
            raise DatabaseUrlError(f"bad database URL: the host is not a host name or an IP "
                                   f"address; {_FORM}")
        if not name or not _NAME_RE.fullmatch(name):
            raise DatabaseUrlError(
                f"the database name must be 1-64 letters, digits, _ or $; {_FORM}")
        user, password = "", ""
        if userinfo is not None:
            raw_user, _, raw_password = userinfo.partition(":")
            user = _decode(raw_user, "user name")
            password = _decode(raw_password, "password")
        return cls(host=host.strip("[]") or "127.0.0.1", port=int(port_text or 3306),
                   user=user or "root", password=password, name=name,
                   options=_options(match["query"] or ""))

    def with_name(self, name: str) -> "DatabaseUrl":
        if not _NAME_RE.fullmatch(name):
            raise DatabaseUrlError(f"bad database name {name!r}")
        return DatabaseUrl(self.host, self.port, self.user, self.password, name, self.options)

    def __str__(self) -> str:  # never shows the password
        auth = self.user + (":***" if self.password else "")
        host = f"[{self.host}]" if ":" in self.host else self.host
        query = "&".join(f"{k}={'***' if k in _SECRET_OPTIONS else v}" for k, v in self.options)
        return f"mysql://{auth}@{host}:{self.port}/{self.name}" + (f"?{query}" if query else "")

    def secret_text(self) -> str:
        """The URL in full, password included (percent-encoded): for handing to a child
        process, never for showing. ``DatabaseUrl.parse`` reads it back to an equal URL."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}"
                                            if self.password else "")
        host = f"[{self.host}]" if ":" in self.host else self.host
        query = "&".join(f"{k}={str(v).lower() if isinstance(v, bool) else quote(str(v))}"
                         for k, v in self.options)
        return f"mysql://{auth}@{host}:{self.port}/{self.name}" + (f"?{query}" if query else "")

    def unreadable_files(self) -> list[str]:
        """The options among ``ssl_ca``, ``ssl_cert``, ``ssl_key`` whose file this process
        cannot read (PyMySQL's own error names neither the option nor the file)."""
        options = dict(self.options)
        return [name for name in _FILE_OPTIONS
                if name in options and not os.access(options[name], os.R_OK)]

    def _params(self) -> dict[str, Any]:
        options = dict(self.options)
        if options.get("ssl_verify_identity"):
            # The name is checked on a verified certificate only (MySQL's VERIFY_IDENTITY
            # includes VERIFY_CA): PyMySQL 1.2 implies it, 1.1 raises ValueError without it.
            options["ssl_verify_cert"] = True
        return {"host": self.host, "port": self.port, "user": self.user,
                "password": self.password, "charset": "utf8mb4", "connect_timeout": 5,
                **options}

    def database(self, database_class: type[pw.MySQLDatabase] = MySQLDatabase,
                 **kwargs: Any) -> pw.MySQLDatabase:
        """A Peewee database for this URL (connects lazily), of ``database_class`` (e.g.
        PooledMySQLDatabase); ``kwargs`` add to or override the URL's connection options."""
        return database_class(self.name, **{**self._params(), **kwargs})

    def server_connection(self) -> pymysql.connections.Connection:
        """A plain PyMySQL connection to the server, no database selected."""
        return pymysql.connect(autocommit=True, **self._params())

    def exists(self) -> bool:
        """Whether the database exists on the server. A database the user has no privilege
        on is hidden from it, whether it exists or not: then the server's access-denied error
        (1044) is raised rather than a False that may be untrue."""
        conn = self.server_connection()
        try:
            with conn.cursor() as cur:
                if self._exists(cur):
                    return True
                try:  # 1049 only for a user who may know; 1044 for one who may not
                    cur.execute(f"USE `{self.name}`")
                except pymysql.MySQLError as exc:
                    if driver_errno(exc) == 1049:  # ER_BAD_DB_ERROR
                        return False
                    raise
                return True
        finally:
            conn.close()

    def _exists(self, cur: Any) -> bool:
        cur.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
                    (self.name,))
        return cur.fetchone() is not None

    def create_database(self, *, exclusive: bool = False) -> bool:
        """Create the database when missing; True when it was created. With ``exclusive``
        an existing database raises DatabaseExistsError instead. (A user without the right
        to create databases can still use one that exists.)"""
        conn = self.server_connection()
        try:
            with conn.cursor() as cur:
                if not self._exists(cur):
                    try:  # no IF NOT EXISTS: of two runs racing, only one creates it
                        cur.execute(f"CREATE DATABASE `{self.name}`"
                                    " CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
                        return True
                    except pymysql.MySQLError as exc:
                        if driver_errno(exc) != 1007:  # ER_DB_CREATE_EXISTS
                            raise
            if exclusive:
                raise DatabaseExistsError(f"database {self.name} exists already")
            return False
        finally:
            conn.close()

    def drop_database(self) -> None:
        conn = self.server_connection()
        try:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")
        finally:
            conn.close()


# ---------------------------------------------------------------------------
# Broken connections
# ---------------------------------------------------------------------------

#: What a caller catches for a broken or missing connection: ConnectionLostError from the
#: repository's calls; Peewee's OperationalError and InterfaceError from the caller's own
#: statements and from ``atomic()``, whose BEGIN, COMMIT or ROLLBACK meets the dead
#: connection (a ROLLBACK after a lost connection raises ``InterfaceError(0, '')``).
CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    ConnectionLostError, pw.OperationalError, pw.InterfaceError)

#: Driver errors that mean the connection is gone: server gone away / lost during a query /
#: lost reading the handshake (2006, 2013, 2055), killed (MariaDB 1927), disconnected for
#: inactivity (MySQL 4031).
_LOST = frozenset({2006, 2013, 2055, 1927, 4031})
#: Driver errors that mean no connection could be opened: the server is not reachable.
_UNREACHABLE = frozenset({2002, 2003})
#: Also worth a reconnect: the server is shutting down (1053), or full for now (1040).
_GOING = frozenset({1040, 1053})


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` means the connection is gone or cannot be opened now: the remedy is
    :func:`reconnect` (outside any transaction) and a retry, not a fix of the code."""
    if isinstance(exc, (ConnectionLostError, pw.InterfaceError)):
        return True
    return isinstance(exc, pw.OperationalError) and driver_errno(exc) in (
        _LOST | _UNREACHABLE | _GOING)


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
    errno = driver_errno(exc)
    never_opened = (isinstance(exc, pw.InterfaceError) and database.is_closed()
                    and not getattr(database, "deferred", False))
    if never_opened:
        return ConnectionLostError(
            "no connection to the server is open and the database was made with "
            "autoconnect=False: call database.connect() (or outbox_lite.reconnect(database))"
            " before using the outbox")
    if errno in _UNREACHABLE:
        tls = tls_failure(exc)
        if tls is not None:  # no later try helps: the URL's ssl_ options must change
            return ConnectionLostError(f"cannot open a connection to the server: {tls}")
        return ConnectionLostError(f"cannot reach the server ({exc}); try again later")
    if not (errno in _LOST or isinstance(exc, pw.InterfaceError)):
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
    although the URL asks for it (2026). None for any other failure."""
    for cause in _chain(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            why = str(cause.verify_message).rstrip(".")
            hint = ("ssl_verify_identity needs a certificate issued for the URL's host"
                    if "mismatch" in why else
                    "ssl_ca must name the CA file that signed the server's certificate")
            return f"certificate verify failed: {why} ({hint})"
        if isinstance(cause, ssl.SSLError):
            return f"TLS failed: {cause.reason or cause.strerror or type(cause).__name__}"
        if driver_errno(cause) == 2026:  # CR_SSL_CONNECTION_ERROR
            return ("the server offers no TLS, and the URL asks for it (ssl_ca, ssl_cert, "
                    "ssl_key, ssl_verify_cert or ssl_verify_identity)")
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
    (:mod:`outbox_lite._session`). A deadlock (1213) or a lock-wait timeout (1205) raises
    LockConflictError; a broken connection raises :func:`lost_connection`'s
    ConnectionLostError; anything else Peewee's own error."""
    try:
        conn = _session.prepare(database)
        cursor = database.execute_sql(sql, params)
        _session.settled(database, conn)
        return cursor
    except (pw.OperationalError, pw.InternalError, pw.InterfaceError) as exc:
        errno = driver_errno(exc)
        if errno in (1205, 1213):
            raise LockConflictError(errno, str(getattr(exc, "orig", exc))) from exc
        lost = lost_connection(database, exc)
        if lost is not None:
            raise lost from exc
        raise
