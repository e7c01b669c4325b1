"""A named lock that one session of a database holds at a time, for a chore (retention) that
one of many relays or consumers should do while the others skip it: :func:`try_lock`, and
:class:`Chore`, such a job done at most every so many seconds.

It is the server's own session lock (MySQL and MariaDB: ``GET_LOCK(name, 0)``; PostgreSQL:
``pg_try_advisory_lock``), taken on the calling thread's connection and never waited for: a
session that finds it held skips the chore. It locks no row and no table, so nothing a writer
or a claimer runs ever waits on it, and it goes with the session: a process that dies or loses
its connection while holding it leaves nothing behind.

Galera: MariaDB Galera Cluster lists ``GET_LOCK`` among what it does not support. On MariaDB
10.11 with ``wsrep_on=ON`` it runs, but the lock is one node's (measured on a 2-node cluster:
a session on node 2 takes the lock a session on node 1 holds; ``wsrep_on=OFF`` changes
nothing). Relays connected to different nodes may then purge at the same time: nothing breaks
(each DELETE is by primary key and repeats its conditions, and a purge goes on when the other
deleted rows under it), but the work is done twice over and the nodes' certification may
refuse one of two DELETEs of the same rows (a lock conflict: the relay counts it and goes on).
Point the relays that retain at one node, or retain from one relay only.

A server that refuses the statement itself (not a lost connection, not a lock conflict: those
propagate) skips the chore with a warning each time: a loop that runs it never stops for it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from typing import Callable, Iterator

import peewee as pw

from ._db import execute, is_connection_error
from ._families import family_of
from .errors import LockConflictError

__all__ = ["Chore", "try_lock"]

logger = logging.getLogger(__name__)

#: A retention pass (the relay's, the inbox's): rows per DELETE, and DELETEs per pass, so a
#: pass deletes at most 10,000 rows; when it found that many, the next pass is due at once.
RETAIN_BATCH_SIZE = 500
RETAIN_MAX_BATCHES = 20


def default_retain_every(retain: dt.timedelta) -> float:
    """Seconds between retention passes when not given: a tenth of ``retain``, from 1 to 60."""
    return max(1.0, min(60.0, retain.total_seconds() / 10))


@contextlib.contextmanager
def try_lock(database: pw.Database, name: str) -> Iterator[bool]:
    """Try to take the lock ``name`` of ``database`` on this thread's connection without
    waiting; yield True when taken (released on leaving), False when another session holds
    it. Run it outside a transaction. A server that refuses the statement (not a lost
    connection, not a lock conflict: those propagate) yields False, with a warning."""
    sql = family_of(database).sql
    try:
        taken = bool(execute(database, *sql.TRY_LOCK.bind({"name": name})).fetchone()[0])
    except (pw.DatabaseError, LockConflictError) as exc:
        if isinstance(exc, LockConflictError) or is_connection_error(exc):
            raise
        logger.warning("the server refused the named lock %r (%s): skipped", name, exc)
        taken = False
    if not taken:
        yield False
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


class Chore:
    """``work`` (returning a count) done on ``database`` under the named lock ``name``, at
    most every ``every`` seconds of ``clock``: by one session of the database at a time. A
    pass whose count reaches ``full`` (a bounded pass that found more to do) makes the next
    one due at once, so a backlog is caught up pass after pass."""

    def __init__(self, database: pw.Database, name: str, every: float,
                 work: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                 full: int | None = None) -> None:
        self.database = database
        self.name = name
        self.every = every
        self._work = work
        self._clock = clock
        self._full = full
        self._next = 0.0

    def due(self) -> bool:
        """Whether a pass is due now."""
        return self._clock() >= self._next

    def run_if_due(self) -> int:
        """A pass when due (see :meth:`run`), else nothing (0)."""
        return self.run() if self.due() else 0

    def run(self) -> int:
        """A pass now: ``work()`` under the lock, or 0 at once when another session holds
        it. The next pass is due ``every`` seconds from now, whatever this one did or raised,
        or at once when this one was full."""
        self._next = self._clock() + self.every
        with try_lock(self.database, self.name) as taken:
            done = self._work() if taken else 0
        if self._full is not None and done >= self._full:
            self._next = 0.0
        return done
