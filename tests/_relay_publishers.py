"""Publisher factories for ``outbox-lite relay --publisher _relay_publishers:NAME`` in the
end-to-end tests (run with this folder on PYTHONPATH). They read their settings from
``OUTBOX_TEST_*`` variables, as a service's factory would read its own."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence


class _Hanging:
    """Publishes its batches like any relay's publisher (BullMQ's, RabbitMQ's, NATS's), but
    after its Nth batch reached the broker it writes its marker file and hangs before the relay
    can record anything: the test kills the process there (SIGKILL), mid-batch."""

    def __init__(self, publisher: Any) -> None:
        self.publisher = publisher
        self.hang_after = int(os.environ["OUTBOX_TEST_HANG_AFTER"])
        self.marker = Path(os.environ["OUTBOX_TEST_MARKER"])
        self.batches = 0

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        failures = self.publisher.publish(events)
        self.batches += 1
        if self.batches == self.hang_after:
            self.marker.write_text(",".join(str(e.id) for e in events))
            while True:
                signal.pause()  # until the SIGKILL
        return failures

    def ping(self) -> None:
        self.publisher.ping()

    def close(self) -> None:
        self.publisher.close()


def hanging_bullmq() -> _Hanging:
    from outbox_lite.publishers.bullmq import BullMQPublisher  # only here: it costs 0.1 s
    return _Hanging(BullMQPublisher(os.environ["OUTBOX_TEST_REDIS_URL"],
                                    os.environ["OUTBOX_TEST_QUEUE"]))


def hanging_rabbitmq() -> _Hanging:
    from outbox_lite.publishers.rabbitmq import RabbitMQPublisher
    return _Hanging(RabbitMQPublisher(os.environ["OUTBOX_TEST_RABBITMQ_URL"],
                                      os.environ["OUTBOX_TEST_EXCHANGE"]))


def hanging_nats() -> _Hanging:
    from outbox_lite.publishers.nats import NATSPublisher
    return _Hanging(NATSPublisher(os.environ["OUTBOX_TEST_NATS_URL"],
                                  os.environ["OUTBOX_TEST_SUBJECT_PREFIX"]))


class _Gated:
    """Publishes nothing anywhere: each publish writes ``entered`` in its folder and returns
    (all published) only once the test has written ``go`` there: a publish as slow as the
    test wants."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.batches = 0

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        self.batches += 1
        (self.folder / "entered").write_text(str(self.batches))
        deadline = time.monotonic() + 60
        while not (self.folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return {}

    def close(self) -> None:
        (self.folder / "closed").write_text("yes")


def gated() -> _Gated:
    return _Gated(Path(os.environ["OUTBOX_TEST_GATE"]))


def not_a_publisher() -> object:
    return object()


class Unavailable(Exception):
    """A broker's temporary refusal: the event is retried."""

    error_code = "unavailable"


class Rejected(Exception):
    """A broker's final refusal: the event becomes a dead letter at once."""

    retryable = False
    error_code = "rejected"


class _Flaky:
    """Publishes nothing anywhere, and fails events by their id, so a test can tell the
    ledger in advance: an id divisible by 11 is rejected for good (a dead letter at once),
    one divisible by 5 is unavailable on its first attempt (retried, then published); every
    other event is published at its first attempt."""

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        failures: dict[int, BaseException] = {}
        for event in events:
            if event.id % 11 == 0:
                failures[event.id] = Rejected("the broker refused the message for good")
            elif event.id % 5 == 0 and event.attempt_count == 1:
                failures[event.id] = Unavailable("the broker is busy; try again")
        return failures

    def close(self) -> None:
        pass


def flaky() -> _Flaky:
    return _Flaky()


def _inside_stop_waits(action: Any) -> None:
    """Call ``action()`` in this (the relay's main) thread each time ``Relay.run`` waits on
    its stop Event or, idle, on its doorbell, at the instant the thread holds that lock (inside
    ``Event.wait()``, entering ``Condition.wait()``: the instant of issue 17's py-spy stack,
    where a handler that calls ``Event.set()`` deadlocks). ``action`` returns False to stop
    watching."""
    import sys
    import threading

    from outbox_lite.relay import Relay
    from outbox_lite.wake import Doorbell

    def tracer(frame: Any, event: str, arg: Any) -> None:
        caller = frame.f_back
        if (event == "call" and frame.f_code is threading.Condition.wait.__code__
                and caller is not None and (
                    # the relay's idle wait: on its doorbell (outbox_lite.wake), which
                    # sleeps on the stop Event's own condition
                    caller.f_code is Doorbell.wait.__code__
                    or caller.f_code is threading.Event.wait.__code__
                    and caller.f_back is not None
                    and caller.f_back.f_code in (Relay.run.__code__, Relay._survive.__code__))):
            assert frame.f_locals["self"]._lock.locked()  # held by this thread
            if action() is False:
                sys.settrace(None)
        return None

    sys.settrace(tracer)


def sigterm_inside_event_wait() -> _Flaky:
    """A flaky publisher in a relay that raises SIGTERM in its own main thread inside its
    first wait on the stop Event, holding that Event's lock; then it writes
    ``$OUTBOX_TEST_MARKER``."""
    marker = Path(os.environ["OUTBOX_TEST_MARKER"])

    def raise_sigterm() -> bool:
        signal.raise_signal(signal.SIGTERM)  # the handler runs before this returns
        marker.write_text("raised inside Event.wait")
        return False

    _inside_stop_waits(raise_sigterm)
    return _Flaky()


def slow_stop_waits() -> _Flaky:
    """A flaky publisher in a relay whose every wait on its stop Event holds that Event's
    lock 20 ms longer (a main thread descheduled there, made likely): a signal sent at a
    random instant lands in that window often enough to find a handler that needs the lock."""

    def linger() -> None:
        time.sleep(0.02)  # a signal arriving now runs its handler here, the lock held

    _inside_stop_waits(linger)
    return _Flaky()


class _SignalsInItsFinalizer:
    """An object whose finalizer is where the second Ctrl-C lands (as it landed in PyMySQL's
    MySQLResult.__del__ in a CI run)."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # again: a stop at once, its handler run here
        time.sleep(0.05)


#: Never set: a broker that never answers.
_NO_ANSWER = threading.Event()


class _InterruptedInAFinalizer:
    """Its first publish gets Ctrl-C (the relay's graceful stop), then a second one while a
    finalizer runs, then hangs on a broker that never answers, until the stop at once
    (delivered again once the finalizer is over) interrupts it. Should it never come, the
    publish gives up after 10 s and succeeds: the relay then records its batch, and the
    test sees no claims held."""

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the relay's graceful stop
        time.sleep(0.2)
        _SignalsInItsFinalizer()  # dropped at once: its __del__ runs here
        _NO_ANSWER.wait(10.0)  # a lock wait: a signal's handler runs (and raises) in it
        return {}

    def close(self) -> None:
        pass


def interrupted_in_a_finalizer() -> _InterruptedInAFinalizer:
    return _InterruptedInAFinalizer()


class _HalfMade:
    """As PyMySQL's MySQLResult when a signal lands in its ``__init__``: the attribute its
    ``__del__`` reads was never set, so finalizing it raises AttributeError."""

    def __init__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the relay's graceful stop
        os.kill(os.getpid(), signal.SIGINT)  # again: a stop at once, raised here
        self.active = False

    def __del__(self) -> None:
        if self.active:
            pass


class _InterruptedMidResult:
    """Its first publish is interrupted while a half-made object lives in its frame."""

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        result = _HalfMade()
        return {} if result else {}

    def close(self) -> None:
        pass


def interrupted_mid_result() -> _InterruptedMidResult:
    return _InterruptedMidResult()


def hanging_celery() -> _Hanging:
    from outbox_lite.publishers.celery import CeleryPublisher
    return _Hanging(CeleryPublisher(os.environ["OUTBOX_TEST_CELERY_URL"],
                                    os.environ["OUTBOX_TEST_CELERY_TASK"],
                                    queue=os.environ["OUTBOX_TEST_CELERY_QUEUE"]))


class _Accepting:
    """Publishes nothing anywhere and reports every event published; one instance per
    database of a relay process (the factory is called once for each), counted in
    ``MADE``."""

    MADE = 0

    def __init__(self) -> None:
        _Accepting.MADE += 1
        self.number = _Accepting.MADE

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        return {}

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<accepting publisher #{self.number}>"


def accepting() -> _Accepting:
    return _Accepting()
