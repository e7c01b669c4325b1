"""Database URLs for the command line and the contention suite (``mysql://`` only)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import peewee as pw
import pymysql

from ._compat import MySQLDatabase

DEFAULT_URL = "mysql://root@127.0.0.1:3306/outbox_lite"
_NAME_RE = re.compile(r"[A-Za-z0-9_$]{1,64}")


class DatabaseUrlError(ValueError):
    """The URL is not ``mysql://user[:password]@host[:port]/database``."""


@dataclass(frozen=True)
class DatabaseUrl:
    host: str
    port: int
    user: str
    password: str
    name: str

    @classmethod
    def parse(cls, url: str) -> "DatabaseUrl":
        expected = "expected mysql://user[:password]@host[:port]/database"
        try:
            parsed = urlparse(url)
            port = parsed.port or 3306
        except ValueError as exc:
            raise DatabaseUrlError(f"bad database URL ({exc}); {expected}") from None
        if parsed.scheme != "mysql":
            raise DatabaseUrlError(f"unsupported URL scheme {parsed.scheme!r}; {expected}")
        name = parsed.path.lstrip("/")
        if not _NAME_RE.fullmatch(name):
            raise DatabaseUrlError(
                f"database name {name!r} must be 1-64 letters, digits, _ or $; {expected}")
        return cls(host=parsed.hostname or "127.0.0.1", port=port,
                   user=unquote(parsed.username or "root"),
                   password=unquote(parsed.password or ""), name=name)

    def with_name(self, name: str) -> "DatabaseUrl":
        if not _NAME_RE.fullmatch(name):
            raise DatabaseUrlError(f"bad database name {name!r}")
        return DatabaseUrl(self.host, self.port, self.user, self.password, name)

    def __str__(self) -> str:  # never shows the password
        auth = self.user + (":***" if self.password else "")
        return f"mysql://{auth}@{self.host}:{self.port}/{self.name}"

    def _params(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "user": self.user,
                "password": self.password, "charset": "utf8mb4", "connect_timeout": 5}

    def database(self, **kwargs: Any) -> pw.MySQLDatabase:
        """A Peewee database for this URL (connects lazily)."""
        return MySQLDatabase(self.name, **{**self._params(), **kwargs})

    def server_connection(self) -> pymysql.connections.Connection:
        """A plain PyMySQL connection to the server, no database selected."""
        return pymysql.connect(autocommit=True, **self._params())

    def create_database(self) -> bool:
        """Create the database when missing; True when it was created."""
        conn = self.server_connection()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
                            (self.name,))
                if cur.fetchone():
                    return False
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{self.name}`"
                            " CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
                return True
        finally:
            conn.close()

    def drop_database(self) -> None:
        conn = self.server_connection()
        try:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")
        finally:
            conn.close()
