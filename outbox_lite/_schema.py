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

from ._db import execute
from .errors import SchemaError, driver_errno

_EXACT = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
_MIGRATE = "run: outbox-lite migrate"


class _Column(NamedTuple):
    definition: str  # as ALTER TABLE … MODIFY would give it
    kind: str  # what information_schema's column_type must start with
    exact: bool  # compared exactly: collation utf8mb4_bin
    migrated: bool = False  # a migration makes it as wanted: repaired by ``migrate``


_INSTANT = "datetime(6)"
#: What each table needs, column by column (the migrations' result).
NEEDED: dict[str, dict[str, _Column]] = {
    "outbox_event": {
        "id": _Column("BIGINT NOT NULL AUTO_INCREMENT", "bigint", False),
        "event_type": _Column("VARCHAR(255) NOT NULL", "varchar(255)", False),
        "aggregate_type": _Column(f"VARCHAR(255) {_EXACT} NOT NULL", "varchar(255)", True,
                                  True),
        "aggregate_id": _Column(f"VARCHAR(255) {_EXACT} NOT NULL", "varchar(255)", True, True),
        "dedupe_key": _Column(f"VARCHAR(255) {_EXACT} NOT NULL", "varchar(255)", True),
        "payload": _Column("JSON NOT NULL", "", False),
        "status": _Column("VARCHAR(16) NOT NULL DEFAULT 'pending'", "varchar(16)", False),
        "attempt_count": _Column("INT UNSIGNED NOT NULL DEFAULT 0", "int", False),
        "available_at": _Column("DATETIME(6) NOT NULL", _INSTANT, False),
        "locked_at": _Column("DATETIME(6) NULL", _INSTANT, False),
        "locked_by": _Column(f"VARCHAR(255) {_EXACT} NULL", "varchar(255)", True),
        "published_at": _Column("DATETIME(6) NULL", _INSTANT, False),
        "last_error_code": _Column(f"VARCHAR(64) {_EXACT} NULL", "varchar(64)", True, True),
        "last_error_message": _Column("TEXT NULL", "text", False),
        "created_at": _Column("DATETIME(6) NOT NULL", _INSTANT, False),
        "updated_at": _Column("DATETIME(6) NOT NULL", _INSTANT, False),
    },
    "inbox_message": {
        "consumer": _Column(f"VARCHAR(64) {_EXACT} NOT NULL", "varchar(64)", True),
        "message_id": _Column(f"VARCHAR(704) {_EXACT} NOT NULL", "varchar(704)", True),
        "received_at": _Column("DATETIME(6) NOT NULL", _INSTANT, False),
    },
}
_READ = ("SELECT table_name, column_name, column_type, collation_name"
         " FROM information_schema.columns WHERE table_schema = DATABASE()"
         f" AND table_name IN ({', '.join(['%s'] * len(NEEDED))})")

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


def check(database: pw.Database, tables: Iterable[str] = tuple(NEEDED)) -> None:
    """Raise SchemaError unless ``tables`` of ``database`` are as outbox_lite needs them.

    The first call for a database object costs one ``information_schema`` query (and one
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
    columns: Columns = {table: {} for table in NEEDED}
    for table, column, kind, collation in execute(database, _READ, tuple(NEEDED)).fetchall():
        columns[str(table)][str(column)] = (str(kind).lower(), collation and str(collation))
    return columns


def _problem(database: pw.Database, table: str,
             found: dict[str, tuple[str, str | None]]) -> str | None:
    if not found and not _exists(database, table):
        return f"table {table} is missing in {database.database} ({_MIGRATE})"
    wrong: list[str] = []
    repairs: list[str] = []
    migrate = False
    for name, needed in NEEDED[table].items():
        if name not in found:
            if not found:  # a table the user sees no column of: nothing to compare
                return None
            wrong.append(f"column {name} is missing")
            repairs.append(f"ADD COLUMN {name} {needed.definition}")
            continue
        kind, collation = found[name]
        if needed.kind == _INSTANT and kind != _INSTANT:
            wrong.append(f"{name} is {kind}, not datetime(6) (its instants would lose their "
                         "microseconds)")
        elif needed.kind and not kind.startswith(needed.kind):
            wrong.append(f"{name} is {kind}, not {needed.kind}")
        elif needed.exact and collation != "utf8mb4_bin":
            wrong.append(f"{name} compares by {collation}, not exactly (utf8mb4_bin)")
            if needed.migrated:
                migrate = True
                continue
        else:
            continue
        repairs.append(f"MODIFY {name} {needed.definition}")
    if not wrong:
        return None
    fixes = [f"repair: ALTER TABLE {table} {', '.join(repairs)}"] if repairs else []
    if migrate:
        fixes.append(_MIGRATE)
    return (f"table {table} in database {database.database} is not as outbox_lite needs it: "
            f"{', '.join(wrong)}; {'; then '.join(fixes)}")


def _exists(database: pw.Database, table: str) -> bool:
    """Whether ``table`` exists though information_schema shows none of its columns; raises
    the server's 1142 for a user who may not read it."""
    try:
        execute(database, f"SELECT 1 FROM `{table}` LIMIT 0", ())
    except (pw.ProgrammingError, pw.OperationalError) as exc:
        if driver_errno(exc) == 1146:  # ER_NO_SUCH_TABLE
            return False
        raise
    return True


def check_visible(database: pw.Database) -> None:
    """:func:`check` afresh, of the tables the user may see (what ``migrate`` checks after
    migrating: a user may run it to check, with grants on one table only); not cached."""
    forget(database)
    visible = [table for table in NEEDED if _visible(database, table)]
    try:
        check(database, visible)
    finally:
        forget(database)


def _visible(database: pw.Database, table: str) -> bool:
    try:
        _exists(database, table)
    except (pw.ProgrammingError, pw.OperationalError) as exc:
        if driver_errno(exc) in (1142, 1143):  # denied
            return False
        raise
    return True
