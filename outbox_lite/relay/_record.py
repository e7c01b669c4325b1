"""The record of a published batch: ``mark_published_many`` for the successes and a
``mark_failed`` for each failure, over lost connections and lock conflicts until the claims
would have expired; and, after a statement or a COMMIT whose answer was lost, the reading back
of what the server did (:meth:`Recording._settle`), so that nothing is counted or recorded on a
guess."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .._db import CONNECTION_ERRORS, execute, is_connection_error
from ..errors import LockConflictError
from ..models import OutboxEvent
from .._credentials import redact
from ..repository import OutboxRepository
from ._contract import EventExpiredError, RelayStats, RoundResult, error_code, error_message
from ._interruption import reraise_interrupt

logger = logging.getLogger(__package__)


@dataclass
class Outcomes:
    """A published batch's outcomes, not recorded yet."""

    ok: list[OutboxEvent]  # published: one mark_published_many
    failed: list[tuple[OutboxEvent, BaseException]]  # one mark_failed each
    give_up_at: float  # time.monotonic() past which the claims have expired

    def copy(self) -> Outcomes:
        return Outcomes(list(self.ok), list(self.failed), self.give_up_at)

    def events(self) -> list[OutboxEvent]:
        return [*self.ok, *(event for event, _ in self.failed)]

    def __len__(self) -> int:
        return len(self.ok) + len(self.failed)


