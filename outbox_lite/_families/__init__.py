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
``MySQLDatabase`` has its ``mariadb``) and :mod:`.postgresql`.
"""

from __future__ import annotations

import re
import threading
import weakref
from types import ModuleType
from typing import Any, ClassVar, Mapping, NamedTuple

import peewee as pw

_NAMED = re.compile(r"%\((\w+)\)s")


class Statement(str):
    """A statement written with named parameters (``%(name)s``) and sent as the driver's
    positional text (``%s``; both drivers take either): :meth:`bind` puts a mapping's values
    in the statement's order, so a call site names what it passes and never counts
    placeholders. A list of values for ``IN %(ids)s`` is given as a tuple and sent as one
    placeholder per value, ``IN (%s, %s, %s)``. ``named`` is the text as written."""

    names: tuple[str, ...]
    named: str
    _parts: list[str]
    _texts: dict[tuple[int, ...], str]

    def __new__(cls, text: str) -> "Statement":
        statement = super().__new__(cls, _NAMED.sub("%s", text))
        statement.names = tuple(_NAMED.findall(text))
        statement.named = text
        statement._parts = _NAMED.split(text)[::2]  # the text around each placeholder
        statement._texts = {}  # the text for each shape of list parameters
        return statement

    def params(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The parameters in order, for a statement without list parameters."""
        return tuple(values[name] for name in self.names)

    def bind(self, values: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """(text, parameters) to send for ``values``, a tuple among them making its list."""
        params = tuple(values[name] for name in self.names)
        if not any(type(value) is tuple for value in params):
            return self, params
        shape = tuple(len(value) if type(value) is tuple else -1 for value in params)
        text = self._texts.get(shape)
        if text is None:
            pieces = [self._parts[0]]
            for size, part in zip(shape, self._parts[1:]):
                pieces.append("%s" if size < 0 else "(" + ", ".join(["%s"] * size) + ")")
                pieces.append(part)
            text = self._texts[shape] = "".join(pieces)
        flat: list[Any] = []
        for value in params:
            if type(value) is tuple:
                flat.extend(value)
            else:
                flat.append(value)
        return text, tuple(flat)

    def replace(self, old: str, new: str, count: int = -1) -> "Statement":  # type: ignore[override]
        """An edited statement (a test's deliberate fault) keeps its parameters' names."""
        return Statement(self.named.replace(old, new, count))


class Pages(NamedTuple):
    """One keyset-paged read of ids in (key, id) order: the first page, a next page (after
    ``after_key``, ``after_id``), and the read of a row's key."""

    first: Statement
    next: Statement
    key_of: Statement


class Column(NamedTuple):
    """What one column of a table outbox_lite makes must be (``outbox_lite._schema``)."""

    definition: str  # as the repair (ALTER TABLE … MODIFY) would give it
    kind: str  # what information_schema's type of it must start with ("": anything)
    exact: bool  # compared exactly (the family's ``exact_collation``)
    migrated: bool = False  # a migration makes it as wanted: repaired by ``migrate``


class LockCounters(NamedTuple):
    """The server's InnoDB lock counters since it started (global, all sessions)."""

    deadlocks: int
    lock_waits: int

    def __sub__(self, other: tuple[int, ...]) -> "LockCounters":  # type: ignore[override]
        return LockCounters(self.deadlocks - other[0], self.lock_waits - other[1])


class Family:
    """What one family of servers provides; :func:`family_of` gives the one for a database.

    Attributes: ``name`` (``"mysql"``), ``schemes`` (the URL schemes it reads), ``sql`` (the
    module of its :class:`Statement` constants), ``driver_errors`` (the driver's base error
    classes, for a command that reports them in one line). Methods are documented on the
    MySQL family (:class:`outbox_lite._families.mysql.MySQLFamily`), which defines them all;
    a method this base leaves raises NotImplementedError.
    """

    name: ClassVar[str]
    schemes: ClassVar[tuple[str, ...]]
    sql: ModuleType

    @classmethod
    def accepts(cls, database: Any) -> bool:
        raise NotImplementedError

    def refused_type(self, name: str, kind: str, needed: Column) -> tuple[str, str] | None:
        """(what is wrong, the ALTER TABLE clause that repairs it) for column ``name`` of
        type ``kind`` (as the family's SCHEMA_COLUMNS reads it) when the family refuses that
        type for a reason of its own, else None: the schema check then compares the type's
        prefix, an instant's precision and the collation."""
        return None

    def __repr__(self) -> str:
        return f"<family {self.name}>"


_FAMILIES: list[Family] = []
_CHOSEN: "weakref.WeakKeyDictionary[pw.Database, Family]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _registered() -> list[Family]:
    if not _FAMILIES:
        from .mysql import FAMILY as mysql
        from .postgresql import FAMILY as postgresql
        with _LOCK:
            if not _FAMILIES:
                _FAMILIES.extend((mysql, postgresql))
    return _FAMILIES


def family_of(database: Any) -> Any:
    """The family of a Peewee ``database`` (checked and chosen once per object).

    Raises TypeError for a database no family takes, and what the family's own check
    raises (ValueError for a MySQL connection whose charset is not utf8mb4)."""
    try:
        return _CHOSEN[database]
    except (KeyError, TypeError):
        pass
    for family in _registered():
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
    for family in _registered():
        if scheme.lower() in family.schemes:
            return family
    return None


def driver_errors() -> tuple[type[BaseException], ...]:
    """Every installed family's driver base errors (what a command reports in one line)."""
    errors: list[type[BaseException]] = []
    for family in _registered():
        errors.extend(family.driver_errors)  # type: ignore[attr-defined]
    return tuple(errors)


def connection_trouble(exc: BaseException) -> str | None:
    """What a driver error ``exc`` says of the connection, asked of every family (an error
    carries no database): ``"lost"``, ``"unreachable"``, ``"going"`` or None."""
    for family in _registered():
        trouble = family.connection_trouble(exc)  # type: ignore[attr-defined]
        if trouble is not None:
            return trouble  # type: ignore[no-any-return]
    return None


def lock_conflict(exc: BaseException) -> Any:
    """The LockConflictError a driver error ``exc`` means, asked of every family (an error
    carries no database), or None when it is no lock conflict."""
    for family in _registered():
        conflict = family.lock_conflict(exc)  # type: ignore[attr-defined]
        if conflict is not None:
            return conflict
    return None


def tls_refused(exc: BaseException) -> str | None:
    """Why TLS failed when ``exc`` is a server without the TLS a URL asks for (each family
    names its own URL options), or a TLS failure its family reads from its driver's words
    (a family's ``tls_refused`` answers True for the first, the why for the second), else
    None."""
    for family in _registered():
        said = family.tls_refused(exc)  # type: ignore[attr-defined]
        if said:
            return said if isinstance(said, str) else family.no_tls  # type: ignore[attr-defined]
    return None


def url_form() -> str:
    """What a database URL starts with, for an error about its scheme: one short clause
    (each family's whole form is for an error about the rest of its URL)."""
    schemes = [f"{scheme}://" for family in _registered()
               for scheme in family.schemes]  # type: ignore[attr-defined]
    listed = ", ".join(schemes[:-1]) + f" or {schemes[-1]}" if len(schemes) > 1 else schemes[0]
    return f"expected {listed}, e.g. mysql://user:password@host:3306/database"
