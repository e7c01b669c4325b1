"""The relay's vocabulary: what it hands events to (:class:`Publisher`), what it tells of its
work (:class:`RelayObserver`), what it counts (:class:`RoundResult`, :class:`RelayStats`), and
how a publisher's failure is stored (:func:`error_code`, :func:`error_message`)."""

from __future__ import annotations

import datetime as dt
import os
import socket
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from ..errors import OutboxError
from ..models import MAX_ERROR_CODE_LENGTH, OutboxEvent
from .._credentials import redact

if TYPE_CHECKING:
    from ..repository import OutboxStats


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

    def attach(self, relay: Any) -> None:
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
    #: transactions or statements the server rolled back for a conflict (a deadlock, a lock
    #: wait, a COMMIT a cluster refused): retried, never an outcome of an event
    lock_conflicts: int = 0
    retained: int = 0  # published events retention deleted (``Relay(retain=...)``)

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
    retained: int = 0
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


def error_code(exc: BaseException) -> str:
    """The ``last_error_code`` stored for a publisher's failure ``exc``: its ``error_code``
    attribute when that is a printable string, else its class name (cut to the column)."""
    code = getattr(exc, "error_code", None)
    if isinstance(code, str):
        code = code.strip()[:MAX_ERROR_CODE_LENGTH]
        if code and code.isprintable():
            return code
    return type(exc).__name__[:MAX_ERROR_CODE_LENGTH]


def error_message(exc: BaseException) -> str:
    """The ``last_error_message`` stored for ``exc``: its text with credentials redacted."""
    return redact(str(exc) or type(exc).__name__)
