"""Prometheus metrics and a health check for relays (SPEC §8), from what the relays tell.

A :class:`~outbox_lite.relay.Relay` made with ``metrics=RelayMetrics(...)`` tells it each count
it adds to its stats, each round, each publish's duration, each batch of events recorded
published, and a ``repository.stats()`` every ``stats_every`` seconds; this module, the only
one that imports ``prometheus_client`` (extra ``[metrics]``), turns that into exactly these
families:

==========================================  =========  ==========================================
``outbox_relay_events_total{outcome}``      counter    ``published``, ``retried``, ``dead``,
                                                       ``lost``, ``expired``
``outbox_relay_released_total``             counter    expired claims the relays released
``outbox_relay_publish_errors_total``       counter    batches whose publish raised
``outbox_relay_rounds_total``               counter    rounds run
``outbox_relay_conflicts_total``            counter    transactions and statements the server
                                                       rolled back for a lock conflict (a
                                                       deadlock, a lock wait, a COMMIT a
                                                       cluster refused), each retried
``outbox_relay_retained_total``             counter    published events retention deleted
                                                       (``Relay(retain=...)``)
``outbox_relay_publish_seconds``            histogram  one batch's publish
``outbox_relay_lag_seconds``                histogram  from an event's ``available_at`` to its
                                                       publish being recorded
``outbox_events{status}``                   gauge      events per status, from ``stats()``
``outbox_oldest_pending_age_seconds``       gauge      from ``stats()`` (0 when none)
``outbox_held_back_events``                 gauge      from ``stats()``
``outbox_oldest_published_age_seconds``     gauge      from ``stats()``: since the publish of
                                                       the published event that became
                                                       available first (0 when none)
==========================================  =========  ==========================================

The only labels are ``outcome`` and ``status``, each of a few fixed values: never an aggregate,
a payload, an error message or a worker id; and, in a process that relays for several
databases (:meth:`RelayMetrics.database`), ``database`` on every family: the operator's name
of each one, never a credential. The families come from one snapshot taken under one lock, so
within a scrape the lag histogram's count is ``events_total{outcome="published"}``.
The gauges are absent until the first ``stats()`` has been read.

:meth:`RelayMetrics.serve` answers ``/metrics`` (the registry's text format, by
``prometheus_client``) and ``/healthz``: 200 while every relay attached is running and its loop
made progress within its ``stuck_after`` (see :meth:`~outbox_lite.relay.Relay.progress_age`),
503 otherwise, with one line per relay saying why; labelled by database, 200 while every
database's relay runs and none is stuck, each line naming its database.
"""

from __future__ import annotations

import bisect
import logging
import socket
import socketserver
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

try:
    from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.utils import floatToGoString
except ImportError as exc:  # pragma: no cover - the [metrics] extra is not installed
    raise ImportError(f"outbox_lite.metrics needs the prometheus_client package ({exc});"
                      " install it with pip install 'outbox-lite[metrics]'") from exc

from . import _checks
from .errors import InvalidEventError
from .models import OutboxEvent, OutboxStatus

if TYPE_CHECKING:
    import datetime as dt

    from .relay import Relay, RoundResult
    from .repository import OutboxStats

logger = logging.getLogger(__name__)

OUTCOMES = ("published", "retried", "dead", "lost", "expired")
#: Seconds: a publish to a broker on the same network takes milliseconds; a slow one seconds.
PUBLISH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0)
#: Seconds: an idle relay publishes within ~0.1 s; a backlog, a retry backoff or an outage
#: make minutes or hours.
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
               300.0, 600.0, 1800.0, 3600.0, 21600.0, 86400.0)


class _Histogram:
    """Counts per bucket and a sum; the caller holds the lock."""

    def __init__(self, name: str, bounds: Sequence[float]) -> None:
        bounds = tuple(float(b) for b in bounds)
        if not bounds or list(bounds) != sorted(set(bounds)) or bounds[-1] == float("inf"):
            raise InvalidEventError(f"{name} buckets must be increasing finite numbers")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value

    def buckets(self) -> tuple[list[tuple[str, float]], float]:
        """(the cumulative count of each bucket by its bound, the sum), as a histogram
        family's sample takes them."""
        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            cumulative += count
            buckets.append((floatToGoString(bound), float(cumulative)))
        return buckets, self.sum

    def copy(self) -> _Histogram:
        copy = _Histogram.__new__(_Histogram)
        copy.bounds, copy.counts, copy.sum = self.bounds, list(self.counts), self.sum
        return copy


