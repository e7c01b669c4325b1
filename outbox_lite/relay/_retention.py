"""Retention (SPEC §13): between rounds, published events older than ``retain`` by the
server's clock are deleted, by one relay of the database at a time.

A pass is due at most every ``retain_every`` seconds. It takes the database's named lock
``outbox_lite.retain`` without waiting (:class:`outbox_lite._named_lock.Chore`): a relay that
finds it held skips the pass at once. The holder deletes with
:meth:`~outbox_lite.repository.OutboxRepository.purge_published` in autocommit, ``batch_size``
rows a statement, at most ``max_batches`` statements a pass, so a round is never held up long;
a full pass makes the next one due at the next round, so a backlog drains pass after pass. Each DELETE names its rows by primary key and repeats
``status = 'published'``: it never touches a pending, processing or failed row (dead letters are
kept until an operator acts), so no writer's INSERT and no claim's locking read waits on it.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Callable

from .. import _checks
from .._named_lock import RETAIN_BATCH_SIZE, RETAIN_MAX_BATCHES, Chore, default_retain_every
from ..repository import OutboxRepository

#: The named lock one relay of a database holds while it purges.
LOCK_NAME = "outbox_lite.retain"


class Retention(Chore):
    """Retention's passes over ``repository``'s outbox (see the module): :meth:`run_if_due`
    between rounds, :meth:`run` for one now; each returns the rows deleted."""

    def __init__(self, repository: OutboxRepository, retain: dt.timedelta | float,
                 every: float | None = None, *, batch_size: int = RETAIN_BATCH_SIZE,
                 max_batches: int = RETAIN_MAX_BATCHES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.repository = repository
        self.retain = _checks.duration("retain", retain)
        self.batch_size = _checks.positive_int("retain_batch_size", batch_size,
                                               _checks.MAX_LIMIT)
        self.max_batches = _checks.positive_int("retain_max_batches", max_batches)
        super().__init__(repository.database, LOCK_NAME,
                         default_retain_every(self.retain) if every is None else
                         _checks.duration("retain_every", every).total_seconds(),
                         self._purge, clock, full=self.batch_size * self.max_batches)

    def _purge(self) -> int:
        return self.repository.purge_published(self.retain, batch_size=self.batch_size,
                                               max_batches=self.max_batches)
