"""A BullMQ consumer process for the inbox's end-to-end test, written as a service would write
it: the bullmq package's own Worker, whose processor opens ``db.atomic()``, calls
``inbox.accept(job.id)`` and writes its business row.

Settings come from ``OUTBOX_TEST_*`` variables. With ``OUTBOX_TEST_HANG_AFTER=N`` the process,
right after its Nth commit, writes the job's id to ``OUTBOX_TEST_MARKER`` and blocks (its event
loop too, so BullMQ's lock on the job is not renewed and the job is never completed) until the
test kills it with SIGKILL: a consumer that died after its commit and before its ack. Each
delivery is also logged, in autocommit after the transaction, to the table ``delivery``.
SIGTERM closes the worker and ends the process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from bullmq import Worker

from outbox_lite import Inbox, LockConflictError
from outbox_lite._db import DatabaseUrl

#: BullMQ's stalled-job checker, made quick: a job whose lock (held for lockDuration, renewed
#: every lockRenewTime by a live worker) is gone at the second of two checks stalledInterval
#: apart goes back to wait; maxStalledCount stalls later it would fail instead.
WORKER_OPTIONS = {"lockDuration": 1000, "lockRenewTime": 250, "stalledInterval": 500,
                  "maxStalledCount": 10, "drainDelay": 1, "concurrency": 1}


async def main() -> None:
    database = DatabaseUrl.parse(os.environ["OUTBOX_TEST_DATABASE_URL"]).database()
    inbox = Inbox(database, os.environ.get("OUTBOX_TEST_CONSUMER", "billing"))
    hang_after = int(os.environ.get("OUTBOX_TEST_HANG_AFTER", "0"))
    marker = Path(os.environ.get("OUTBOX_TEST_MARKER", os.devnull))
    commits = 0

    async def process(job: Any, token: str) -> None:
        nonlocal commits
        while True:
            try:
                with database.atomic():
                    accepted = inbox.accept(job.id)
                    if accepted:  # the business row: nothing else stops a second one
                        database.execute_sql(
                            "INSERT INTO effect (message_id, n, pid) VALUES (%s, %s, %s)",
                            (job.id, job.data["n"], os.getpid()))
                break
            except LockConflictError:
                continue  # the server rolled the transaction back: do it again
        database.execute_sql("INSERT INTO delivery (message_id, accepted, pid) VALUES"
                             " (%s, %s, %s)", (job.id, accepted, os.getpid()))
        commits += 1
        if commits == hang_after:
            marker.write_text(job.id)
            while True:  # committed, not completed: wait here for the SIGKILL
                time.sleep(1)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    worker = Worker(os.environ["OUTBOX_TEST_QUEUE"], process,
                    {"connection": os.environ["OUTBOX_TEST_REDIS_URL"], **WORKER_OPTIONS})
    await stop.wait()
    await worker.close()
    database.close()


if __name__ == "__main__":
    asyncio.run(main())
