"""The relay: the worker loop that moves claimed events from the outbox to a publisher.

One round: release expired claims (at most every ``release_every`` seconds), claim a batch in a
short transaction of its own, publish it outside any transaction while a heartbeat renews the
claims (``extend_locks``) if the publish runs long, then record the outcomes: one
``mark_published_many`` for the successes and a ``mark_failed`` for each failure (in
:meth:`Relay.run`, inside the next round's claim transaction: one commit per round). Nothing
claimed: wait, with a pause that doubles from ``idle_pause`` up to ``max_idle_pause``. A
publish that raised (the broker is down): wait until the publisher answers ``ping()`` before
claiming again, so an outage does not spend every event's attempts.
An event past its ``expires_at`` is never handed to the publisher: it becomes a dead letter
``expired`` (:class:`EventExpiredError`). With the ``[otel]`` extra each publish is traced
(:mod:`outbox_lite.tracing`): a span per batch linked to each event's creating context, and the
messages carry the trace on to their consumers.

Lock conflicts and lost connections never end :meth:`Relay.run`: the round is retried, after
:func:`outbox_lite.reconnect` with a bounded backoff when the connection broke (so also for a
database made with ``autoconnect=False`` and for a pooled one). A COMMIT or an outcome's
UPDATE whose answer was lost is not taken as undone: the relay reads what it holds
(:meth:`OutboxRepository.held_by`) and its outcomes' rows, and goes on from what is true.
A KeyboardInterrupt stops it at once, leaving its claims to expire
(:meth:`Relay.claims_held` counts them). Stopping finishes the batch in
hand and records its outcomes first. The relay imports no broker client: a publisher is any
object with ``publish(events)`` and ``close()`` (:class:`Publisher`). Nor any metrics client: a
relay given ``metrics`` tells that :class:`RelayObserver` what happens (its counts, rounds,
publish times, the events it recorded, the outbox's stats), and
:class:`outbox_lite.metrics.RelayMetrics` turns that into Prometheus families.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Protocol, Sequence

from . import _checks, tracing as _tracing, wake as _wake
from ._families import family_of
from ._clock import ServerClock
from ._db import CONNECTION_ERRORS, _drop, execute, is_connection_error, reconnect
from ._session import claim_transaction
from ._signals import interruption
from .errors import InvalidEventError, LockConflictError, OutboxError
from .models import MAX_ERROR_CODE_LENGTH, OutboxEvent
from .payload import redact
from .repository import OutboxRepository, OutboxStats

logger = logging.getLogger(__name__)


class Publisher(Protocol):
    """What the relay hands claimed events to (e.g. :class:`~outbox_lite.publishers.bullmq.
    BullMQPublisher`).

    ``publish`` returns the failures by event id (empty: every event was published); raising
    means the whole batch failed. A failure whose exception has ``retryable = False`` becomes
    a dead letter at once; others retry with the repository's backoff. The stored error code
    is the exception's ``error_code`` attribute, else its class name. ``close`` releases the
    client.
    """

    def publish(self, events: Sequence[OutboxEvent]) -> Mapping[int, BaseException]: ...

    def close(self) -> None: ...


class RelayObserver(Protocol):
    """What a relay tells of its work as it happens (:class:`outbox_lite.metrics.RelayMetrics`
    turns it into Prometheus families). Called from the relay's own thread, except ``attach``
    (from the thread that makes the relay); each call must be quick and must not raise."""

    #: Seconds between the ``repository.stats()`` readings the relay hands to
    #: :meth:`outbox_stats` while it runs.
    stats_every: float

    def attach(self, relay: Relay) -> None:
        """``relay`` was made with this observer (one observer may serve several relays)."""

    def counted(self, counts: RoundResult, published: Sequence[OutboxEvent],
                at: dt.datetime | None) -> None:
        """``counts`` were added to ``relay.stats``; ``published`` are the events whose
        publish was recorded among them, recorded at ``at`` (the repository's clock)."""

    def round_finished(self, publish_seconds: float | None) -> None:
        """A round ran to its end; its publish took ``publish_seconds`` (None: nothing was
        claimed)."""

    def outbox_stats(self, stats: OutboxStats) -> None:
        """A fresh ``repository.stats()``."""


def is_observer(obj: object) -> bool:
    """Whether ``obj`` has the :class:`RelayObserver` methods and ``stats_every``."""
    return (all(callable(getattr(obj, name, None))
                for name in ("attach", "counted", "round_finished", "outbox_stats"))
            and isinstance(getattr(obj, "stats_every", None), (int, float)))


@dataclass
class RoundResult:
    """What one round did (see :meth:`Relay.run_once`)."""

    claimed: int = 0
    published: int = 0
    retried: int = 0  # failed, back to pending with a backoff
    dead: int = 0  # failed for good: dead letters
    lost: int = 0  # claims that expired and were taken over before the outcome was recorded
    released: int = 0  # expired claims (of any worker) this round released
    publish_errors: int = 0  # 1 when the publisher raised: the whole batch failed
    expired: int = 0  # past their expires_at: dead letters, never published

    def add(self, other: RoundResult) -> None:
        _accumulate(self, other)


@dataclass
class RelayStats:
    """Totals since the relay was made, and where its time went (seconds)."""

    rounds: int = 0
    claimed: int = 0
    published: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0
    released: int = 0
    publish_errors: int = 0
    expired: int = 0
    lock_conflicts: int = 0
    reconnects: int = 0
    renewals: int = 0
    claim_seconds: float = 0.0
    publish_seconds: float = 0.0
    record_seconds: float = 0.0
    idle_seconds: float = 0.0
    #: The seconds these figures are timed by (``time.monotonic``; a test gives its own).
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    started: float = field(default=-1.0, repr=False)  # -1: ``clock()`` when made

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()
        self._rate_from = (self.started, self.published)

    def add(self, result: RoundResult) -> None:
        _accumulate(self, result)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("started", "clock")}

    def recent_rate(self) -> tuple[float, float]:
        """Events published per second since the last call (the first: since the relay was
        made), and over how many seconds; the next call counts from now. A burst followed by
        idle time shows as the idle rate, not as a lifetime average."""
        now = self.clock()
        since, published = self._rate_from
        self._rate_from = (now, self.published)
        seconds = now - since
        return (self.published - published) / seconds if seconds > 0 else 0.0, seconds


