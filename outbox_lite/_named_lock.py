"""A named lock that one session of a database holds at a time, for a chore (retention) that
one of many relays or consumers should do while the others skip it: :func:`try_lock`.

It is the server's own session lock (MySQL and MariaDB: ``GET_LOCK(name, 0)``; PostgreSQL:
``pg_try_advisory_lock``), taken on the calling thread's connection and never waited for: a
session that finds it held goes on without it. It locks no row and no table, so nothing a writer
or a claimer runs ever waits on it, and it goes with the session: a process that dies or loses
its connection while holding it leaves nothing behind.

Galera: MariaDB Galera Cluster lists ``GET_LOCK`` among what it does not replicate. The lock is
then one node's: relays connected to different nodes may each take it and purge at the same
time. Nothing breaks (each DELETE is by primary key and repeats its conditions), but the nodes'
certification may refuse one of two DELETEs of the same rows (a lock conflict, retried at the
next pass). A server that refuses the statement outright is warned about once and the chore
goes on without the lock.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Iterator

import peewee as pw

from ._db import execute, is_connection_error
from ._families import family_of
from .errors import LockConflictError

__all__ = ["try_lock"]

logger = logging.getLogger(__name__)

_refused: "weakref.WeakSet[pw.Database]" = weakref.WeakSet()


@contextlib.contextmanager
def try_lock(database: pw.Database, name: str) -> Iterator[bool]:
    """Try to take the lock ``name`` of ``database`` on this thread's connection without
    waiting; yield True when taken (released on leaving), False when another session holds
    it. Run it outside a transaction. A server that refuses the statement (not a lost
    connection, not a lock conflict: those propagate) yields True after one warning."""
    sql = family_of(database).sql
    refused = False
    try:
        taken = bool(execute(database, *sql.TRY_LOCK.bind({"name": name})).fetchone()[0])
    except (pw.DatabaseError, LockConflictError) as exc:
        if isinstance(exc, LockConflictError) or is_connection_error(exc):
            raise
        if database not in _refused:
            _refused.add(database)
            logger.warning("the server refused the named lock %r (%s): every session does"
                           " this chore without it", name, exc)
        taken = refused = True
    if not taken or refused:
        yield taken
        return
    try:
        yield True
    finally:
        _release(database, name)


def _release(database: pw.Database, name: str) -> None:
    """Release ``name``; a connection that broke meanwhile released it already."""
    if database.is_closed():
        return  # gone with its session; a new connection would hold nothing
    try:
        execute(database, *family_of(database).sql.UNLOCK.bind({"name": name}))
    except Exception:  # noqa: BLE001 - the session's end releases it in any case
        logger.debug("releasing the named lock %r failed", name, exc_info=True)
