"""Publisher factories for ``outbox-lite relay --publisher _relay_publishers:NAME`` in the
end-to-end tests (run with this folder on PYTHONPATH). They read their settings from
``OUTBOX_TEST_*`` variables, as a service's factory would read its own."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from outbox_lite.publishers.bullmq import BullMQPublisher


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
