"""Handing a claimed batch to the publisher: the events past their ``expires_at`` held back,
the heartbeat renewing the claims while the publish runs, the tracing hooks around it
(:mod:`outbox_lite.tracing`), and the wait for a publisher whose publish raised."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..models import OutboxEvent
from ._contract import EventExpiredError, RelayStats, RoundResult, error_message
from ._heartbeat import Heartbeat

logger = logging.getLogger(__package__)


class Publishing:
    """The relay's publish of a batch (mixed into :class:`~outbox_lite.relay.Relay`): it uses
    the relay's ``publisher``, ``tracer``, heartbeat and backoff."""

    publisher: Any
    tracer: Any
    worker_id: str
    stats: RelayStats
    reconnect_pause: float
    max_reconnect_pause: float
    _heartbeat: Heartbeat

    if TYPE_CHECKING:
        import datetime as dt

        def _recorded_at(self) -> dt.datetime: ...
        def _progress(self, *, waiting: float = 0.0) -> None: ...

    def _publish(self, batch: list[OutboxEvent],
                 result: RoundResult) -> tuple[dict[int, BaseException], float]:
        """The publisher's failures by event id (a raising publish fails the whole batch),
        and the seconds the publish took. An event past its ``expires_at`` (by the
        repository's clock, as last read: no statement here) is not handed to the publisher:
        its failure is an :class:`EventExpiredError`."""
        expired: dict[int, BaseException] = {}
        expiring = [event for event in batch if event.expires_at is not None]
        if expiring:
            now = self._recorded_at()
            expired = {event.id: EventExpiredError(event.expires_at) for event in expiring
                       if event.expires_at <= now}
            batch = [event for event in batch if event.id not in expired]
            if not batch:
                return expired, 0.0
        held = [event.id for event in batch]  # each event's id read once
        self._heartbeat.hold(held)
        started = time.monotonic()
        try:
            failures = {**self._publish_traced(batch), **expired}
        except Exception as exc:  # noqa: BLE001 - the whole batch failed: recorded as such
            logger.warning("relay %s: publishing %d events failed: %s", self.worker_id,
                           len(batch), error_message(exc))
            result.publish_errors = 1
            return {**{event.id: exc for event in batch}, **expired}, time.monotonic() - started
        finally:
            self._heartbeat.release()
        seconds = time.monotonic() - started
        ids = set(held) | expired.keys()
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
                            " %.1f s", self.worker_id, error_message(exc),
                            min(self.max_reconnect_pause, pause * 2))
            pause = min(self.max_reconnect_pause, pause * 2)
        self.stats.idle_seconds += time.monotonic() - started
