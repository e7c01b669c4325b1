"""The heartbeat: renews the claims of a batch whose publish runs long (``extend_locks``), from
a thread and a connection of its own, so a slow broker does not let them expire."""

from __future__ import annotations

import logging
import threading
import time

from .._db import _drop
from .._credentials import redact
from ..repository import OutboxRepository
from ._contract import RelayStats

logger = logging.getLogger(__package__)


class Heartbeat:
    """Renews a batch's claims every ``interval`` seconds while its publish runs, from a
    thread of its own (so on a connection of its own), until the publish has run
    ``give_up_after`` seconds: a publish that never returns must not keep its events from
    every other relay for ever."""

    def __init__(self, repository: OutboxRepository, worker_id: str, interval: float,
                 stats: RelayStats, *, give_up_after: float) -> None:
        self.repository = repository
        self.worker_id = worker_id
        self.interval = interval
        self.give_up_after = give_up_after
        self.stats = stats
        self._cond = threading.Condition()
        self._held: list[int] | None = None
        self._held_at = 0.0
        self._since = 0.0
        self._stopping = False
        self._renewing = False
        self._thread: threading.Thread | None = None

    def hold(self, event_ids: list[int]) -> None:
        with self._cond:
            self._held, self._since = event_ids, time.monotonic()
            self._held_at = self._since
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"outbox-relay-heartbeat-{self.worker_id}")
                self._thread.start()
            self._cond.notify_all()

    def release(self) -> None:
        """Stop renewing the held batch; returns once a renewal under way has ended, so the
        heartbeat holds no connection between batches (a pool's connection is back in it)."""
        with self._cond:
            self._held = None
            self._cond.notify_all()
            while self._renewing:
                self._cond.wait()

    def stop(self) -> None:
        with self._cond:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join()

    def _due(self) -> list[int] | None:
        """Wait until the held batch is due for renewal; None when stopping."""
        with self._cond:
            while not self._stopping:
                if self._held is None:
                    self._cond.wait()
                    continue
                if time.monotonic() - self._held_at > self.give_up_after:
                    logger.warning(
                        "relay %s: a publish has run for more than %g s: its %d claims are no"
                        " longer renewed, so they expire and another relay publishes them",
                        self.worker_id, self.give_up_after, len(self._held))
                    self._held = None  # until the next batch is held
                    continue
                wait = self._since + self.interval - time.monotonic()
                if wait <= 0:
                    self._since = time.monotonic()
                    self._renewing = True  # until _loop has handed its connection back
                    return list(self._held)
                self._cond.wait(wait)
            return None

    def _loop(self) -> None:
        database = self.repository.database
        try:
            while (held := self._due()) is not None:
                # A connection per renewal, handed back at once: a pooled one returns to its
                # pool even when the relay is never closed (then this thread never ends).
                try:
                    if database.is_closed():
                        database.connect()  # autoconnect=False too
                    renewed = self.repository.extend_locks(held, self.worker_id)
                except Exception as exc:  # noqa: BLE001 - the main loop records the outcome
                    logger.warning("relay %s: renewing %d claims failed: %s", self.worker_id,
                                   len(held), redact(str(exc)))
                    continue  # a new connection at the next beat
                finally:
                    _drop(database)
                    with self._cond:
                        self._renewing = False
                        self._cond.notify_all()
                self.stats.renewals += 1
                with self._cond:
                    current = self._held == held
                if current and renewed < len(held):
                    logger.warning("relay %s: %d of %d claims were lost during a long"
                                   " publish", self.worker_id, len(held) - renewed, len(held))
        finally:
            _drop(database)
