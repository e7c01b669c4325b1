"""The schema outbox_lite needs, checked against the one a database has.

:func:`check` reads ``information_schema.columns`` once per Peewee database object (both tables
in one query, the answer cached for the object's life) and raises
:class:`~outbox_lite.errors.SchemaError` in one line naming what differs and the repair: a
missing table is ``outbox-lite migrate``'s to make; a missing column or a column of the wrong
kind (a ``DATETIME`` without microseconds, a key compared without case) is repaired by the
``ALTER TABLE`` the message gives, except the columns migration 005 makes exact, which
``outbox-lite migrate`` converts. The repository and the inbox call it at their first
statement, ``outbox-lite migrate`` after migrating; the database's URL is never shown.
"""

from __future__ import annotations

import threading
import weakref
from typing import Dict, Iterable, NamedTuple, Optional, Tuple

import peewee as pw

from ._db import ask, execute
from ._families import family_of
from .errors import SchemaError

_MIGRATE = "run: outbox-lite migrate"
#: The tables outbox_lite makes (each family says what their columns must be).
TABLES = ("outbox_event", "inbox_message")

Columns = Dict[str, Dict[str, Tuple[str, Optional[str]]]]  # table -> column -> (type, collation)


class _Found(NamedTuple):
    """What one database object's check found: every needed table's columns (one query), and
    the verdict on each table asked about so far (the SchemaError's message, or None)."""

    columns: Columns
    verdicts: dict[str, str | None]


#: database object -> what its check found; a database with a problem is read again at its
#: next check (the operator may have repaired it).
_FOUND: weakref.WeakKeyDictionary[pw.Database, _Found] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def check(database: pw.Database, tables: Iterable[str] = TABLES) -> None:
    """Raise SchemaError unless ``tables`` of ``database`` are as outbox_lite needs them.

    The first call for a database object costs one ``information_schema`` query (none
    of its own when the call opens the connection: the session question reads it) (and one
    statement more for a table it does not show: missing, or hidden from the user); later
    calls cost a dictionary lookup. A user who may not read a table gets the server's own
    error (1142), as from any statement on it.
    """
    with _LOCK:
        found = _FOUND.get(database)
    if found is None:
        found = _Found(_read(database), {})
        with _LOCK:
            _FOUND[database] = found
    problems = []
    for table in tables:  # only these: a user may hold no privilege on the other table
        if table not in found.verdicts:
            found.verdicts[table] = _problem(database, table, found.columns[table])
        problem = found.verdicts[table]
        if problem is not None:
            problems.append(problem)
    if problems:
        forget(database)
        raise SchemaError("; ".join(problems))


def forget(database: pw.Database) -> None:
    """Check ``database`` afresh at its next use (after migrating it)."""
    with _LOCK:
        _FOUND.pop(database, None)


def _read(database: pw.Database) -> Columns:
    columns: Columns = {table: {} for table in TABLES}
    family = family_of(database)
    rows = ask(database, TABLES)  # a new connection: read by its session question
    if rows is None:
        rows = execute(database, *family.sql.SCHEMA_COLUMNS.bind(
            {"tables": family.id_list(TABLES)})).fetchall()
    for table, column, kind, collation in rows:
        columns[str(table)][str(column)] = (str(kind).lower(), collation and str(collation))
    return columns


def _problem(database: pw.Database, table: str,
             found: dict[str, tuple[str, str | None]]) -> str | None:
    if not found and not _exists(database, table):
        return f"table {table} is missing in {database.database} ({_MIGRATE})"
    wrong: list[str] = []
    repairs: list[str] = []
    migrate = False
    family = family_of(database)
    exact = family.exact_collation
    instant = family.instant_type
    for name, needed in family.schema_columns[table].items():
        if name not in found:
            if not found:  # a table the user sees no column of: nothing to compare
                return None
            wrong.append(f"column {name} is missing")
            if needed.migrated:
                migrate = True
            else:
                repairs.append(f"ADD COLUMN {name} {needed.definition}")
            continue
        kind, collation = found[name]
        refused = family.refused_type(name, kind, needed)
        if refused is not None:  # a type the family knows a reason of its own against
            wrong.append(refused[0])
            repairs.append(refused[1])
            continue
        if needed.kind == instant and kind != instant:
            wrong.append(f"{name} is {kind}, not {instant} (its instants would lose their "
                         "microseconds)")
        elif needed.kind and not kind.startswith(needed.kind):
            wrong.append(f"{name} is {kind}, not {needed.kind}")
        elif needed.exact and collation != exact:
            wrong.append(f"{name} compares by {collation}, not exactly ({exact})")
            if needed.migrated:
                migrate = True
                continue
        else:
            continue
        repairs.append(family.modify_column.format(name=name, definition=needed.definition))
    if not wrong:
        return None
    fixes = [f"repair: ALTER TABLE {table} {', '.join(repairs)}"] if repairs else []
    if migrate:
        fixes.append(_MIGRATE)
    return (f"table {table} in database {database.database} is not as outbox_lite needs it: "
            f"{', '.join(wrong)}; {'; then '.join(fixes)}")


def _exists(database: pw.Database, table: str) -> bool:
    """Whether ``table`` exists though the catalog shows none of its columns (the family's
    answer: on MySQL the server's 1142 is raised for a user who may not read it)."""
    exists, _readable = family_of(database).table_state(
        database, table, lambda statement, params: execute(database, statement, params))
    return bool(exists)


def check_visible(database: pw.Database) -> None:
    """:func:`check` afresh, of the tables the user may see (what ``migrate`` checks after
    migrating: a user may run it to check, with grants on one table only); not cached."""
    forget(database)
    visible = [table for table in TABLES if _visible(database, table)]
    try:
        check(database, visible)
    finally:
        forget(database)


def _visible(database: pw.Database, table: str) -> bool:
    family = family_of(database)
    try:
        exists, readable = family.table_state(
            database, table, lambda statement, params: execute(database, statement, params))
    except (pw.ProgrammingError, pw.OperationalError) as exc:
        if family.denied(exc):
            return False
        raise
    return not exists or readable
