"""Retention (SPEC §13): between rounds, published events older than ``retain`` by the
server's clock are deleted, by one relay of the database at a time.

A pass is due at most every ``retain_every`` seconds. It takes the database's named lock
``outbox_lite.retain`` without waiting (:func:`outbox_lite._named_lock.try_lock`): a relay that
finds it held skips the pass at once. The holder deletes with
:meth:`~outbox_lite.repository.OutboxRepository.purge_published` in autocommit, ``batch_size``
rows a statement, at most ``max_batches`` statements a pass, so a round is never held up long;
what is left waits for the next pass. Each DELETE names its rows by primary key and repeats
``status = 'published'``: it never touches a pending, processing or failed row (dead letters are
kept until an operator acts), so no writer's INSERT and no claim's locking read waits on it.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Callable

from .. import _checks
from .._named_lock import try_lock
from ..repository import OutboxRepository

#: The named lock one relay of a database holds while it purges.
LOCK_NAME = "outbox_lite.retain"
#: Rows per DELETE, and DELETEs per pass: a pass deletes at most 10,000 rows.
BATCH_SIZE = 500
MAX_BATCHES = 20


def default_every(retain: dt.timedelta) -> float:
    """Seconds between passes when not given: a tenth of ``retain``, at most 60, at least 1."""
    return max(1.0, min(60.0, retain.total_seconds() / 10))


class Retention:
    """When due, one pass of retention over ``repository``'s outbox (see the module)."""

    def __init__(self, repository: OutboxRepository, retain: dt.timedelta | float,
                 every: float | None = None, *, batch_size: int = BATCH_SIZE,
                 max_batches: int = MAX_BATCHES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.repository = repository
        self.retain = _checks.duration("retain", retain)
        self.every = (default_every(self.retain) if every is None else
                      _checks.duration("retain_every", every).total_seconds())
        self.batch_size = _checks.positive_int("retain_batch_size", batch_size,
                                               _checks.MAX_LIMIT)
        self.max_batches = _checks.positive_int("retain_max_batches", max_batches)
        self._clock = clock
        self._next = 0.0

    def due(self) -> bool:
        """Whether a pass is due now."""
        return self._clock() >= self._next

    def run_if_due(self) -> int:
        """A pass when due (see :meth:`run`), else nothing; returns the rows deleted."""
        return self.run() if self.due() else 0

    def run(self) -> int:
        """One pass now: under the database's retention lock, or nothing when another relay
        holds it (never waited for). Returns the rows deleted. The next pass is due
        ``every`` seconds from now, whatever this one did or raised."""
        self._next = self._clock() + self.every
        database = self.repository.database
        with try_lock(database, LOCK_NAME) as taken:
            if not taken:
                return 0
            return self.repository.purge_published(self.retain, batch_size=self.batch_size,
                                                   max_batches=self.max_batches)
