"""Apply and undo outbox_lite's schema migrations (peewee-migrate, isolated history).

The history lives in its own table, ``outbox_lite_migrations``, through a history model made
per run, so a host service that uses peewee-migrate too never reads or writes ours.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path

import peewee as pw
from peewee_migrate import Router
from peewee_migrate.models import MigrateHistory

HISTORY_TABLE = "outbox_lite_migrations"

logger = logging.getLogger(__name__)


def migrations_dir() -> Path:
    """The migrations shipped in the wheel, or those of a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent / "migrations"):
        if any(candidate.glob("[0-9][0-9][0-9]_*.py")):
            return candidate
    raise FileNotFoundError("outbox_lite's migrations are missing from this installation")


class _Router(Router):
    """A Router whose history model belongs to it alone (peewee-migrate shares one class)."""

    @cached_property
    def model(self) -> type[MigrateHistory]:  # type: ignore[override]
        class Meta:
            database = self.database
            table_name = self.migrate_table

        history: type[MigrateHistory] = type(
            "OutboxLiteMigrateHistory", (MigrateHistory,), {"Meta": Meta})
        history.create_table(safe=True)
        return history


def _router(database: pw.Database) -> Router:
    return _Router(database, migrate_dir=migrations_dir(), migrate_table=HISTORY_TABLE,
                   logger=logger)


def migrate(database: pw.Database) -> list[str]:
    """Apply pending migrations to ``database``; returns their names ([] when up to date)."""
    return _router(database).run()


def rollback(database: pw.Database) -> str | None:
    """Undo the last applied migration; returns its name, or None when none is applied."""
    router = _router(database)
    done = router.done
    if not done:
        return None
    router.rollback()
    return done[-1]


def applied(database: pw.Database) -> list[str]:
    """Names of the migrations applied to ``database``, oldest first."""
    return _router(database).done
