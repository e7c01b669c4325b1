"""The databases of ``outbox-lite relay`` when it relays for several: ``--database-url
[NAME=]URL`` repeated, or ``--databases-file PATH`` (one ``[NAME=]URL`` a line), read into
names and URLs. A name defaults to ``host:port/database`` (as :class:`RelayGroup` names a
relay); an error names a database by its flag, its line or its name, never by its URL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from .._families.url import DatabaseUrl, DatabaseUrlError
from ..relay import database_name
from ._args import CommandError, UsageError, split_name

#: A name the operator gives: the value of the metrics' ``database`` label.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAME_RULE = "1-64 letters, digits, _, . or -, starting with a letter or a digit"


class Database(NamedTuple):
    """One database to relay for: its name (given, or the default) and its URL."""

    name: str
    url: DatabaseUrl

    def same(self, other: Database) -> bool:
        """Whether ``other`` is this database with the same URL (password and options
        included): a reload keeps its relay running."""
        return self.name == other.name and self.url.secret_text() == other.url.secret_text()


class DatabasesFileError(CommandError):
    """A databases file that cannot be read or names no database rightly."""


def parse(values: list[tuple[str, str]], error: type[Exception] = UsageError,
          ) -> list[Database]:
    """``values`` as (where, ``[NAME=]URL``) pairs, ``where`` saying where each was given
    ("--database-url #2", "FILE line 3"): the databases, names checked and unique, no
    database twice. Raises ``error`` with a line naming the value's place, never its URL."""
    databases: list[Database] = []
    for where, value in values:
        name, text = split_name(value)
        if name is not None and not NAME_RE.fullmatch(name):
            # never quoted: what precedes the first = may be a mistyped URL's password
            raise error(f"{where}: the NAME before = must be {NAME_RULE}")
        try:
            url = DatabaseUrl.parse(text)
        except DatabaseUrlError as exc:  # its message quotes no part of the URL
            raise error(f"{where}: {exc}") from None
        databases.append(Database(name or database_name(url.database()), url))
    seen: dict[str, Database] = {}
    places: dict[str, str] = {}
    for (where, _), database in zip(values, databases):
        if database.name in seen:
            raise error(f"{where}: two databases are called {database.name} (the other at"
                        f" {places[database.name]}): give each its own NAME=URL")
        twin = next((d for d in seen.values() if d.url.location == database.url.location),
                    None)
        if twin is not None:
            raise error(f"{where}: {database.name} is the database {twin.name} is already"
                        f" ({database.url.location}): one relay a database")
        seen[database.name] = database
        places[database.name] = where
    return databases


def from_flags(values: list[str]) -> list[Database]:
    """The databases of the repeated ``--database-url``."""
    return parse([(f"--database-url #{n}", value) for n, value in enumerate(values, 1)])


def from_file(path: str, error: type[Exception] = UsageError) -> list[Database]:
    """The databases ``path`` names, one ``[NAME=]URL`` a line (blank lines and lines
    starting with ``#`` ignored); at least one. Raises ``error`` (a file that cannot be
    read: DatabasesFileError)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise DatabasesFileError(f"--databases-file {path}: cannot read it ({reason})"
                                 ) from None
    values = [(f"{path} line {number}", line.strip())
              for number, line in enumerate(text.splitlines(), 1)
              if line.strip() and not line.strip().startswith("#")]
    if not values:
        raise error(f"--databases-file {path} names no database: write one [NAME=]URL a"
                    " line")
    return parse(values, error)
