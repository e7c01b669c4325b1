"""The relay: the worker loop that moves claimed events from the outbox to a publisher.

One round: release expired claims (at most every ``release_every`` seconds), claim a batch in a
short transaction of its own, publish it outside any transaction while a heartbeat renews the
claims (``extend_locks``) if the publish runs long, then record the outcomes: one
``mark_published_many`` for the successes and a ``mark_failed`` for each failure (in
:meth:`Relay.run`, inside the next round's claim transaction: one commit per round). Nothing
claimed: wait, with a pause that doubles from ``idle_pause`` up to ``max_idle_pause``. A
publish that raised (the broker is down): wait until the publisher answers ``ping()`` before
claiming again, so an outage does not spend every event's attempts. With ``retain``, published
events older than that are deleted between rounds, by one relay of the database at a time
(:mod:`._retention`).
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

from ._contract import (
    EventExpiredError,
    Publisher,
    RelayObserver,
    RelayStats,
    RoundResult,
    default_worker_id,
    is_observer,
    is_publisher,
)
from ._group import RelayGroup, database_name
from ._loop import Relay

__all__ = ["EventExpiredError", "Publisher", "Relay", "RelayGroup", "RelayObserver",
           "RelayStats", "RoundResult", "database_name", "default_worker_id", "is_observer",
           "is_publisher"]
