"""The relay under faults at the worst moments (issue 21): a COMMIT or an autocommit UPDATE
whose answer is lost after the server finished it (tests/_proxy.py), an operator's row lock on
one event of the batch, relays that are never closed on a pool.

What must hold: nothing stays ``processing`` after the relay finished, every event reaches the
broker (a real RabbitMQ queue) once, the relay's ``published`` figure is the truth, and no
warning says claims were taken over when none were."""

from __future__ import annotations

import logging
import threading
import time

import peewee as pw
import pytest
from playhouse.shortcuts import ReconnectMixin

from outbox_lite import InvalidEventError, OutboxRepository
from outbox_lite.publishers.rabbitmq import RabbitMQPublisher
from outbox_lite.relay import Relay

from _helpers import FAMILY, capture_sql, seed

TAKEN_OVER = "were taken over"


class ReconnectingDatabase(ReconnectMixin, FAMILY.database_class()):  # type: ignore[misc]
    """Peewee's ReconnectMixin: a statement outside a transaction that meets a lost
    connection is run again on a new one (so an UPDATE whose answer was lost runs twice)."""


KINDS = ["plain", "pooled", "reconnect", "manual"]


def _database(url, kind, **options):
    """A database of ``kind`` for ``url`` (``manual``: autoconnect=False, connected)."""
    if kind == "pooled":
        return url.database(FAMILY.pooled_class(), max_connections=8, **options)
    if kind == "reconnect":
        return url.database(ReconnectingDatabase, **options)
    if kind == "manual":
        database = url.database(autoconnect=False, **options)
        database.connect()
        return database
    return url.database(**options)


@pytest.fixture
def relay_db(request, db_url, proxy):
    """The relay's database of the test's ``kind``, reached through ``proxy``."""
    database = _database(db_url, request.param, host="127.0.0.1", port=proxy.port,
                         **FAMILY.PLAIN_TEXT)  # the proxy reads the client's packets
    yield database
    if not database.is_closed():
        database.close()
    if hasattr(database, "close_all"):
        database.close_all()


def _states(fetch):
    return {row["status"]: row["n"] for row in fetch(
        "SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status")}


def _run_until_empty(relay, bound):
    """relay.run(until_empty=True), stopped after ``bound`` s if it has not ended; returns
    the seconds it ran."""
    stop = threading.Event()
    timer = threading.Timer(bound, stop.set)
    timer.start()
    started = time.monotonic()
    try:
        relay.run(stop, until_empty=True)
    finally:
        timer.cancel()
    return time.monotonic() - started


# ---------------------------------------------------------------------------
# held_by: what a worker holds, as the database says
# ---------------------------------------------------------------------------

def test_held_by_reads_the_claims_a_worker_holds_and_nothing_else(db, repo, fetch):
    ids = seed(repo, 6)
    with db.atomic():
        mine = [e.id for e in repo.claim_batch("me", limit=3)]
    with db.atomic():
        theirs = [e.id for e in repo.claim_batch("me-too", limit=2)]
    assert repo.mark_published(mine[0], "me")
    held = repo.held_by("me")
    assert [e.id for e in held] == mine[1:]
    assert all(e.status == "processing" and e.locked_by == "me" and e.attempt_count == 1
               for e in held)
    assert held[0].payload == {"n": ids.index(mine[1])}
    assert [e.id for e in repo.held_by("me", [mine[0], mine[2], *theirs, ids[-1]])] == [
        mine[2]]
    assert repo.held_by("ME") == [] and repo.held_by("me", []) == []  # exact, binary
    assert [e.id for e in repo.held_by("me-too")] == theirs


@pytest.mark.parametrize("args", [("",), (None,), ("me", "1,2"), ("me", [0]), ("me", [-1])])
def test_held_by_refuses_bad_input_before_any_sql(repo, args):
    with capture_sql(repo.database) as statements:
        with pytest.raises((InvalidEventError, TypeError)):
            repo.held_by(*args)
    assert statements == []


# ---------------------------------------------------------------------------
# Item 3: a COMMIT (or an autocommit UPDATE) whose outcome is unknown
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("relay_db", KINDS, indirect=True)
@pytest.mark.parametrize("commits_before", [1, 4])
def test_a_claim_commit_whose_answer_was_lost_is_found_out_and_published_at_once(
        relay_db, db, proxy, fetch, exchange, caplog, commits_before):
    # 200 events in batches of 50: the second round's transaction records batch 1 and claims
    # batch 2, the fifth records batch 4 and claims nothing. Its COMMIT is done by the
    # server, its answer lost. Before: batch 2 sat processing until the lock timeout (60 s
    # here), and the batch recorded was counted lost with a false "taken over" warning.
    seed(OutboxRepository(db), 200)
    repo = OutboxRepository(relay_db)
    publisher = RabbitMQPublisher(exchange.url, exchange.name)
    relay = Relay(repo, publisher, batch_size=50, lock_timeout=60, progress_every=0,
                  reconnect_pause=0.05)
    proxy.drop_after(lambda sql: sql == "COMMIT", skip=commits_before)
    caplog.set_level(logging.INFO, logger="outbox_lite")
    try:
        took = _run_until_empty(relay, bound=8)
    finally:
        publisher.close()
    assert proxy.dropped == ["COMMIT"]
    assert _states(fetch) == {"published": 200}, f"after {took:.1f} s"
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE attempt_count <> 1") == [
        {"n": 0}]  # nothing claimed twice
    assert exchange.depth() == 200  # each event reached the broker once
    assert (relay.stats.published, relay.stats.lost) == (200, 0)
    assert relay.stats.reconnects >= 1
    assert TAKEN_OVER not in caplog.text
    assert ("publishing its 50 events" in caplog.text) == (commits_before == 1)
    assert took < 6