class Recording:
    """The relay's record of its batches (mixed into :class:`~outbox_lite.relay.Relay`). It
    uses the relay's ``repository``, ``worker_id``, ``stats`` and backoff, and tells the relay
    what it counted (``_count``), when it made progress (``_progress``), and when it needs a
    new connection (``_reconnect``)."""

    repository: OutboxRepository
    worker_id: str
    stats: RelayStats
    reconnect_pause: float
    _database: Any
    _family: Any
    _doubt_since: float | None
    _given_up: int

    if TYPE_CHECKING:
        def _count(self, counts: RoundResult, published: Sequence[OutboxEvent] = ()
                   ) -> None: ...
        def _progress(self, *, waiting: float = 0.0) -> None: ...
        def _pause(self, pause: float, stop: Any = None) -> float: ...
        def _reconnect(self) -> None: ...
        def _reconnect_if_needed(self) -> None: ...

    def _record(self, outcomes: Outcomes | None, result: RoundResult | None) -> None:
        """Record ``outcomes`` on their own (autocommit), retrying over lost connections
        until the database is back or the claims have expired (then other relays publish them
        again, and the fencing refuses whatever this one could still record). The counts go
        to ``result`` too, when given."""
        if outcomes is None:
            return
        started = time.monotonic()
        counts = RoundResult()
        published: list[OutboxEvent] = []
        pause = self.reconnect_pause
        in_doubt = False  # a statement's answer was lost: read what it did before going on
        while outcomes:
            try:
                if in_doubt:
                    self._settle(outcomes, counts, published)
                    in_doubt = False
                    continue
                self._record_steps(outcomes, counts, published)  # each step done is done
            except LockConflictError as exc:
                # Someone else's lock (an operator's SELECT ... FOR UPDATE, say): wait, but
                # never past the claims' expiry, as for a lost connection.
                reraise_interrupt(exc)
                self._count(RoundResult(lock_conflicts=1))  # now: a wait may follow
                if time.monotonic() + pause > outcomes.give_up_at:
                    self._give_up(outcomes, counts, "a lock conflict")
                    break
                logger.warning("relay %s: recording outcomes met a lock conflict (%s);"
                               " retrying in %.1f s", self.worker_id, exc, pause)
                pause = self._pause(pause)
            except CONNECTION_ERRORS as exc:
                reraise_interrupt(exc)
                if not is_connection_error(exc):
                    raise
                in_doubt = True
                if time.monotonic() + pause > outcomes.give_up_at:
                    self._give_up(outcomes, counts, "a lost connection")
                    break
                logger.warning("relay %s: recording outcomes lost the connection (%s);"
                               " retrying in %.1f s", self.worker_id, redact(str(exc)), pause)
                pause = self._pause(pause)
                self._reconnect()
            self._progress()
        self.stats.record_seconds += time.monotonic() - started
        self._count(counts, published)
        if result is not None:
            result.add(counts)

    def _record_steps(self, outcomes: Outcomes, counts: RoundResult,
                      published: list[OutboxEvent]) -> None:
        """mark_published_many for the successes, then mark_failed for each failure,
        taking each from ``outcomes`` once its statement ran (in autocommit: once it is
        durable); counts what happened, and adds the events recorded published to
        ``published`` (when some claims were lost, which of the batch is not known: as many
        as were recorded)."""
        if outcomes.ok:
            recorded = self.repository.mark_published_many([e.id for e in outcomes.ok],
                                                           self.worker_id)
            if recorded == len(outcomes.ok):
                counts.published += recorded
                published.extend(outcomes.ok)
                outcomes.ok = []
            else:  # taken over, or recorded by an attempt whose answer was lost: read which
                unrecorded = Outcomes(outcomes.ok, [], outcomes.give_up_at)
                self._settle(unrecorded, counts, published)
                outcomes.ok = unrecorded.ok  # still held (none, but never dropped unsaid)
        while outcomes.failed:
            event, exc = outcomes.failed[0]
            retry = getattr(exc, "retryable", True) is not False
            if self.repository.mark_failed(event.id, self.worker_id, error_code(exc),
                                           error_message(exc), retryable=retry):
                if isinstance(exc, EventExpiredError):
                    counts.expired += 1
                elif retry and event.attempt_count < self.repository.max_attempts:
                    counts.retried += 1
                else:
                    counts.dead += 1
            else:
                self._settle(Outcomes([], [(event, exc)], outcomes.give_up_at), counts,
                             published)
            outcomes.failed.pop(0)

    def _settle(self, outcomes: Outcomes, counts: RoundResult,
                published: list[OutboxEvent]) -> None:
        """After a statement or a COMMIT whose answer was lost: read the rows of
        ``outcomes``' events and count those whose outcome is recorded (published, or back
        to pending / failed with this failure's code, and claimed no more since this relay's
        claim); those still held stay in ``outcomes``, to be recorded; the rest were taken
        over (``lost``)."""
        events = outcomes.events()
        if not events:
            return
        rows: dict[int, tuple[Any, ...]] = {}
        ids = [e.id for e in events]
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            statement = self._family.sql.OUTCOME_STATES
            rows.update((row[0], tuple(row[1:])) for row in execute(
                self._database, *statement.bind({"ids": self._family.id_list(chunk)}))
                .fetchall())

        def state(event: OutboxEvent) -> str:
            status, locked_by, attempts, _code = rows.get(event.id, (None, None, -1, None))
            if status == "processing" and locked_by == self.worker_id:
                return "held"
            return "same claim" if attempts == event.attempt_count else "taken over"

        kept_ok = []
        for event in outcomes.ok:
            where = state(event)
            if where == "held":
                kept_ok.append(event)
            elif where == "same claim" and rows[event.id][0] == "published":
                counts.published += 1
                published.append(event)
            else:
                counts.lost += 1
        kept_failed = []
        for event, exc in outcomes.failed:
            where = state(event)
            status, _, _, code = rows.get(event.id, (None, None, -1, None))
            if where == "held":
                kept_failed.append((event, exc))
            elif where == "same claim" and code == error_code(exc) and status in (
                    "pending", "failed"):
                if status == "pending":
                    counts.retried += 1
                elif isinstance(exc, EventExpiredError):
                    counts.expired += 1
                else:
                    counts.dead += 1
            else:
                counts.lost += 1
        outcomes.ok, outcomes.failed = kept_ok, kept_failed

    def _settle_doubt(self, carried: Outcomes | None) -> list[OutboxEvent]:
        """A claim transaction's COMMIT was not seen to succeed: find out what it did.
        Counts ``carried``'s outcomes it recorded (and leaves in ``carried`` those still to
        record); returns the events this relay holds besides, the batch it claimed, to be
        published now rather than left to expire."""
        self._reconnect_if_needed()
        if carried is not None:
            counts = RoundResult()
            published: list[OutboxEvent] = []
            self._settle(carried, counts, published)
            self._count(counts, published)  # now, as settled events leave ``carried``
        left = {e.id for e in carried.events()} if carried is not None else set()
        adopted = [e for e in self.repository.held_by(self.worker_id) if e.id not in left]
        self._doubt_since = None
        if adopted:
            logger.info("relay %s: a claim's COMMIT had gone through although its answer was"
                        " lost: publishing its %d events", self.worker_id, len(adopted))
        return adopted

    def _give_up(self, outcomes: Outcomes, counts: RoundResult,
                 why: str = "the claims' expiry") -> None:
        logger.error("relay %s: gave up recording %d outcomes after %s: the claims have"
                     " expired and will be published again", self.worker_id, len(outcomes),
                     why)
        counts.lost += len(outcomes)
        self._given_up += len(outcomes)
