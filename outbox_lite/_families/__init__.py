"""The database seam: one place per family of servers, chosen once per database object.

A family (peewee's ``Database`` subclasses, huey's storage classes and procrastinate's
connector are the models) owns everything that differs between servers: its statements (a
module of :class:`Statement` constants, the same names in every family), how its driver's
errors read (a duplicate key with the constraint it hit, a lock conflict, a lost or refused
connection, a missing table or privilege), the id an INSERT gives back, matched-row counts,
the database-object check, its URL scheme and TLS options, creating and dropping a database,
what a new connection's session is, the server's clock, and what the contention suite and
the tests ask the server. The repository, the inbox, the relay, the CLI and the contention
suite call :func:`family_of` once and never branch on the answer.

Families: :mod:`.mysql` (MySQL and MariaDB; MariaDB a flag of the server, as peewee's
``MySQLDatabase`` has its ``mariadb``) and :mod:`.postgresql`, each fulfilling the contract
of :mod:`.contract` and :mod:`.url` and importing nothing above it. This module is the one
table that names them (:data:`FAMILIES`), as ``playhouse.db_url`` names peewee's databases:
a family never imports it back.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import peewee as pw

from . import mysql, postgresql
from .contract import Family
from .url import DatabaseUrl

#: The families, the one table that names them (in the order an error lists their URLs'
#: forms). A new family is a module set beside these and one more entry here.
FAMILIES: tuple[Family, ...] = (mysql.FAMILY, postgresql.FAMILY)
DatabaseUrl.kinds.update((scheme, family.url_class)  # type: ignore[attr-defined]
                         for family in FAMILIES for scheme in family.schemes)
_CHOSEN: "weakref.WeakKeyDictionary[pw.Database, Family]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def family_of(database: Any) -> Any:
    """The family of a Peewee ``database`` (checked and chosen once per object).

    Raises TypeError for a database no family takes, and what the family's own check
    raises (ValueError for a MySQL connection whose charset is not utf8mb4)."""
    try:
        return _CHOSEN[database]
    except (KeyError, TypeError):
        pass
    for family in FAMILIES:
        if family.accepts(database):
            family.check_database(database)  # type: ignore[attr-defined]
            try:
                with _LOCK:
                    _CHOSEN[database] = family
            except TypeError:  # not weakly referenceable: checked each time
                pass
            return family
    raise TypeError(
        "database must be a peewee MySQLDatabase (or a subclass: pooled, ReconnectMixin,"
        " ...) for MySQL or MariaDB, or a peewee PostgresqlDatabase (or a subclass: pooled,"
        f" PostgresqlExtDatabase, psycopg 3's) for PostgreSQL, not {type(database).__name__}")


def family_for_scheme(scheme: str) -> Any:
    """The family whose URLs start with ``scheme`` (any case), or None."""
    for family in FAMILIES:
        if scheme.lower() in family.schemes:
            return family
    return None


def driver_errors() -> tuple[type[BaseException], ...]:
    """Every installed family's driver base errors (what a command reports in one line)."""
    errors: list[type[BaseException]] = []
    for family in FAMILIES:
        errors.extend(family.driver_errors)  # type: ignore[attr-defined]
    return tuple(errors)


def connection_trouble(exc: BaseException) -> str | None:
    """What a driver error ``exc`` says of the connection, asked of every family (an error
    carries no database): ``"lost"``, ``"unreachable"``, ``"going"`` or None."""
    for family in FAMILIES:
        trouble = family.connection_trouble(exc)  # type: ignore[attr-defined]
        if trouble is not None:
            return trouble  # type: ignore[no-any-return]
    return None


def lock_conflict(exc: BaseException) -> Any:
    """The LockConflictError a driver error ``exc`` means, asked of every family (an error
    carries no database), or None when it is no lock conflict."""
    for family in FAMILIES:
        conflict = family.lock_conflict(exc)  # type: ignore[attr-defined]
        if conflict is not None:
            return conflict
    return None


def tls_refused(exc: BaseException) -> str | None:
    """Why TLS failed when ``exc`` is a server without the TLS a URL asks for (each family
    names its own URL options), or a TLS failure its family reads from its driver's words
    (a family's ``tls_refused`` answers True for the first, the why for the second), else
    None."""
    for family in FAMILIES:
        said = family.tls_refused(exc)  # type: ignore[attr-defined]
        if said:
            return said if isinstance(said, str) else family.no_tls  # type: ignore[attr-defined]
    return None