class _Tally:
    """What the relays of one database (or, unlabelled, of the whole process) told; the
    caller holds the RelayMetrics' lock."""

    def __init__(self, publish_buckets: Sequence[float], lag_buckets: Sequence[float]) -> None:
        self.events = dict.fromkeys(OUTCOMES, 0)
        self.released = self.publish_errors = self.rounds = self.conflicts = 0
        self.retained = 0
        self.publish = _Histogram("publish", publish_buckets)
        self.lag = _Histogram("lag", lag_buckets)
        self.stats: OutboxStats | None = None
        self.relays: weakref.WeakSet[Relay] = weakref.WeakSet()

    def counted(self, counts: RoundResult, published: Sequence[OutboxEvent],
                at: dt.datetime | None) -> None:
        for outcome in OUTCOMES:
            self.events[outcome] += getattr(counts, outcome)
        self.released += counts.released
        self.publish_errors += counts.publish_errors
        self.conflicts += counts.lock_conflicts
        self.retained += counts.retained
        if at is not None:
            for event in published:
                self.lag.observe(max(0.0, (at - event.available_at).total_seconds()))

    def round_finished(self, publish_seconds: float | None) -> None:
        self.rounds += 1
        if publish_seconds is not None:
            self.publish.observe(publish_seconds)

    def snapshot(self) -> _Tally:
        """A copy of the numbers, for a scrape outside the lock."""
        copy = _Tally.__new__(_Tally)
        copy.__dict__.update(self.__dict__)
        copy.events = dict(self.events)
        copy.publish = self.publish.copy()
        copy.lag = self.lag.copy()
        return copy


