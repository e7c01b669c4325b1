"""The relay's loop: :class:`Relay`, its options, and one round (release, claim, publish,
record); the record (:mod:`._record`), the publish (:mod:`._publishing`) and interruption
(:mod:`._interruption`) are rooms of their own."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from typing import Any, Sequence

from .. import _checks, tracing as _tracing, wake as _wake
from .._clock import ServerClock
from .._db import CONNECTION_ERRORS, is_connection_error, reconnect
from .._families import family_of
from .._session import claim_transaction
from .._signals import interruption
from ..errors import InvalidEventError, LockConflictError, WriteSetTooLargeError, WrongHostError
from ..models import OutboxEvent
from .._credentials import redact
from ..repository import OutboxRepository, OutboxStats
from ._contract import (
    Publisher,
    RelayObserver,
    RelayStats,
    RoundResult,
    default_worker_id,
    is_observer,
    is_publisher,
)
from ._heartbeat import Heartbeat
from ._interruption import Interruption, reraise_interrupt
from ._publishing import Publishing
from ._record import Outcomes, Recording
from ._retention import Retention

logger = logging.getLogger(__package__)

#: What ends a round but never :meth:`Relay.run` (see :meth:`Relay._survive`).
_SURVIVED: tuple[type[Exception], ...] = (LockConflictError, *CONNECTION_ERRORS)


class Relay(Recording, Publishing, Interruption):
    """Runs the documented worker loop over ``repository`` for ``publisher``.

    Options:

    * ``worker_id``: the ``locked_by`` of every claim (default host:pid:random);
    * ``batch_size``: events per claim;
    * ``lock_timeout``: seconds after which claims count as expired;
    * ``ordered``: claim only heads of aggregates (:meth:`OutboxRepository.claim_batch`);
    * ``heartbeat``: seconds between renewals of a batch whose publish runs long (default: a
      third of ``lock_timeout``); renewals stop once the publish has run ``stuck_after``
      seconds, so the claims of a publish that never returns expire and another relay
      publishes those events (this one is then fenced off when it records);
    * ``release_every``: seconds between releases of expired claims (default: a quarter of
      ``lock_timeout``, at most 30);
    * ``retain``: a ``timedelta`` or seconds (None, the default: keep every event): published
      events whose ``published_at`` is older than that by the server's clock are deleted
      between rounds, by one relay of the database at a time, never waiting for another
      (:mod:`._retention`); dead letters are kept. ``retain_every``: seconds between such
      passes (default: a tenth of ``retain``, from 1 to 60);
    * ``idle_pause``, ``max_idle_pause``: the first and the longest wait when nothing was
      claimed (the defaults, 10 ms to 50 ms, keep an idle relay's delay under 100 ms for about
      60 cheap queries a second; with ``wake``, the longest is 2 s by default);
    * ``wake``: a wake-up URL (``redis://…`` or ``nats://…``, or None): the relay claims as
      soon as a repository of its database rings through it (:mod:`outbox_lite.wake`), and
      polls as the safety net; rings from this process's repositories wake it in any case;
    * ``reconnect_pause``, ``max_reconnect_pause``: the same after a lost database connection
      or a publish that raised (the publisher's ``ping()``, if it has one, is tried before the
      relay claims again);
    * ``progress_every``: seconds between progress lines (logged at INFO; 0 for none);
    * ``metrics``: a :class:`RelayObserver` told what happens (e.g.
      :class:`outbox_lite.metrics.RelayMetrics`); the relay also reads ``repository.stats()``
      for it every ``metrics.stats_every`` seconds while it runs;
    * ``tracing``: OpenTelemetry spans of each batch's publish, with the trace context of each
      event's write carried on to its consumer (:mod:`outbox_lite.tracing`); None (the
      default) when the ``[otel]`` extra is installed, from ``tracer_provider`` (None: the
      global one);
    * ``stuck_after``: seconds without progress of :meth:`run`'s loop after which it counts
      as stuck (:meth:`progress_age`): a call into the database or the publisher that does
      not return. Progress is a finished round, a reconnect attempt or a ping of the
      publisher; the relay's own pauses (idle, reconnect, waiting for the publisher) count as
      progress until they end, so an idle relay or one that waits out an outage is not
      stuck. Default: ``lock_timeout`` (a batch is meant to be published and recorded within
      it; the heartbeat renews the claims of one that takes longer, up to this bound), at
      least 10 s (a connect attempt's timeout).
    """

    def __init__(
        self,
        repository: OutboxRepository,
        publisher: Publisher,
        *,
        worker_id: str | None = None,
        batch_size: int = 100,
        lock_timeout: float = 300.0,
        ordered: bool = False,
        heartbeat: float | None = None,
        release_every: float | None = None,
        idle_pause: float = 0.01,
        max_idle_pause: float | None = None,
        reconnect_pause: float = 0.1,
        max_reconnect_pause: float = 5.0,
        progress_every: float = 10.0,
        metrics: RelayObserver | None = None,
        stuck_after: float | None = None,
        wake: str | None = None,
        tracing: bool | None = None,
        tracer_provider: Any = None,
        retain: dt.timedelta | float | None = None,
        retain_every: float | None = None,
    ) -> None:
        if not isinstance(repository, OutboxRepository):
            raise TypeError("repository must be an OutboxRepository")
        if not is_publisher(publisher):
            raise TypeError("publisher must have publish(events) and close() (see Publisher)")
        self.repository = repository
        self.publisher = publisher
        self.worker_id = _checks.name("worker_id", worker_id or default_worker_id())
        self.batch_size = _checks.positive_int("batch_size", batch_size, _checks.MAX_LIMIT)
        #: Events per claim now: ``batch_size`` until a cluster refuses a claim's transaction
        #: for its size (its write-set limit), then halved each time, down to 1.
        self.claim_limit = self.batch_size
        self.lock_timeout = _checks.duration("lock_timeout", lock_timeout).total_seconds()
        self.ordered = _checks.flag("ordered", ordered)
        self.heartbeat = _seconds("heartbeat", heartbeat, self.lock_timeout / 3)
        if self.heartbeat >= self.lock_timeout:
            raise InvalidEventError(
                f"heartbeat ({self.heartbeat:g} s) must be shorter than lock_timeout "
                f"({self.lock_timeout:g} s), or claims expire between renewals")
        self.release_every = _seconds("release_every", release_every,
                                      min(30.0, self.lock_timeout / 4))
        #: Retention's passes (None: events are kept).
        self.retention = (None if retain is None else
                          Retention(repository, retain, retain_every))
        self.idle_pause = _seconds("idle_pause", idle_pause)
        self.wake = _wake.wake_source(wake, repository.database)
        #: The database's own wake-up (PostgreSQL's LISTEN), heard with or without ``wake``.
        self.native_wake = _wake.native_source(repository.database)
        self.max_idle_pause = max(self.idle_pause, _seconds(
            "max_idle_pause", max_idle_pause,
            0.05 if self.wake is None and self.native_wake is None
            else _wake.DEFAULT_WAKE_MAX_IDLE_PAUSE))
        self._bell = _wake.Doorbell()
        self.reconnect_pause = _seconds("reconnect_pause", reconnect_pause)
        self.max_reconnect_pause = max(self.reconnect_pause,
                                       _seconds("max_reconnect_pause", max_reconnect_pause))
        self.progress_every = _seconds("progress_every", progress_every, allow_zero=True)
        self.stuck_after = _seconds("stuck_after", stuck_after, max(self.lock_timeout, 10.0))
        if metrics is not None and not is_observer(metrics):
            raise TypeError("metrics must be a RelayObserver (e.g. outbox_lite.metrics."
                            "RelayMetrics)")
        self.metrics = metrics
        if tracing is None:
            tracing = _tracing.available()
        #: The spans of each publish (None: not traced).
        self.tracer = (_tracing.PublishTracer(publisher, tracer_provider)
                       if _checks.flag("tracing", tracing) else None)
        self.stats = RelayStats()
        self._database = repository.database
        self._family = family_of(self._database)
        self._heartbeat = Heartbeat(repository, self.worker_id, self.heartbeat, self.stats,
                                     give_up_after=self.stuck_after)
        self._next_release = 0.0
        self._next_stats = 0.0
        #: time.monotonic() at which a claim transaction began whose COMMIT was not seen to
        #: succeed (None: none): the next round reads what this relay holds before going on.
        self._doubt_since: float | None = None
        self._given_up = 0  # lost claims counted by _give_up, not yet through _count
        self._running = False
        self._progress_at = 0.0  # time.monotonic() of the loop's last progress (see _progress)
        #: (time.monotonic() since when, the last error, redacted) while the loop cannot reach
        #: its database; None once a round has finished (see database_trouble)
        self._trouble: tuple[float, str] | None = None
        self._cut_short = False  # the last run() was stopped at once (see claims_held)
        if metrics is not None:
            metrics.attach(self)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, *, until_empty: bool = False) -> None:
        """Run rounds until ``stop`` is set (or, with ``until_empty``, until no event is
        pending or processing but those held back behind a dead letter of their aggregate,
        when claiming ordered). Lock conflicts and lost connections are survived; the batch in
        hand is recorded before it returns.

        A batch's outcomes are recorded in the same short transaction as the next claim, so
        each round costs one commit; the outcomes of the last batch are recorded alone."""
        stop = stop or threading.Event()
        reconnect_pause = self.reconnect_pause
        next_progress = time.monotonic() + self.progress_every
        carried: Outcomes | None = None
        self._running = True
        self._cut_short = False
        self._progress()
        idle = _wake.IdlePause(self.idle_pause, self.max_idle_pause, self._bell)
        stop_listening = _wake.listen(self._bell, self._database, self.wake,
                                      self.native_wake)
        try:
            while not stop.is_set():
                try:
                    idle.before_claim()
                    result, carried = self._round(carried)
                    if result.publish_errors:
                        self._record(carried, result)  # before a possibly long wait
                        carried = None
                        self._wait_for_publisher(stop)
                    self._trouble = None  # a round finished: the database answers
                    if self._rest(result, idle, stop, until_empty):
                        return
                    reconnect_pause = self.reconnect_pause
                except WriteSetTooLargeError as exc:
                    if carried is not None:  # record them alone: one transaction less large
                        self._record(carried, None)
                        carried = None
                    self._smaller_claims(exc, stop)
                except _SURVIVED as exc:
                    reconnect_pause = self._survive(exc, reconnect_pause, stop)
                self._progress()
                if self.progress_every and time.monotonic() >= next_progress:
                    self.log_progress()
                    next_progress = time.monotonic() + self.progress_every
        except BaseException as exc:
            if interruption(exc) is not None:  # an interrupt, or an error unwinding from one
                carried = None  # stopping at once: the claims held are left to expire
                self._cut_short = True
            raise
        finally:
            try:
                if carried is not None:
                    self._record(carried, None)
                self.close()
                if self.progress_every:
                    self.log_progress()
            finally:
                self._running = False
                stop_listening()

    def _rest(self, result: RoundResult, idle: _wake.IdlePause, stop: threading.Event,
              until_empty: bool) -> bool:
        """After a round: read the outbox's stats when the metrics are due, then no pause when
        work was found, else the idle wait (cut short by a wake-up or ``stop``). True when
        ``until_empty`` and the outbox is empty: the run is over."""
        if self.metrics is not None and time.monotonic() >= self._next_stats:
            self._read_stats()
        if result.claimed:
            idle.found_work()
        elif until_empty and self._empty():
            return True
        else:
            started = time.monotonic()
            self._progress(waiting=idle.next_pause())
            idle.wait(stop)
            self.stats.idle_seconds += time.monotonic() - started
        return False

    def _survive(self, exc: Exception, reconnect_pause: float, stop: threading.Event) -> float:
        """A round ended by a lock conflict or a lost connection: count it, wait, reconnect
        when the connection broke; returns the next reconnect pause. Anything else (a
        KeyboardInterrupt that ``exc`` was raised while unwinding from, an OperationalError
        that is no connection's) is raised."""
        reraise_interrupt(exc)  # e.g. a rollback on the connection an interrupt broke
        if isinstance(exc, LockConflictError):
            # The server rolled the round's transaction back (a COMMIT a cluster refused,
            # too): its outcomes stay carried, and the claim is tried again.
            logger.debug("relay %s: a lock conflict (%s); claiming again", self.worker_id, exc)
            self._count(RoundResult(lock_conflicts=1))
            self._progress(waiting=self.idle_pause)
            stop.wait(self.idle_pause)
            return reconnect_pause
        if not is_connection_error(exc):
            raise exc
        since = time.monotonic() if self._trouble is None else self._trouble[0]
        self._trouble = (since, redact(str(exc)))
        if isinstance(exc, WrongHostError):  # read-only, a standby: never the relay's death
            logger.warning("relay %s: %s; reconnecting in %.1f s", self.worker_id,
                           redact(str(exc)), reconnect_pause)
        else:
            logger.warning("relay %s lost the database connection (%s); reconnecting in "
                           "%.1f s", self.worker_id, redact(str(exc)), reconnect_pause)
        reconnect_pause = self._pause(reconnect_pause, stop)
        self._reconnect()
        return reconnect_pause

    def _smaller_claims(self, exc: WriteSetTooLargeError, stop: threading.Event) -> None:
        """A claim's transaction was over the cluster's write-set limit and nothing of it was
        written: claim half as many events from now on. At one event (a single row over the
        limit) there is nothing to halve: say so and try again after the idle pause."""
        if self.claim_limit > 1:
            self.claim_limit = max(1, self.claim_limit // 2)
            logger.warning("relay %s: %s; claiming %d events at a time from now on",
                           self.worker_id, exc, self.claim_limit)
            return
        logger.error("relay %s: %s; even one event is over the limit: raise it on the"
                     " cluster (trying again in %.1f s)", self.worker_id, exc, self.idle_pause)
        self._progress(waiting=self.idle_pause)
        stop.wait(self.idle_pause)

    @property
    def running(self) -> bool:
        """Whether :meth:`run` is running."""
        return self._running

    def progress_age(self) -> float | None:
        """Seconds since :meth:`run`'s loop last made progress (finished a round, or a step
        of a wait for the database or the publisher); None when it is not running. Past
        ``stuck_after``, the relay is stuck: a call into the database or the publisher has
        not returned."""
        if not self._running:
            return None
        return max(0.0, time.monotonic() - self._progress_at)

    def database_trouble(self) -> tuple[float, str] | None:
        """While :meth:`run` cannot reach its database (a lost connection, a server that
        refuses it, a host that cannot take writes): (seconds since the first failure, the
        last error, credentials redacted). None while rounds finish. The relay keeps trying,
        so this is no hang (:meth:`progress_age` stays small); it is what an operator asks."""
        trouble = self._trouble
        if trouble is None or not self._running:
            return None
        return max(0.0, time.monotonic() - trouble[0]), trouble[1]

    def _progress(self, *, waiting: float = 0.0) -> None:
        """The loop made progress now, and is about to wait ``waiting`` seconds on purpose
        (a pause is not a hang: its end counts as the progress)."""
        self._progress_at = time.monotonic() + waiting

    def run_once(self) -> RoundResult:
        """One round: release and retention (when due), claim, publish, record. Returns its
        counts.

        Raises LockConflictError or a connection error from the claim transaction; after a
        connection error its COMMIT may have gone through, so the next round first reads what
        this relay holds and publishes that. Once a batch is claimed, its outcomes are
        recorded (retrying over lost connections and lock conflicts until the claims would
        have expired) before this returns.
        """
        result, outcomes = self._round(None)
        self._record(outcomes, result)
        return result

    def _round(self, carried: Outcomes | None) -> tuple[RoundResult, Outcomes | None]:
        """Release (when due); in one transaction, record ``carried`` and claim; publish.
        Returns the round's counts and the new batch's outcomes, not recorded yet. When the
        transaction fails, the error propagates and the caller keeps ``carried``; as its
        COMMIT may have gone through, the next round first reads what it did
        (:meth:`_settle_doubt`): outcomes it recorded leave ``carried``, a batch it claimed
        is published."""
        result = RoundResult()
        adopted: list[OutboxEvent] = []
        claimed_since = time.monotonic()
        if self._doubt_since is not None:
            claimed_since = self._doubt_since
            adopted = self._settle_doubt(carried)
        if carried is not None and time.monotonic() > carried.give_up_at:
            self._give_up(carried, result)
            carried = None
        if time.monotonic() >= self._next_release:
            result.released = self.repository.release_expired_locks(self.lock_timeout)
            self._next_release = time.monotonic() + self.release_every
        if self.retention is not None:
            result.retained = self.retention.run_if_due()
        started = time.monotonic()
        if not adopted:
            claimed_since = started
        recorded = RoundResult()
        published: list[OutboxEvent] = []
        # Until the COMMIT is seen to return, what it did is unknown: a lost connection (or
        # an interrupt) in between leaves the next round to read what this relay holds.
        self._doubt_since = claimed_since
        try:
            with claim_transaction(self._database):  # never SERIALIZABLE (see _session)
                if carried is not None:
                    self._record_steps(carried.copy(), recorded, published)
                batch = adopted or self.repository.claim_batch(
                    self.worker_id, limit=self.claim_limit, ordered=self.ordered)
        except (LockConflictError, WriteSetTooLargeError):
            # Rolled back, COMMIT refused or not: nothing of it happened, so there is nothing
            # to read back, but for a batch adopted from an earlier doubt (held, unpublished).
            self._doubt_since = claimed_since if adopted else None
            raise
        self._doubt_since = None
        self.stats.claim_seconds += time.monotonic() - started
        self._count(recorded, published)  # committed: now it happened
        result.claimed = len(batch)
        outcomes = None
        publish_seconds = None
        if batch:
            failures, publish_seconds = self._publish(batch, result)
            self.stats.publish_seconds += publish_seconds
            if failures:
                ok = [e for e in batch if e.id not in failures]
                failed = [(e, failures[e.id]) for e in batch if e.id in failures]
            else:  # the usual batch: no event read twice for its id
                ok, failed = list(batch), []
            outcomes = Outcomes(ok=ok, failed=failed,
                                give_up_at=claimed_since + self.lock_timeout)
        self.stats.rounds += 1
        self._count(result)
        if self.metrics is not None:
            self.metrics.round_finished(publish_seconds)
        return result, outcomes

    def close(self) -> None:
        """Stop the heartbeat thread. The publisher and the database stay the caller's."""
        self._heartbeat.stop()

    def log_progress(self) -> None:
        """Log one line of progress (never a payload or a credential): the totals since the
        relay was made, the same counts its metrics report, and the rate of publishing since
        the previous line (not a lifetime average, which idle time would drag down)."""
        s = self.stats
        rate, seconds = s.recent_rate()
        logger.info("relay %s: %d published, %d retried, %d dead, %d lost, %d released,"
                    " %d publish errors in %d rounds (%d expired, %d lock conflicts, %d deleted"
                    " by retention; %.0f events/s in the last %.3g s; seconds in claim %.2f,"
                    " publish %.2f, record %.2f, idle %.2f)",
                    self.worker_id, s.published, s.retried, s.dead, s.lost, s.released,
                    s.publish_errors, s.rounds, s.expired, s.lock_conflicts, s.retained, rate,
                    seconds,
                    s.claim_seconds,
                    s.publish_seconds, s.record_seconds, s.idle_seconds)

    def _pause(self, pause: float, stop: threading.Event | None = None) -> float:
        """The one backoff after a fault: wait ``pause`` seconds (progress, not a hang; cut
        short by ``stop``); returns the next pause, doubled up to ``max_reconnect_pause``."""
        self._progress(waiting=pause)
        if stop is None:
            time.sleep(pause)
        else:
            stop.wait(pause)
        return min(self.max_reconnect_pause, pause * 2)

    def _count(self, counts: RoundResult, published: Sequence[OutboxEvent] = ()) -> None:
        """Add a round's (or a record's) counts to the totals, tell the metrics, and warn of
        lost claims: the one way into ``stats``' counts, so progress lines and metrics say
        the same."""
        given_up = min(counts.lost, self._given_up)  # _give_up said why already
        self._given_up -= given_up
        if counts.lost > given_up:
            logger.warning("relay %s: %d claims had expired and were taken over before their"
                           " outcome was recorded", self.worker_id, counts.lost - given_up)
        self.stats.add(counts)
        if self.metrics is not None:
            self.metrics.counted(counts, published, self._recorded_at() if published else None)

    def _recorded_at(self) -> dt.datetime:
        """Now by the repository's clock, for the metrics: never a statement of its own (a
        lost connection here must not lose a batch that was claimed), the server clock's
        last estimate instead, which the statement that recorded the events just refreshed."""
        clock = self.repository.clock
        at = clock.peek() if isinstance(clock, ServerClock) else None
        return at if at is not None else clock()

    def _empty(self) -> bool:
        stats = self._read_stats()
        left = stats.counts["pending"] + stats.counts["processing"]
        return left == (stats.held_back if self.ordered else 0)

    def _read_stats(self) -> OutboxStats:
        """``repository.stats()``, handed to the metrics too."""
        stats = self.repository.stats()
        if self.metrics is not None:
            self.metrics.outbox_stats(stats)
            self._next_stats = time.monotonic() + self.metrics.stats_every
        return stats

    def _reconnect(self) -> None:
        """A new connection, or (server unreachable) none: the next round tries again."""
        reconnect(self._database)
        self.stats.reconnects += 1

    def _reconnect_if_needed(self) -> None:
        """With ``autoconnect=False`` a dropped connection is not reopened by the next query."""
        if self._database.is_closed() and not getattr(self._database, "autoconnect", True):
            self._reconnect()


def _seconds(name: str, value: float | None, default: float | None = None, *,
             allow_zero: bool = False) -> float:
    if value is None and default is not None:
        return default
    if allow_zero and value == 0:
        return 0.0
    return _checks.duration(name, value).total_seconds()
