"""Apply and undo outbox_lite's schema migrations (peewee-migrate, isolated history).

The history lives in its own table, ``outbox_lite_migrations``, through a history model made
per run, so a host service that uses peewee-migrate too never reads or writes ours. The table
is created only when a migration is applied, and only when it is missing: a user with nothing
but SELECT on it can check that the schema is up to date. A user who may not read it gets the
server's refusal (1142, raised), never an empty history: the server hides a table from a user
without privileges on it, so "not there" and "not yours to see" look alike until asked.

Each migration is safe to run again. peewee-migrate runs a migration's DDL before it writes
its history row, and MySQL's DDL is not transactional, so a run that stops between the two
leaves a change with no row. Every migration therefore says whether its change is in place
(``is_applied(database)``), and :func:`migrate` goes through them in order: a change in place
without its row gets the row (a warning says so), a row whose change is missing (a table
dropped by hand) is run again, and a missing change older than the newest applied one is
applied, with a warning that it comes out of order. :func:`rollback` refuses (SchemaError)
while history and schema disagree, and undoes the newest migration by name, whatever order
the history rows were written in. After migrating, :func:`migrate` checks the tables against
what outbox_lite needs (:mod:`outbox_lite._schema`).
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import Any

import peewee as pw
from peewee_migrate import Router
from peewee_migrate.models import MigrateHistory

from . import _schema, _session
from ._families import family_of
from .errors import SchemaError
from .models import HISTORY_TABLE

__all__ = ["HISTORY_TABLE", "applied", "migrate", "migrations_dir", "rollback"]

logger = logging.getLogger(__name__)


def migrations_dir() -> Path:
    """The migrations shipped in the wheel, or those of a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent / "migrations"):
        if any(candidate.glob("[0-9][0-9][0-9]_*.py")):
            return candidate
    raise FileNotFoundError("outbox_lite's migrations are missing from this installation")


class _RouterLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """peewee-migrate's messages at the level they deserve: a rollback that worked is news
    (INFO), not a WARNING; a failure is raised to the caller, so its traceback is DEBUG."""

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.info(msg, *args, **kwargs)

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        self.debug(msg, *args, exc_info=exc_info, **kwargs)


class _Router(Router):
    """A Router whose history model belongs to it alone (peewee-migrate shares one class),
    and which creates the history table only to record a migration."""

    @cached_property
    def model(self) -> type[MigrateHistory]:  # type: ignore[override]
        class Meta:
            database = self.database
            table_name = self.migrate_table

        return type("OutboxLiteMigrateHistory", (MigrateHistory,), {"Meta": Meta})

    @property
    def done(self) -> list[str]:
        """The recorded migrations in name order (the order they must apply in), each once."""
        if not _has_history(self.database):
            return []
        return sorted(set(super().done))

    def read(self, name: str) -> tuple[Any, Any]:
        path = self.migrate_dir / (name + ".py")
        scope: dict[str, Any] = {}
        exec(compile(path.read_text(), str(path), "exec", dont_inherit=True), scope, None)
        self._probes[name] = scope.get("is_applied")
        return scope["migrate"], scope["rollback"]

    @cached_property
    def _probes(self) -> dict[str, Any]:
        return {}

    def in_place(self, name: str) -> bool | None:
        """Whether migration ``name``'s change is in the schema (None: it cannot tell)."""
        if name not in self._probes:
            self.read(name)
        probe = self._probes[name]
        return None if probe is None else bool(probe(self.database))

    def run_one(self, name: str, migrator: Any, **kwargs: Any) -> str:
        if not kwargs.get("fake", True) and not _has_history(self.database):
            self.model.create_table()
        return super().run_one(name, migrator, **kwargs)

    def record(self, name: str) -> None:
        if not _has_history(self.database):
            self.model.create_table()
        self.model.create(name=name)

    def forget(self, name: str) -> None:
        self.model.delete().where(self.model.name == name).execute()

    @cached_property
    def hides_tables(self) -> bool:
        """Whether a table outbox_lite made is hidden from this user (no privilege on it):
        information_schema then shows nothing of it, so a probe's "not in place" may be
        untrue, and the history is trusted."""
        family = family_of(self.database)
        for table in ("outbox_event", "inbox_message"):
            try:
                exists, readable = family.table_state(self.database, table, self._execute)
            except (pw.ProgrammingError, pw.OperationalError) as exc:
                if family.denied(exc):  # the user cannot know
                    return True
                continue
            if exists and not readable:
                return True
        return False

    def _execute(self, statement: str, params: Any) -> Any:
        return self.database.execute_sql(statement, params)

    def disagreements(self) -> list[str]:
        """Where the history and the schema disagree, one phrase each."""
        done = set(self.done)
        found = []
        for name in self.todo:
            in_place = self.in_place(name)
            if in_place is None or in_place == (name in done):
                continue
            if not in_place and self.hides_tables:
                continue
            found.append(f"{name} is in place but not recorded" if in_place else
                         f"{name} is recorded but its change is missing")
        return found

    def run(self, name: str | None = None, *, fake: bool = False) -> list[str]:
        """Bring the schema to the newest migration, repairing the history on the way
        (see the module's docstring); returns the migrations applied or recorded."""
        done = set(self.done)
        newest = max(done, default="")
        changed: list[str] = []
        for migration in self.todo:
            in_place = self.in_place(migration)
            recorded = migration in done
            if in_place is None or (recorded and not in_place and self.hides_tables):
                in_place = recorded
            if in_place and recorded:
                continue
            if in_place:
                self.record(migration)
                logger.warning("%s was in place but not recorded (a run stopped between its DDL"
                               " and its history row): recorded it", migration)
            else:
                if recorded:
                    self.forget(migration)
                self.run_one(migration, self.migrator, fake=False)
                if recorded:
                    logger.warning("%s was recorded but its change was missing: applied it "
                                   "again", migration)
                elif migration < newest:
                    logger.warning("%s was not applied though %s is: applied it out of order",
                                   migration, newest)
            changed.append(migration)
        return changed


