"""The benches' scratch database: ``--database-url`` names a server, and each bench runs in a
database of its own there (``<database>_<suffix>``), created and migrated before and dropped
after, whatever happens in between. Imported by the scripts beside it, after they have put the
checkout on ``sys.path``."""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any, Iterator

from outbox_lite import migrate as schema
from outbox_lite._db import DEFAULT_URL
from outbox_lite._families.url import DatabaseUrl


def add_database_option(parser: argparse.ArgumentParser, suffix: str) -> None:
    """The ``--database-url`` option, its help naming the scratch database."""
    parser.add_argument("--database-url", metavar="URL",
                        help=f"server to use; the bench runs in <database>_{suffix}, created and"
                             f" dropped (default: $OUTBOX_DATABASE_URL, else {DEFAULT_URL})")


def server_url(option: str | None) -> DatabaseUrl:
    """The URL given, else ``$OUTBOX_DATABASE_URL``, else the library's default."""
    return DatabaseUrl.parse(option or os.environ.get("OUTBOX_DATABASE_URL") or DEFAULT_URL)


@contextlib.contextmanager
def scratch_database(option: str | None, suffix: str, *setup_sql: str) -> Iterator[Any]:
    """Yield the URL of ``<database>_<suffix>`` on the server of ``option``: dropped if it was
    left behind, created, migrated, ``setup_sql`` run in it; dropped again on the way out."""
    base = server_url(option)
    url = base.with_name(f"{base.name}_{suffix}")
    url.drop_database()
    url.create_database()
    try:
        database = url.database()
        schema.migrate(database)
        for sql in setup_sql:
            database.execute_sql(sql)
        database.close()
        yield url
    finally:
        url.drop_database()
