"""The Celery app of the Celery tests' worker (``celery -A _celery_app worker``, started by the
test with this folder on PYTHONPATH), written as a service would write its tasks. Settings
come from ``OUTBOX_TEST_*`` variables.

* ``outbox_test.record(payload)``: notes what it was given (its task id, its one argument,
  the message's headers as the task's request shows them) as a line of JSON in
  ``OUTBOX_TEST_RUNS``;
* ``outbox_test.once(payload)``: the task that must run once per event: in one transaction
  it accepts its task id in the inbox (consumer ``celery-consumer``) and, when accepted,
  writes its business row to ``effect``; then it notes the run (accepted or not) in
  ``OUTBOX_TEST_RUNS``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

from outbox_lite import Inbox, LockConflictError
from outbox_lite._families.url import DatabaseUrl

HEADERS = ("outbox-event-id", "outbox-event-type", "outbox-aggregate-type",
           "outbox-aggregate-id", "traceparent", "tracestate", "tenant")

app = Celery("outbox_test", broker=os.environ["OUTBOX_TEST_CELERY_URL"])
app.conf.update(task_default_queue=os.environ["OUTBOX_TEST_CELERY_QUEUE"],
                worker_prefetch_multiplier=1, worker_enable_remote_control=False,
                broker_connection_retry_on_startup=True, task_acks_late=True,
                accept_content=["json"])
_database: list[Any] = []


def _note(line: dict[str, Any]) -> None:
    with open(os.environ["OUTBOX_TEST_RUNS"], "a", encoding="utf-8") as runs:
        runs.write(json.dumps(line) + "\n")  # one write of one line: appended whole


@app.task(bind=True, name="outbox_test.record")
def record(self: Any, *args: Any, **kwargs: Any) -> None:
    _note({"task_id": self.request.id, "args": list(args), "kwargs": kwargs,
           "headers": {name: self.request.get(name) for name in HEADERS}})


@app.task(bind=True, name="outbox_test.once")
def once(self: Any, payload: Any) -> None:
    if not _database:
        _database.append(DatabaseUrl.parse(os.environ["OUTBOX_TEST_DATABASE_URL"]).database())
    database = _database[0]
    inbox = Inbox(database, "celery-consumer")
    while True:
        try:
            with database.atomic():
                accepted = inbox.accept(self.request.id)
                if accepted:  # the business row: nothing else stops a second one
                    database.execute_sql("INSERT INTO effect (task_id, n) VALUES (%s, %s)",
                                         (self.request.id, payload["n"]))
            break
        except LockConflictError:
            continue  # the server rolled the transaction back: do it again
    _note({"task_id": self.request.id, "accepted": bool(accepted)})