class RelayMetrics:
    """The relay metrics of SPEC §8, registered in ``registry`` (prometheus_client's default
    ``REGISTRY`` when None, which ``prometheus_client.start_http_server`` and most frameworks
    serve; pass a service's own ``CollectorRegistry`` to keep them there).

    Give it to one or more relays (``Relay(…, metrics=m)``): their counts add up, as the
    counters of one process should (a label per relay would be unbounded). A registry takes
    one RelayMetrics: a second one on the same registry is an InvalidEventError.
    ``stats_every`` bounds how often each relay reads ``repository.stats()`` for the gauges.

    One process relaying for several databases (SPEC §13) gives each database's relays
    ``metrics=m.database(name)`` instead: every family then carries the label
    ``database="<name>"`` (the operator's name for it, never a credential), and ``/healthz``
    answers for each database. A RelayMetrics is one or the other: relays given ``m`` itself
    and relays given ``m.database(…)`` do not mix (an InvalidEventError).
    """

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 stats_every: float = 15.0,
                 publish_buckets: Sequence[float] = PUBLISH_BUCKETS,
                 lag_buckets: Sequence[float] = LAG_BUCKETS) -> None:
        self.stats_every = _checks.duration("stats_every", stats_every).total_seconds()
        self._lock = threading.Lock()
        self._buckets = (publish_buckets, lag_buckets)
        #: The tallies by database name; None: the one of an unlabelled RelayMetrics.
        self._tallies: dict[str | None, _Tally] = {None: _Tally(*self._buckets)}
        self._labelled = False  # whether database() has been asked
        self.registry = REGISTRY if registry is None else registry
        if not callable(getattr(self.registry, "register", None)):
            raise TypeError("registry must be a prometheus_client CollectorRegistry")
        try:
            self.registry.register(self)
        except ValueError as exc:  # "Duplicated timeseries in CollectorRegistry"
            raise InvalidEventError(
                "the registry holds outbox_relay_* metrics already: give the relays of a"
                " process one RelayMetrics, or each its own registry") from exc

    # -- one database's relays ------------------------------------------------------------

    def database(self, name: str) -> DatabaseMetrics:
        """The observer to give the relays of the database called ``name`` (a printable
        string of at most 255 characters: the label ``database``'s value, so never a URL
        with a password). Asking again for a name gives the same numbers."""
        name = _checks.name("database", name)
        with self._lock:
            if not self._labelled:
                if self._tallies[None].relays:
                    raise InvalidEventError(
                        "relays were given this RelayMetrics itself: its families carry no"
                        " database label, so give every relay metrics.database(name)"
                        " instead, or none")
                self._labelled = True
                del self._tallies[None]
            self._tallies.setdefault(name, _Tally(*self._buckets))
        return DatabaseMetrics(self, name)

    def forget(self, name: str) -> None:
        """Drop the database called ``name`` and its numbers (its relay was stopped for good):
        its series leave ``/metrics`` and its line leaves ``/healthz``."""
        with self._lock:
            if self._labelled:
                self._tallies.pop(name, None)

    def _tally(self, name: str | None) -> _Tally:
        """The tally of ``name``; the caller holds the lock."""
        if (name is None) == self._labelled:
            raise InvalidEventError(
                "a RelayMetrics labels every relay by database or none: give every relay"
                " metrics.database(name), or every one the RelayMetrics itself")
        tally = self._tallies.get(name)
        if tally is None:  # forgotten while its relay still reports: counted afresh
            tally = self._tallies[name] = _Tally(*self._buckets)
        return tally

    # -- what the relays tell (outbox_lite.relay.RelayObserver) ---------------------------

    def attach(self, relay: Relay, database: str | None = None) -> None:
        with self._lock:
            self._tally(database).relays.add(relay)

    def counted(self, counts: RoundResult, published: Sequence[OutboxEvent],
                at: dt.datetime | None, database: str | None = None) -> None:
        with self._lock:
            self._tally(database).counted(counts, published, at)

    def round_finished(self, publish_seconds: float | None,
                       database: str | None = None) -> None:
        with self._lock:
            self._tally(database).round_finished(publish_seconds)

    def outbox_stats(self, stats: OutboxStats, database: str | None = None) -> None:
        with self._lock:
            self._tally(database).stats = stats

    # -- what Prometheus reads ------------------------------------------------------------

    def describe(self) -> Iterator[Metric]:
        """The families by name and kind, without samples (for the registry's checks)."""
        return self._families(described=True)

    def collect(self) -> Iterator[Metric]:
        """The families with their current values, from one snapshot."""
        return self._families(described=False)

    def _families(self, *, described: bool) -> Iterator[Metric]:
        with self._lock:
            tallies = {name: tally.snapshot() for name, tally in self._tallies.items()}
            labelled = self._labelled
        by = ["database"] if labelled else []

        def values(name: str | None, *more: str) -> list[str]:
            return [*([name] if labelled and name is not None else []), *more]

        family = CounterMetricFamily("outbox_relay_events", "Events by the outcome the relay"
                                     " recorded", labels=[*by, "outcome"])
        counters = [
            CounterMetricFamily("outbox_relay_released", "Expired claims the relay released",
                                labels=by),
            CounterMetricFamily("outbox_relay_publish_errors", "Batches whose publish raised",
                                labels=by),
            CounterMetricFamily("outbox_relay_rounds", "Rounds the relay ran", labels=by),
            CounterMetricFamily("outbox_relay_conflicts", "Transactions and statements rolled"
                                " back for a lock conflict (a COMMIT a cluster refused too),"
                                " each retried", labels=by),
            CounterMetricFamily("outbox_relay_retained", "Published events retention deleted",
                                labels=by)]
        publish = HistogramMetricFamily("outbox_relay_publish_seconds",
                                        "Seconds one batch's publish took", labels=by)
        lag = HistogramMetricFamily(
            "outbox_relay_lag_seconds",
            "Seconds from an event's available_at to its publish being recorded", labels=by)
        statuses = GaugeMetricFamily("outbox_events", "Events per status, from stats()",
                                     labels=[*by, "status"])
        oldest = GaugeMetricFamily(
            "outbox_oldest_pending_age_seconds",
            "Seconds the oldest dispatchable event has waited, from stats() (0 when none)",
            labels=by)
        held = GaugeMetricFamily(
            "outbox_held_back_events",
            "Pending events behind a dead letter of their aggregate, from stats()", labels=by)
        published = GaugeMetricFamily(
            "outbox_oldest_published_age_seconds",
            "Seconds since the oldest publish still kept, from stats() (0 when none)",
            labels=by)
        for name, t in sorted(tallies.items(), key=lambda item: item[0] or ""):
            for outcome, count in t.events.items():
                family.add_metric(values(name, outcome), float(count))
            for counter, value in zip(counters, (t.released, t.publish_errors, t.rounds,
                                                 t.conflicts, t.retained)):
                counter.add_metric(values(name), float(value))
            for histogram, numbers in ((publish, t.publish), (lag, t.lag)):
                buckets, sum_value = numbers.buckets()
                histogram.add_metric(values(name), buckets, sum_value)
            stats = t.stats
            if stats is not None and not described:
                for status in OutboxStatus:
                    statuses.add_metric(values(name, status.value),
                                        float(stats.counts.get(status.value, 0)))
                age = stats.oldest_pending_age
                oldest.add_metric(values(name), 0.0 if age is None else age.total_seconds())
                held.add_metric(values(name), float(stats.held_back))
                kept = stats.oldest_published_age
                published.add_metric(values(name),
                                     0.0 if kept is None else kept.total_seconds())
        yield family
        yield from counters
        yield publish
        yield lag
        yield statuses
        yield oldest
        yield held
        yield published

    # -- health ---------------------------------------------------------------------------

    def health(self) -> tuple[bool, list[str]]:
        """(healthy, one line per relay): healthy while at least one relay attached runs and
        no running relay's loop has gone without progress for longer than its
        ``stuck_after``. Labelled by database: healthy while every database has a relay
        running and none of them is stuck; each line starts with its database's name."""
        with self._lock:
            groups = {name: sorted(tally.relays, key=lambda r: r.worker_id)
                      for name, tally in self._tallies.items()}
            labelled = self._labelled
        if not labelled:
            return _health(groups[None])
        healthy, lines = bool(groups), []
        for name, relays in sorted(groups.items(), key=lambda item: item[0] or ""):
            ok, said = _health(relays)
            healthy = healthy and ok
            lines += [f"{name}: {line}" for line in said]
        if not groups:
            lines.append("no database has a relay")
        return healthy, lines

    # -- serving --------------------------------------------------------------------------

    def wsgi_app(self) -> Callable[..., Iterable[bytes]]:
        """A WSGI app: ``/metrics`` (the registry, by prometheus_client), ``/healthz``
        (:meth:`health`: 200 or 503, text), 404 for anything else."""
        metrics_app = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return metrics_app(environ, start_response)  # type: ignore[no-any-return]
            if path == "/healthz":
                healthy, lines = self.health()
                body = ("\n".join(["ok" if healthy else "stuck", *lines]) + "\n").encode()
                start_response("200 OK" if healthy else "503 Service Unavailable",
                               [("Content-Type", "text/plain; charset=utf-8"),
                                ("Content-Length", str(len(body)))])
                return [body]
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: try /metrics or /healthz\n"]

        return app

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve :meth:`wsgi_app` on ``host:port`` (port 0: any free one) from a daemon
        thread; returns the running server (``.port``, ``.close()``)."""
        return MetricsServer(self.wsgi_app(), host, port)



class DatabaseMetrics:
    """The :class:`~outbox_lite.relay.RelayObserver` of one database's relays in a
    :class:`RelayMetrics` labelled by database (:meth:`RelayMetrics.database`)."""

    def __init__(self, metrics: RelayMetrics, name: str) -> None:
        self.metrics = metrics
        self.name = name

    @property
    def stats_every(self) -> float:
        return self.metrics.stats_every

    def attach(self, relay: Relay) -> None:
        self.metrics.attach(relay, self.name)

    def counted(self, counts: RoundResult, published: Sequence[OutboxEvent],
                at: dt.datetime | None) -> None:
        self.metrics.counted(counts, published, at, self.name)

    def round_finished(self, publish_seconds: float | None) -> None:
        self.metrics.round_finished(publish_seconds, self.name)

    def outbox_stats(self, stats: OutboxStats) -> None:
        self.metrics.outbox_stats(stats, self.name)


def _health(relays: Sequence[Relay]) -> tuple[bool, list[str]]:
    """(healthy, one line per relay) of ``relays``: healthy while one of them runs and none
    that runs has gone without progress for longer than its ``stuck_after``."""
    lines, running, stuck = [], 0, 0
    for relay in relays:
        age = relay.progress_age()
        if age is None:
            lines.append(f"{relay.worker_id}: not running")
            continue
        running += 1
        if age > relay.stuck_after:
            stuck += 1
            lines.append(f"{relay.worker_id}: stuck: no progress for {age:.1f} s"
                         f" (more than {relay.stuck_after:g} s)")
        elif (trouble := relay.database_trouble()) is not None:  # trying: no hang, but said
            lines.append(f"{relay.worker_id}: waiting for its database for"
                         f" {trouble[0]:.1f} s ({trouble[1]})")
        else:
            lines.append(f"{relay.worker_id}: ok (last progress {age:.1f} s ago)")
    if not running:
        lines.append("no relay is running")
    return running > 0 and not stuck, lines


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the process at exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        logger.debug("metrics: " + format, *args)


class MetricsServer:
    """An HTTP server for a WSGI app, on a daemon thread of its own."""

    def __init__(self, app: Callable[..., Iterable[bytes]], host: str, port: int) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidEventError(f"port must be a whole number from 0 to 65535, not {port!r}")
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("_Server", (_ThreadingServer,), {"address_family": family})
        self._server: WSGIServer = make_server(host, port, app, server_class=server_class,
                                               handler_class=_QuietHandler)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name=f"outbox-metrics-{self.port}")
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
