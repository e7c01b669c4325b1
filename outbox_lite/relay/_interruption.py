"""Interruption: a KeyboardInterrupt (the second Ctrl-C) stops the relay at once, leaving its
claims to expire. :func:`reraise_interrupt` lets no fault handler swallow one that a database
error was raised while unwinding from; :meth:`Interruption.claims_held` says, afterwards, how
many claims were left behind."""

from __future__ import annotations

import time
from typing import Any

from .._db import execute, reconnect
from .._signals import interruption
from ..repository import OutboxRepository


def reraise_interrupt(exc: BaseException) -> None:
    """Raise the KeyboardInterrupt ``exc`` was raised while unwinding from, if any."""
    interrupt = interruption(exc)
    if interrupt is not None:
        raise interrupt


class Interruption:
    """What a relay (mixed into :class:`~outbox_lite.relay.Relay`) knows of a run stopped at
    once: ``_cut_short`` is set by ``run()`` when an interrupt ended it."""

    repository: OutboxRepository
    worker_id: str
    _database: Any
    _family: Any
    _cut_short: bool

    def claims_held(self) -> int:
        """How many claims this relay holds now, as the database says: what a :meth:`run`
        stopped at once (KeyboardInterrupt) leaves behind, released after the lock timeout.
        Read on a new connection of the calling thread: the one the interrupt may have broken
        mid-statement is dropped first, and the server is let finish what it was doing on
        it (a COMMIT whose answer was never read). After a :meth:`run` stopped at once, a
        transaction Peewee still lists on this thread is that run's, and is forgotten with
        the connection: an interrupt that lands in ``atomic()``'s ``__enter__``, after the
        transaction is recorded, leaves one that no ``__exit__`` ends (the server rolls it
        back with the dropped connection). Otherwise an open transaction is the caller's, and
        OutboxError says so, changing nothing."""
        while self._cut_short and self._database.in_transaction():
            self._database.pop_transaction()
        conn = getattr(getattr(self._database, "_state", None), "conn", None)
        old = None if conn is None else self._family.session_id(conn)
        reconnect(self._database)
        deadline = time.monotonic() + 10.0
        alive = self._family.sql.SESSION_ALIVE
        while old is not None and time.monotonic() < deadline and execute(
                self._database, alive, alive.params({"session": old})).fetchone()[0]:
            time.sleep(0.01)
        return len(self.repository.held_by(self.worker_id))
