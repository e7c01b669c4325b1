"""A COMMIT the server refuses for a conflict (issue 36, SPEC §5 and §12).

On a cluster a transaction's row locks are its own node's: Galera certifies a write set only at
COMMIT, and a COMMIT that loses certification (to another node's claim, or to a writer's
replicated INSERT that aborts the claim) fails with 1213; Group Replication's with 3101 or 1180;
PostgreSQL's serializable snapshot checks fail a COMMIT with 40001, its deadlock check with
40P01. No cluster is needed to see what the library does with such a COMMIT: the test proxy
(:meth:`_proxy.Proxy.refuse`) sends the client's ``COMMIT`` to the server as ``ROLLBACK`` and
answers with the refusal's own error message (MySQL's ERR packet with the number and SQLSTATE
the cluster sends; PostgreSQL's ErrorResponse and an idle ReadyForQuery). The server is left as
a refused COMMIT leaves it (the whole transaction rolled back) and the driver raises what it
raises for the real refusal, from ``commit()``; the refusals are faithful to the byte.

What must hold: the relay lives on (a refused COMMIT is a lock conflict, counted as
``outbox_relay_conflicts_total``), publishes every event once, records every outcome once
(outcomes carried in a refused transaction are recorded again, not left to expire), warns of
nothing lost; a service's own refused COMMIT is ``is_retryable`` and the documented retry loop
writes once.
"""

from __future__ import annotations

import logging

import peewee as pw
import pytest
from prometheus_client import CollectorRegistry

from outbox_lite import (
    DuplicateEventError,
    LockConflictError,
    OutboxRepository,
    is_retryable,
)
from outbox_lite.metrics import RelayMetrics
from outbox_lite.relay import Relay

from _helpers import FAMILY, seed
from test_connections import readme_block

#: What each family's servers send for a COMMIT they refuse: (code, SQLSTATE, message).
REFUSALS = {
    "mysql": [
        (1213, "40001", "Deadlock found when trying to get lock; try restarting transaction"),
        (1205, "HY000", "Lock wait timeout exceeded; try restarting transaction"),
        (3101, "HY000", "Plugin instructed the server to rollback the current transaction."),
        (1180, "HY000", "Got error 149 - 'Lock deadlock; Retry transaction' during COMMIT"),
    ],
    "postgresql": [
        ("40001", "40001",
         "could not serialize access due to read/write dependencies among transactions"),
        ("40P01", "40P01", "deadlock detected"),
    ],
}
ERRORS = REFUSALS[FAMILY.name]


def _ids(errors):
    return [str(code) for code, _, _ in errors]


class Permanent(Exception):
    retryable = False


class Broker:
    """Keeps every event it was given; fails ``dead`` with a non-retryable error."""

    def __init__(self, dead: int) -> None:
        self.published: list[int] = []
        self.dead = dead

    def publish(self, events):
        self.published += [e.id for e in events]
        return {e.id: Permanent("refused by the broker") for e in events if e.id == self.dead}

    def close(self):
        pass


@pytest.mark.parametrize("error", ERRORS, ids=_ids(ERRORS))
def test_the_relay_outlives_refused_commits_and_records_every_outcome_once(
        proxied, proxy, repo, fetch, caplog, error):
    ids = seed(repo, 30)
    broker = Broker(dead=ids[0])
    registry = CollectorRegistry()
    relay = Relay(OutboxRepository(proxied), broker, batch_size=10, lock_timeout=60,
                  progress_every=0, metrics=RelayMetrics(registry))
    # COMMIT 0: the first claim, refused; 1: claimed again; 2 and 3: the transaction that
    # records the first batch's outcomes (one published, one dead letter) and claims the
    # second batch, refused twice.
    proxy.refuse(error, commits=(0, 2, 3))
    with caplog.at_level(logging.WARNING, logger="outbox_lite"):
        relay.run(until_empty=True)
    assert proxy.refused == [_sent(error)] * 3
    assert sorted(broker.published) == ids  # each event handed to the broker once
    rows = fetch("SELECT status, attempt_count, locked_by, locked_at, last_error_code"
                 " FROM outbox_event ORDER BY id")
    assert [tuple(r.values()) for r in rows] == (  # refused claims counted no attempt
        [("failed", 1, None, None, "Permanent")] + [("published", 1, None, None, None)] * 29)
    s = relay.stats
    assert (s.published, s.dead, s.lost, s.lock_conflicts) == (29, 1, 0, 3)
    assert registry.get_sample_value("outbox_relay_conflicts_total") == 3
    assert registry.get_sample_value("outbox_relay_events_total", {"outcome": "lost"}) == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    with caplog.at_level(logging.INFO, logger="outbox_lite.relay"):
        relay.log_progress()
    assert "(0 expired, 3 lock conflicts, 0 deleted by retention;" in caplog.records[-1].getMessage()


def _sent(error):
    """``error`` as the proxy keeps it."""
    code, state, message = error
    return (str(code), state, message)


@pytest.mark.parametrize("error", ERRORS, ids=_ids(ERRORS))
def test_a_services_refused_commit_is_retryable_and_writes_nothing(proxied, proxy, fetch,
                                                                   error):
    outbox = OutboxRepository(proxied)
    proxy.refuse(error)
    with pytest.raises(pw.DatabaseError) as refused:
        with proxied.atomic():
            outbox.create_in_transaction(event_type="order.placed", aggregate_type="order",
                                         aggregate_id="7", payload={"order_id": 7},
                                         dedupe_key="order.placed:7")
    assert not isinstance(refused.value, LockConflictError)  # Peewee's, from its COMMIT
    assert is_retryable(refused.value)
    assert FAMILY.error_code(refused.value) == error[0]
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]
    assert proxy.refused == [_sent(error)]


@pytest.mark.parametrize("error", ERRORS, ids=_ids(ERRORS))
def test_the_documented_retry_loop_writes_once_after_refused_commits(proxied, proxy, db,
                                                                     fetch, error):
    page = "docs/guides/producing.md"
    namespace: dict = {}
    exec(compile(readme_block(page, "def place_order_retrying("), page, "exec"), namespace)
    proxy.refuse(error, commits=(0, 1))
    namespace["place_order_retrying"](proxied, OutboxRepository(proxied), 42)
    assert len(proxy.refused) == 2
    assert fetch("SELECT name FROM job") == [{"name": "order-42"}]
    assert fetch("SELECT aggregate_id, dedupe_key FROM outbox_event") == [
        {"aggregate_id": "42", "dedupe_key": "order.placed:42"}]


def test_is_retryable_is_false_for_what_a_retry_does_not_mend(db, repo):
    seed(repo, 1, dedupe_key="k")
    with pytest.raises(DuplicateEventError) as duplicate:
        seed(repo, 1, dedupe_key="k")
    with pytest.raises(pw.DatabaseError) as bad_sql:
        db.execute_sql("SELECT no_such_column FROM outbox_event")
    db.execute_sql("INSERT INTO job (id, name) VALUES (1, 'a')")
    with pytest.raises(pw.IntegrityError) as integrity:
        with db.atomic():
            db.execute_sql("INSERT INTO job (id, name) VALUES (1, 'b')")
    for exc in (duplicate.value, bad_sql.value, integrity.value, ValueError("1213"),
                OSError(1213, "not a server's")):
        assert not is_retryable(exc), exc
    assert is_retryable(LockConflictError(1213, "Deadlock found"))
