"""The shipping consumer on BullMQ: a bullmq Worker on the queue the relay adds jobs to.

A job's id is the event's message id and its data the event's payload; BullMQ records the
job complete when ``process`` returns, after the shipment's commit. Ctrl-C or SIGTERM stop it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from bullmq import Worker

import shipping

REDIS_URL = os.environ.get("OUTBOX_BULLMQ_URL", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("ORDERS_TOPIC", "orders")


async def process(job: Any, token: str) -> None:
    if job.name == "order.placed":
        # The database work in a thread: BullMQ renews the job's lock on this event loop.
        shipped = await asyncio.to_thread(shipping.apply, job.id, job.data)
        shipping.report(job.id, job.data, shipped)


async def main() -> None:
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    worker = Worker(QUEUE, process, {"connection": REDIS_URL})
    print(f"shipping: consuming BullMQ queue {QUEUE}", flush=True)
    await stop.wait()
    await worker.close()


if __name__ == "__main__":
    asyncio.run(main())