@pytest.mark.parametrize("relay_db", KINDS, indirect=True)
def test_an_outcome_update_whose_answer_was_lost_is_read_back_not_counted_lost(
        relay_db, db, proxy, fetch, exchange, caplog):
    # run_once records its batch in autocommit: the UPDATE that marks it published is done
    # by the server, its answer lost (ReconnectMixin even runs it again, matching nothing).
    seed(OutboxRepository(db), 50)
    repo = OutboxRepository(relay_db)
    publisher = RabbitMQPublisher(exchange.url, exchange.name)
    relay = Relay(repo, publisher, batch_size=50, lock_timeout=60, progress_every=0,
                  reconnect_pause=0.05)
    proxy.drop_after(lambda sql: sql.startswith("UPDATE") and "'published'" in sql)
    caplog.set_level(logging.INFO, logger="outbox_lite")
    try:
        result = relay.run_once()
    finally:
        relay.close()
        publisher.close()
    assert len(proxy.dropped) == 1
    assert _states(fetch) == {"published": 50}
    assert exchange.depth() == 50
    assert (result.published, result.lost) == (50, 0)
    assert (relay.stats.published, relay.stats.lost) == (50, 0)
    assert TAKEN_OVER not in caplog.text


# ---------------------------------------------------------------------------
# Item 7: someone else's lock on a row of the batch
# ---------------------------------------------------------------------------

class _LocksOneRowThenStops:
    """Publishes nothing anywhere; during the publish, an operator's transaction takes
    ``SELECT ... FOR UPDATE`` on one event of the batch and keeps it, and the stop comes."""

    def __init__(self, operator, stop):
        self.operator, self.stop = operator, stop

    def publish(self, events):
        cur = self.operator.cursor()  # the driver's own connection, in autocommit
        cur.execute("BEGIN")
        cur.execute("SELECT id FROM outbox_event WHERE id = %s FOR UPDATE", (events[0].id,))
        cur.close()
        self.stop.set()
        return {}

    def close(self):
        pass


def test_a_stop_gives_up_on_someone_elses_lock_at_the_claims_expiry(db, db_url, fetch,
                                                                     caplog):
    seed(OutboxRepository(db), 10)
    # The server makes a statement wait 1 s for a lock (FAMILY.session_options): then the
    # lock-wait error, which the relay retried at once, for ever (until the lock went).
    relay_db = db_url.database(**FAMILY.session_options(None, wait=1))
    operator_db = db_url.database()
    operator = operator_db.connection()  # closed by the releaser's thread: the driver's own
    stop = threading.Event()
    relay = Relay(OutboxRepository(relay_db), _LocksOneRowThenStops(operator, stop),
                  batch_size=10, lock_timeout=3, progress_every=0, reconnect_pause=0.05,
                  max_reconnect_pause=0.5)
    releaser = threading.Timer(15, operator.close)  # the operator's lock ends after 15 s
    releaser.start()
    caplog.set_level(logging.INFO, logger="outbox_lite")
    started = time.monotonic()
    try:
        relay.run(stop)
        took = time.monotonic() - started
    finally:
        releaser.cancel()
        try:
            operator.close()
        except Exception:  # noqa: BLE001 - the releaser closed it already
            pass
        relay_db.close()
    assert took < 3 + 2, f"run() returned {took:.1f} s after the stop"
    assert relay.stats.lock_conflicts >= 2
    assert "gave up recording 10 outcomes after a lock conflict" in caplog.text
    assert TAKEN_OVER not in caplog.text  # they were not: they expire now
    # The claims stay with the relay until they expire: another relay publishes them then.
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'processing'"
                 " AND locked_by = %s", relay.worker_id) == [{"n": 10}]


# ---------------------------------------------------------------------------
# Item 9: relays that are never closed, on a pool
# ---------------------------------------------------------------------------

class _Slow:
    """Publishes nothing anywhere, and returns only once the heartbeat has renewed the claims
    (``renewed()``; at most 10 s), however loaded the machine: the renewal's connection is
    what the test is about."""

    def __init__(self, renewed):
        self.renewed = renewed

    def publish(self, events):
        deadline = time.monotonic() + 10
        while not self.renewed() and time.monotonic() < deadline:
            time.sleep(0.01)
        return {}

    def close(self):
        pass


def test_relays_never_closed_return_their_pooled_connections(db, db_url, fetch, caplog):
    seed(OutboxRepository(db), 12)
    pool = db_url.database(FAMILY.pooled_class(), max_connections=3)
    repo = OutboxRepository(pool)
    caplog.set_level(logging.INFO, logger="outbox_lite")
    relays = []
    try:
        for n in range(6):  # twice the pool's size, one after another, none closed
            relay = Relay(repo, _Slow(lambda: relay.stats.renewals >= 1), batch_size=2,
                          lock_timeout=0.3, heartbeat=0.05, progress_every=0)
            relay.run_once()
            relays.append(relay)
            assert relay.stats.renewals >= 1
        deadline = time.monotonic() + 5
        while len(pool._in_use) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # a last renewal may still be handing its connection back
        in_use = len(pool._in_use)
    finally:
        for relay in relays:
            relay.close()
        pool.close_all()
    assert "renewing" not in caplog.text  # no renewal failed (MaxConnectionsExceeded)
    assert in_use <= 1  # the calling thread's own
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'published'") == [
        {"n": 12}]
