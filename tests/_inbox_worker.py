"""A consumer process for the inbox's end-to-end test, written as a service would write it:
BullMQ's own Worker (the bullmq package), or a pika consumer with manual acks on a RabbitMQ
queue. For each message it opens ``db.atomic()``, calls ``inbox.accept(message id)`` and
writes its business row; then BullMQ records the job complete (when the processor returns),
or the consumer acks.

Settings come from ``OUTBOX_TEST_*`` variables (``OUTBOX_TEST_BROKER``: ``bullmq`` or
``rabbitmq``). With ``OUTBOX_TEST_HANG_AFTER=N`` the process, right after its Nth commit,
writes the message id to ``OUTBOX_TEST_MARKER`` and blocks before the completion or the ack
(BullMQ's lock on the job is not renewed either) until the test kills it with SIGKILL: a
consumer that died after its commit and before its ack. Each delivery is also logged, in
autocommit after the transaction, to the table ``delivery``. SIGTERM ends the process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any, Callable

from outbox_lite import Inbox, LockConflictError
from outbox_lite._families.url import DatabaseUrl

#: BullMQ's stalled-job checker, made quick: a job whose lock (held for lockDuration, renewed
#: every lockRenewTime by a live worker) is gone at the second of two checks stalledInterval
#: apart goes back to wait; maxStalledCount stalls later it would fail instead.
BULLMQ_OPTIONS = {"lockDuration": 1000, "lockRenewTime": 250, "stalledInterval": 500,
                  "maxStalledCount": 10, "drainDelay": 1, "concurrency": 1}


def handler() -> Callable[[str, Any], None]:
    """``handle(message_id, payload)``: the consumer's transaction, then the delivery log
    and, at the Nth commit, the hang."""
    database = DatabaseUrl.parse(os.environ["OUTBOX_TEST_DATABASE_URL"]).database()
    inbox = Inbox(database, os.environ.get("OUTBOX_TEST_CONSUMER", "billing"))
    hang_after = int(os.environ.get("OUTBOX_TEST_HANG_AFTER", "0"))
    marker = Path(os.environ.get("OUTBOX_TEST_MARKER", os.devnull))
    commits = 0

    def handle(message_id: str, payload: Any) -> None:
        nonlocal commits
        while True:
            try:
                with database.atomic():
                    accepted = inbox.accept(message_id)
                    if accepted:  # the business row: nothing else stops a second one
                        database.execute_sql(
                            "INSERT INTO effect (message_id, n, pid) VALUES (%s, %s, %s)",
                            (message_id, payload["n"], os.getpid()))
                break
            except LockConflictError:
                continue  # the server rolled the transaction back: do it again
        database.execute_sql("INSERT INTO delivery (message_id, accepted, pid) VALUES"
                             " (%s, %s, %s)", (message_id, accepted, os.getpid()))
        commits += 1
        if commits == hang_after:
            marker.write_text(message_id)
            while True:  # committed, neither completed nor acked: wait for the SIGKILL
                signal.pause()

    return handle


async def bullmq_main() -> None:
    from bullmq import Worker

    handle = handler()

    async def process(job: Any, token: str) -> None:
        handle(job.id, job.data)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    worker = Worker(os.environ["OUTBOX_TEST_QUEUE"], process,
                    {"connection": os.environ["OUTBOX_TEST_REDIS_URL"], **BULLMQ_OPTIONS})
    await stop.wait()
    await worker.close()


def rabbitmq_main() -> None:
    import pika

    handle = handler()
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    url = os.environ["OUTBOX_TEST_RABBITMQ_URL"]
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1)
    for method, properties, body in channel.consume(os.environ["OUTBOX_TEST_AMQP_QUEUE"],
                                                    inactivity_timeout=0.1):
        if method is None:
            if stopping:
                break
            continue
        handle(properties.message_id, json.loads(body))
        channel.basic_ack(method.delivery_tag)  # only once the transaction has committed
    channel.cancel()
    connection.close()


if __name__ == "__main__":
    if os.environ["OUTBOX_TEST_BROKER"] == "rabbitmq":
        rabbitmq_main()
    else:
        asyncio.run(bullmq_main())
