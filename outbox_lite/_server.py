"""The old name of :mod:`outbox_lite._families.mysql_server` (what differs between MariaDB and
MySQL), kept for the tests and scripts that import it."""

from ._families.mysql_server import EXPLAIN, LockCounters, Query, Server, peewee_query, server_of

__all__ = ["EXPLAIN", "LockCounters", "Query", "Server", "peewee_query", "server_of"]
