"""The contract every family fulfils (:mod:`outbox_lite._families`): its statements are
:class:`Statement` constants (keyset reads :class:`Pages`), the columns it makes
:class:`Column`, the server's lock counters :class:`LockCounters`, and what it answers
:class:`Family`. A family module imports this, its own statements and its own driver; it
never imports the table that names it (:mod:`outbox_lite._families`), as peewee's
``Database`` never imports its subclasses.
"""

from __future__ import annotations

import operator
import re
from types import ModuleType
from typing import Any, ClassVar, Mapping, NamedTuple

_NAMED = re.compile(r"%\((\w+)\)s")


class Statement(str):
    """A statement written with named parameters (``%(name)s``) and sent as the driver's
    positional text (``%s``; both drivers take either): :meth:`bind` puts a mapping's values
    in the statement's order, so a call site names what it passes and never counts
    placeholders. A list of values for ``IN %(ids)s`` is given as a tuple and sent as one
    placeholder per value, ``IN (%s, %s, %s)``. ``named`` is the text as written.
    ``results``: how many statements the text holds, sent as one packet (MySQL's multiple
    statements, on a connection that allows them); the runner reads every result and hands
    back the cursor of the last (:func:`outbox_lite._db.execute`)."""

    names: tuple[str, ...]
    named: str
    _parts: list[str]
    _texts: dict[tuple[int, ...], str]
    _getter: Any
    results: int = 1

    def __new__(cls, text: str, results: int = 1) -> "Statement":
        statement = super().__new__(cls, _NAMED.sub("%s", text))
        if results != 1:
            statement.results = results
        statement.names = tuple(_NAMED.findall(text))
        statement.named = text
        statement._parts = _NAMED.split(text)[::2]  # the text around each placeholder
        names = statement.names
        # params() per write: one C call, made once per statement (a tuple for any count)
        statement._getter = (operator.itemgetter(*names) if len(names) > 1 else
                             (lambda values, name=names[0]: (values[name],)) if names else
                             (lambda values: ()))
        statement._texts = {}  # the text for each shape of list parameters
        return statement

    def params(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The parameters in order, for a statement without list parameters."""
        return self._getter(values)  # type: ignore[no-any-return]

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
        return Statement(self.named.replace(old, new, count), self.results)


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


class SessionAnswer(NamedTuple):
    """What a family's ``ask_session`` answered for one connection, in one round trip: the
    session (autocommit, the isolation level as the server writes it, the server), and what
    the same statement was asked besides: the server's clock (naive UTC, with the
    ``time.monotonic()`` at the middle of the round trip that read it) and the columns of the
    tables asked about (rows of table, column, type, collation, as the family's
    ``SCHEMA_COLUMNS`` reads them). None for what was not asked."""

    autocommit: bool
    isolation: str
    server: Any
    clock: Any = None
    monotonic: float | None = None
    columns: list[tuple[Any, ...]] | None = None


def clock_middle(before: float, after: float, spent_microseconds: Any) -> float:
    """The ``time.monotonic()`` to pair with a clock read at a statement's start, sent at
    ``before`` and answered at ``after``, when the server says it had spent
    ``spent_microseconds`` on the statement by the time it wrote the answer: the middle of
    the part of the round trip that was not the server's. The read happened after the
    statement arrived (at ``before`` at the earliest) and at least that long before the
    answer left (at ``after`` at the latest), so the middle is off by at most half of that
    part: never more than half the round trip (when the server says nothing, 0)."""
    trip = after - before
    spent = min(max(float(spent_microseconds or 0) / 1e6, 0.0), trip)
    return before + (trip - spent) / 2


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
    #: Whether ``write_event`` chooses its statements by the isolation level of the caller's
    #: transaction (its ``isolation`` argument, for a caller's ``dedupe_key``); when False the
    #: repository does not look the level up (a keyed write's cost, issue 30).
    write_reads_isolation: ClassVar[bool] = True

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