def _accumulate(total: RoundResult | RelayStats, part: RoundResult) -> None:
    """Add each count of ``part`` to the field of the same name in ``total``."""
    for f in fields(part):
        setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))


@dataclass
class _Outcomes:
    """A published batch's outcomes, not recorded yet."""

    ok: list[OutboxEvent]  # published: one mark_published_many
    failed: list[tuple[OutboxEvent, BaseException]]  # one mark_failed each
    give_up_at: float  # time.monotonic() past which the claims have expired

    def copy(self) -> _Outcomes:
        return _Outcomes(list(self.ok), list(self.failed), self.give_up_at)

    def events(self) -> list[OutboxEvent]:
        return [*self.ok, *(event for event, _ in self.failed)]

    def __len__(self) -> int:
        return len(self.ok) + len(self.failed)


class EventExpiredError(OutboxError):
    """An event's ``expires_at`` had passed when its turn to be published came: it is never
    published, and becomes a dead letter with ``last_error_code`` ``expired`` (SPEC §11)."""

    error_code = "expired"
    retryable = False

    def __init__(self, expires_at: dt.datetime) -> None:
        self.expires_at = expires_at
        super().__init__(f"expired at {expires_at:%Y-%m-%d %H:%M:%S.%f} UTC, before its"
                         " publish: never published")


def is_publisher(obj: object) -> bool:
    """Whether ``obj`` has the :class:`Publisher` methods, ``publish`` and ``close``."""
    return callable(getattr(obj, "publish", None)) and callable(getattr(obj, "close", None))


def default_worker_id() -> str:
    """host:pid:random, unique per relay."""
    return f"{socket.gethostname()[:200]}:{os.getpid()}:{os.urandom(3).hex()}"


def _error_code(exc: BaseException) -> str:
    code = getattr(exc, "error_code", None)
    if isinstance(code, str):
        code = code.strip()[:MAX_ERROR_CODE_LENGTH]
        if code and code.isprintable():
            return code
    return type(exc).__name__[:MAX_ERROR_CODE_LENGTH]