def _has_history(database: Any) -> bool:
    """Whether the history table exists; raises the server's 1142 when the user may not read
    it (information_schema lists only the tables a user holds a privilege on)."""
    if database.table_exists(HISTORY_TABLE):
        return True
    exists, _readable = family_of(database).table_state(
        database, HISTORY_TABLE, lambda statement, params: database.execute_sql(statement,
                                                                                params))
    return bool(exists)


def _router(database: pw.Database) -> _Router:
    return _Router(database, migrate_dir=migrations_dir(), migrate_table=HISTORY_TABLE,
                   logger=_RouterLog(logger, {}))


def migrate(database: pw.Database) -> list[str]:
    """Apply pending migrations to ``database``; returns their names ([] when up to date),
    those whose change was in place already and only got their history row among them.

    When nothing is pending it only reads the history table and information_schema, so a
    user with SELECT on it (and no DDL rights) gets [] rather than an error. A user who may
    not read the history gets the server's error (1142), as for any privilege a migration
    lacks. Raises SchemaError when the tables, once migrated, are still not what outbox_lite
    needs (a table made by hand), saying what differs and the statement that repairs it.
    """
    _schema.forget(database)
    _session.session_of(database)  # a connection the library refuses (its encoding) changes nothing
    applied = _router(database).run()
    _schema.check_visible(database)
    return applied


def rollback(database: pw.Database) -> str | None:
    """Undo the newest applied migration; returns its name, or None when none is applied (a
    database never migrated is left exactly as it is). Raises SchemaError, changing nothing,
    when the history and the schema disagree (run :func:`migrate` first: it repairs the
    history), and the server's error (1142) when the user may not read the history: it
    cannot know that nothing is applied."""
    router = _router(database)
    _schema.forget(database)
    done = router.done
    if not done:
        return None
    disagreements = router.disagreements()
    if disagreements:
        raise SchemaError(
            "the history of outbox_lite's migrations does not match the schema ("
            + ", ".join(disagreements) + "); run: outbox-lite migrate (it repairs the "
            "history), then roll back")
    router.run_one(done[-1], router.migrator, fake=False, downgrade=True)
    return done[-1]


def applied(database: pw.Database) -> list[str]:
    """Names of the migrations applied to ``database``, oldest first; raises the server's
    error (1142) when the user may not read the history."""
    return _router(database).done
