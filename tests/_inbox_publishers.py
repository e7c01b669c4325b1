"""Publisher factories for the inbox's end-to-end test (``outbox-lite relay --publisher
_inbox_publishers:NAME``, this folder on PYTHONPATH)."""

from __future__ import annotations

import os

from outbox_lite.publishers.bullmq import BullMQPublisher

from _relay_publishers import _Hanging


def hanging_forgetful_bullmq() -> _Hanging:
    """The relay that hangs after its Nth batch is in Redis (killed there by the test), with
    jobs BullMQ removes once completed: so when the relay's successor publishes that batch
    again, BullMQ cannot drop the copies as duplicates and the consumer gets each event twice,
    as it would from RabbitMQ (or from BullMQ after its retention)."""
    return _Hanging(BullMQPublisher(os.environ["OUTBOX_TEST_REDIS_URL"],
                                    os.environ["OUTBOX_TEST_QUEUE"],
                                    job_options={"removeOnComplete": True}))