def _error_message(exc: BaseException) -> str:
    return redact(str(exc) or type(exc).__name__)


class Relay:
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
    ) -> None:
        if not isinstance(repository, OutboxRepository):
            raise TypeError("repository must be an OutboxRepository")
        if not is_publisher(publisher):
            raise TypeError("publisher must have publish(events) and close() (see Publisher)")
        self.repository = repository
        self.publisher = publisher
        self.worker_id = _checks.name("worker_id", worker_id or default_worker_id())
        self.batch_size = _checks.positive_int("batch_size", batch_size, _checks.MAX_LIMIT)
        self.lock_timeout = _checks.duration("lock_timeout", lock_timeout).total_seconds()
        self.ordered = _checks.flag("ordered", ordered)
        self.heartbeat = _seconds("heartbeat", heartbeat, self.lock_timeout / 3)
        if self.heartbeat >= self.lock_timeout:
            raise InvalidEventError(
                f"heartbeat ({self.heartbeat:g} s) must be shorter than lock_timeout "
                f"({self.lock_timeout:g} s), or claims expire between renewals")
        self.release_every = _seconds("release_every", release_every,
                                      min(30.0, self.lock_timeout / 4))
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
        self._heartbeat = _Heartbeat(repository, self.worker_id, self.heartbeat, self.stats,
                                     give_up_after=self.stuck_after)
        self._next_release = 0.0
        self._next_stats = 0.0
        #: time.monotonic() at which a claim transaction began whose COMMIT was not seen to
        #: succeed (None: none): the next round reads what this relay holds before going on.
        self._doubt_since: float | None = None
        self._given_up = 0  # lost claims counted by _give_up, not yet through _count
        self._running = False
        self._progress_at = 0.0  # time.monotonic() of the loop's last progress (see _progress)
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
        carried: _Outcomes | None = None
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
                    if self.metrics is not None and time.monotonic() >= self._next_stats:
                        self._read_stats()
                    if result.claimed:
                        idle.found_work()
                    elif until_empty and self._empty():
                        return
                    else:
                        started = time.monotonic()
                        self._progress(waiting=idle.next_pause())
                        idle.wait(stop)
                        self.stats.idle_seconds += time.monotonic() - started
                    reconnect_pause = self.reconnect_pause
                except LockConflictError as exc:
                    _reraise_interrupt(exc)
                    self.stats.lock_conflicts += 1  # the server rolled back: claim again
                    self._progress(waiting=self.idle_pause)
                    stop.wait(self.idle_pause)
                except CONNECTION_ERRORS as exc:
                    _reraise_interrupt(exc)  # a rollback on the connection it broke
                    if not is_connection_error(exc):
                        raise
                    logger.warning("relay %s lost the database connection (%s); reconnecting"
                                   " in %.1f s", self.worker_id, redact(str(exc)),
                                   reconnect_pause)
                    reconnect_pause = self._pause(reconnect_pause, stop)
                    self._reconnect()
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

    def _progress(self, *, waiting: float = 0.0) -> None:
        """The loop made progress now, and is about to wait ``waiting`` seconds on purpose
        (a pause is not a hang: its end counts as the progress)."""
        self._progress_at = time.monotonic() + waiting

    def run_once(self) -> RoundResult:
        """One round: release (when due), claim, publish, record. Returns its counts.

        Raises LockConflictError or a connection error from the claim transaction; after a
        connection error its COMMIT may have gone through, so the next round first reads what
        this relay holds and publishes that. Once a batch is claimed, its outcomes are
        recorded (retrying over lost connections and lock conflicts until the claims would
        have expired) before this returns.
        """
        result, outcomes = self._round(None)
        self._record(outcomes, result)
        return result

    def _round(self, carried: _Outcomes | None) -> tuple[RoundResult, _Outcomes | None]:
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
        started = time.monotonic()
        if not adopted:
            claimed_since = started
        recorded = RoundResult()
        published: list[OutboxEvent] = []
        # Until the COMMIT is seen to return, what it did is unknown: a lost connection (or
        # an interrupt) in between leaves the next round to read what this relay holds.
        self._doubt_since = claimed_since
        with claim_transaction(self._database):  # never SERIALIZABLE (see _session)
            if carried is not None:
                self._record_steps(carried.copy(), recorded, published)
            batch = adopted or self.repository.claim_batch(
                self.worker_id, limit=self.batch_size, ordered=self.ordered)
        self._doubt_since = None
        self.stats.claim_seconds += time.monotonic() - started
        self._count(recorded, published)  # committed: now it happened
        result.claimed = len(batch)
        outcomes = None
        publish_seconds = None
        if batch:
            failures, publish_seconds = self._publish(batch, result)
            self.stats.publish_seconds += publish_seconds
            outcomes = _Outcomes(
                ok=[e for e in batch if e.id not in failures],
                failed=[(e, failures[e.id]) for e in batch if e.id in failures],
                give_up_at=claimed_since + self.lock_timeout)
        self.stats.rounds += 1
        self._count(result)
        if self.metrics is not None:
            self.metrics.round_finished(publish_seconds)
        return result, outcomes

    def close(self) -> None:
        """Stop the heartbeat thread. The publisher and the database stay the caller's."""
        self._heartbeat.stop()

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

    def log_progress(self) -> None:
        """Log one line of progress (never a payload or a credential): the totals since the
        relay was made, the same counts its metrics report, and the rate of publishing since
        the previous line (not a lifetime average, which idle time would drag down)."""
        s = self.stats
        rate, seconds = s.recent_rate()
        logger.info("relay %s: %d published, %d retried, %d dead, %d lost, %d released,"
                    " %d publish errors in %d rounds (%d expired; %.0f events/s in the last"
                    " %.3g s; seconds in claim %.2f, publish %.2f, record %.2f, idle %.2f)",
                    self.worker_id, s.published, s.retried, s.dead, s.lost, s.released,
                    s.publish_errors, s.rounds, s.expired, rate, seconds, s.claim_seconds,
                    s.publish_seconds, s.record_seconds, s.idle_seconds)

    # -- one batch --------------------------------------------------------------------------

    def _publish(self, batch: list[OutboxEvent],
                 result: RoundResult) -> tuple[dict[int, BaseException], float]:
        """The publisher's failures by event id (a raising publish fails the whole batch),
        and the seconds the publish took. An event past its ``expires_at`` (by the
        repository's clock, as last read: no statement here) is not handed to the publisher:
        its failure is an :class:`EventExpiredError`."""
        expired: dict[int, BaseException] = {}
        if any(event.expires_at is not None for event in batch):
            now = self._recorded_at()
            expired = {event.id: EventExpiredError(event.expires_at) for event in batch
                       if event.expires_at is not None and event.expires_at <= now}
            batch = [event for event in batch if event.id not in expired]
            if not batch:
                return expired, 0.0
        self._heartbeat.hold([e.id for e in batch])
        started = time.monotonic()
        try:
            failures = {**self._publish_traced(batch), **expired}
        except Exception as exc:  # noqa: BLE001 - the whole batch failed: recorded as such
            logger.warning("relay %s: publishing %d events failed: %s", self.worker_id,
                           len(batch), _error_message(exc))
            result.publish_errors = 1
            return {**{event.id: exc for event in batch}, **expired}, time.monotonic() - started
        finally:
            self._heartbeat.release()
        seconds = time.monotonic() - started
        ids = {event.id for event in batch} | expired.keys()
        unknown = failures.keys() - ids
        if unknown:
            logger.warning("relay %s: the publisher reported %d failures for events not in"
                           " the batch; ignored", self.worker_id, len(unknown))
        return {event_id: exc for event_id, exc in failures.items() if event_id in ids}, seconds

    def _publish_traced(self, batch: list[OutboxEvent]) -> dict[int, BaseException]:
        """``publisher.publish(batch)``, inside the batch's spans when tracing: the publisher
        then gets copies of the events whose headers carry their messages' trace context."""
        if self.tracer is None:
            return dict(self.publisher.publish(batch))
        with self.tracer.publish(batch) as spans:
            failures = dict(self.publisher.publish(spans.events))
            spans.finish(failures)
        return failures

    def _record(self, outcomes: _Outcomes | None, result: RoundResult | None) -> None:
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
                _reraise_interrupt(exc)
                self.stats.lock_conflicts += 1
                if time.monotonic() + pause > outcomes.give_up_at:
                    self._give_up(outcomes, counts, "a lock conflict")
                    break
                logger.warning("relay %s: recording outcomes met a lock conflict (%s);"
                               " retrying in %.1f s", self.worker_id, exc, pause)
                pause = self._pause(pause)
            except CONNECTION_ERRORS as exc:
                _reraise_interrupt(exc)
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

    def _record_steps(self, outcomes: _Outcomes, counts: RoundResult,
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
                unrecorded = _Outcomes(outcomes.ok, [], outcomes.give_up_at)
                self._settle(unrecorded, counts, published)
                outcomes.ok = unrecorded.ok  # still held (none, but never dropped unsaid)
        while outcomes.failed:
            event, exc = outcomes.failed[0]
            retry = getattr(exc, "retryable", True) is not False
            if self.repository.mark_failed(event.id, self.worker_id, _error_code(exc),
                                           _error_message(exc), retryable=retry):
                if isinstance(exc, EventExpiredError):
                    counts.expired += 1
                elif retry and event.attempt_count < self.repository.max_attempts:
                    counts.retried += 1
                else:
                    counts.dead += 1
            else:
                self._settle(_Outcomes([], [(event, exc)], outcomes.give_up_at), counts,
                             published)
            outcomes.failed.pop(0)

    def _settle(self, outcomes: _Outcomes, counts: RoundResult,
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
            elif where == "same claim" and code == _error_code(exc) and status in (
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

    def _settle_doubt(self, carried: _Outcomes | None) -> list[OutboxEvent]:
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

    def _give_up(self, outcomes: _Outcomes, counts: RoundResult,
                 why: str = "the claims' expiry") -> None:
        logger.error("relay %s: gave up recording %d outcomes after %s: the claims have"
                     " expired and will be published again", self.worker_id, len(outcomes),
                     why)
        counts.lost += len(outcomes)
        self._given_up += len(outcomes)

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

    # -- helpers ----------------------------------------------------------------------------

    def _wait_for_publisher(self, stop: threading.Event) -> None:
        """After a publish that raised (the broker is down, most likely): wait, with a pause
        that doubles up to ``max_reconnect_pause``, until the publisher's ``ping()`` answers
        (one pause when it has none). Claiming meanwhile would spend an attempt of every
        event claimed, and a long outage would turn them all into dead letters."""
        ping = getattr(self.publisher, "ping", None)
        pause = self.reconnect_pause
        started = time.monotonic()
        while True:
            self._progress(waiting=pause)
            if stop.wait(pause) or not callable(ping):
                break
            try:
                ping()
                break
            except Exception as exc:  # noqa: BLE001 - still down: wait longer
                logger.info("relay %s: the publisher is still unavailable (%s); next try in"
                            " %.1f s", self.worker_id, _error_message(exc),
                            min(self.max_reconnect_pause, pause * 2))
            pause = min(self.max_reconnect_pause, pause * 2)
        self.stats.idle_seconds += time.monotonic() - started

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


def _reraise_interrupt(exc: BaseException) -> None:
    """Raise the KeyboardInterrupt ``exc`` was raised while unwinding from, if any."""
    interrupt = interruption(exc)
    if interrupt is not None:
        raise interrupt


def _seconds(name: str, value: float | None, default: float | None = None, *,
             allow_zero: bool = False) -> float:
    if value is None and default is not None:
        return default
    if allow_zero and value == 0:
        return 0.0
    return _checks.duration(name, value).total_seconds()


class _Heartbeat:
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
        with self._cond:
            self._held = None
            self._cond.notify_all()

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
                self.stats.renewals += 1
                with self._cond:
                    current = self._held == held
                if current and renewed < len(held):
                    logger.warning("relay %s: %d of %d claims were lost during a long"
                                   " publish", self.worker_id, len(held) - renewed, len(held))
        finally:
            _drop(database)
