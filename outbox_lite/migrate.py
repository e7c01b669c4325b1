"""Apply and undo outbox_lite's schema migrations (peewee-migrate, isolated history).

The history lives in its own table, ``outbox_lite_migrations``, through a history model made
per run, so a host service that uses peewee-migrate too never reads or writes ours. The table
is created only when a migration is applied, and only when it is missing: a user with nothing
but SELECT on it can check that the schema is up to date. A user who may not read it gets the
server's refusal (1142, raised), never an empty history: the server hides a table from a user
without privileges on it, so "not there" and "not yours to see" look alike until asked.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import Any

import peewee as pw
from peewee_migrate import Router
from peewee_migrate.models import MigrateHistory

from .errors import driver_errno
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
        if not _has_history(self.database):
            return []
        return super().done

    def run_one(self, name: str, migrator: Any, **kwargs: Any) -> str:
        if not kwargs.get("fake", True) and not _has_history(self.database):
            self.model.create_table()
        return super().run_one(name, migrator, **kwargs)


def _has_history(database: Any) -> bool:
    """Whether the history table exists; raises the server's 1142 when the user may not read
    it (information_schema lists only the tables a user holds a privilege on)."""
    if database.table_exists(HISTORY_TABLE):
        return True
    try:
        database.execute_sql(f"SELECT 1 FROM `{HISTORY_TABLE}` LIMIT 0")
    except (pw.ProgrammingError, pw.OperationalError) as exc:
        if driver_errno(exc) == 1146:  # ER_NO_SUCH_TABLE: told only to a user who may know
            return False
        raise
    return True


def _router(database: pw.Database) -> Router:
    return _Router(database, migrate_dir=migrations_dir(), migrate_table=HISTORY_TABLE,
                   logger=_RouterLog(logger, {}))


def migrate(database: pw.Database) -> list[str]:
    """Apply pending migrations to ``database``; returns their names ([] when up to date).

    When nothing is pending it only reads the history table, so a user with SELECT on it
    (and no DDL rights) gets [] rather than an error. A user who may not read the history
    gets the server's error (1142), as for any privilege a migration lacks.
    """
    return _router(database).run()


def rollback(database: pw.Database) -> str | None:
    """Undo the last applied migration; returns its name, or None when none is applied (a
    database never migrated is left exactly as it is). Raises the server's error (1142) when
    the user may not read the history: it cannot know that nothing is applied."""
    router = _router(database)
    done = router.done
    if not done:
        return None
    router.rollback()
    return done[-1]


def applied(database: pw.Database) -> list[str]:
    """Names of the migrations applied to ``database``, oldest first; raises the server's
    error (1142) when the user may not read the history."""
    return _router(database).done
