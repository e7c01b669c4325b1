"""One relay process for many databases (issue 33, SPEC §13): :class:`RelayGroup` runs a relay
per database, each on a thread of its own. What must hold: a large backlog in one database
does not hold back another's events; a database that cannot be reached is reported while the
others go on; every event is published once."""

from __future__ import annotations

import logging
import statistics
import threading
import time

import pytest

from outbox_lite import InvalidEventError, OutboxRepository
from outbox_lite.relay import Relay, RelayGroup, database_name

from _helpers import FAMILY, migrated_database, seed
from _redis import free_port

#: The bound on the small database's publish lag (p50) while the other drains a backlog.
LAG_P50_BOUND = 0.5


class Broker:
    """Records when it was handed each event; ``pause`` seconds per batch (a slow broker)."""

    def __init__(self, pause: float = 0.0) -> None:
        self.at: dict[int, float] = {}
        self.handed = 0
        self.pause = pause

    def publish(self, events):
        time.sleep(self.pause)
        self.handed += len(events)
        now = time.monotonic()
        self.at.update((e.id, now) for e in events)
        return {}

    def close(self):
        pass


@pytest.fixture
def second_db(db_url):
    """A second migrated database on the test server, dropped after the test."""
    with migrated_database(db_url.with_name(f"{db_url.name}_second")) as database:
        yield database


def _relay(repo, broker, **options):
    options.setdefault("progress_every", 0)
    return Relay(repo, broker, **options)


def _until(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _pending(fetch_db):
    return fetch_db.execute_sql(
        "SELECT COUNT(*) FROM outbox_event WHERE status <> 'published'").fetchone()[0]


def test_a_backlog_in_one_database_does_not_hold_back_another(db, repo, second_db, fetch):
    backlog = seed(repo, 3000)
    big, small = Broker(pause=0.02), Broker()
    small_repo = OutboxRepository(second_db)
    group = RelayGroup({"big": _relay(repo, big, batch_size=10),
                        "small": _relay(small_repo, small)})
    stop = threading.Event()
    runner = threading.Thread(target=group.run, args=(stop,))
    runner.start()
    written: dict[int, float] = {}
    try:
        _until(lambda: big.handed > 0)
        for n in range(20):
            with second_db.atomic():
                event = small_repo.create_in_transaction(
                    event_type="order.placed", aggregate_type="order", aggregate_id=str(n),
                    payload={"n": n})
            written[event.id] = time.monotonic()
            time.sleep(0.03)
        _until(lambda: written.keys() <= small.at.keys())
        left_in_big = 3000 - big.handed
    finally:
        stop.set()
        runner.join(60)
    assert not runner.is_alive() and group.errors == {}
    lags = [small.at[event_id] - at for event_id, at in written.items()]
    assert left_in_big > 0  # the backlog was still draining the whole time
    assert statistics.median(lags) < LAG_P50_BOUND, sorted(lags)
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'published'") == [
        {"n": len(big.at)}]
    assert len(big.at) == big.handed <= len(backlog)  # none handed twice
    assert second_db.execute_sql("SELECT COUNT(*) FROM outbox_event WHERE status ="
                                 " 'published'").fetchone()[0] == 20


def test_an_unreachable_database_is_reported_and_the_others_go_on(db, repo, db_url, caplog):
    ids = seed(repo, 10)
    gone = db_url.database(host="127.0.0.1", port=free_port(), **FAMILY.PLAIN_TEXT)
    broker = Broker()
    unreachable = _relay(OutboxRepository(gone), Broker(), reconnect_pause=0.05,
                         max_reconnect_pause=0.1)
    group = RelayGroup([_relay(repo, broker), unreachable])
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="outbox_lite"):
        runner = threading.Thread(target=group.run, args=(stop,))
        runner.start()
        try:
            _until(lambda: set(ids) <= broker.at.keys())
            _until(lambda: unreachable.stats.reconnects >= 2)
        finally:
            stop.set()
            runner.join(60)
    assert not runner.is_alive()
    assert group.errors == {}  # waiting for its server, not dead
    assert _pending(db) == 0
    assert any(unreachable.worker_id in r.getMessage() and "database connection" in
               r.getMessage() for r in caplog.records)
    assert not any("password" in r.getMessage() for r in caplog.records)


def test_run_once_runs_each_round_and_keeps_a_failing_ones_error(db, repo, db_url):
    seed(repo, 3)
    gone = db_url.database(host="127.0.0.1", port=free_port(), **FAMILY.PLAIN_TEXT)
    broker = Broker()
    group = RelayGroup({"here": _relay(repo, broker),
                        "gone": _relay(OutboxRepository(gone), Broker())})
    results = group.run_once()
    assert list(results) == ["here"] and results["here"].published == 3
    assert list(group.errors) == ["gone"]
    assert _pending(db) == 0


def test_names_default_to_the_database_and_must_be_unique(db, repo, db_url):
    relay = _relay(repo, Broker())
    assert list(RelayGroup([relay]).names) == [
        f"{db_url.host}:{db_url.port}/{db_url.name}"] == [database_name(db)]
    with pytest.raises(InvalidEventError, match="called"):
        RelayGroup([relay, _relay(repo, Broker())])
    with pytest.raises(InvalidEventError, match="twice"):
        RelayGroup({"a": relay, "b": relay})
    with pytest.raises(InvalidEventError, match="at least one"):
        RelayGroup([])
    with pytest.raises(TypeError):
        RelayGroup([object()])


def test_a_relay_added_while_running_drains_and_one_removed_stops(db, repo, second_db):
    first, added = Broker(), Broker()
    seed(repo, 4)
    second_repo = OutboxRepository(second_db)
    group = RelayGroup({"first": _relay(repo, first)})
    stop = group.start()
    try:
        _until(lambda: _pending(db) == 0)
        seed(second_repo, 6)
        relay = _relay(second_repo, added)
        assert group.add(relay, "second") == "second" and group.wait(0)
        _until(lambda: _pending(second_db) == 0)
        assert group.remove("second") is relay and not relay.running
        assert list(group.names) == ["first"]
        later = seed(second_repo, 3)
        marker = seed(repo, 1)
        _until(lambda: set(marker) <= first.at.keys())  # the group relays on
        assert second_db.execute_sql(
            "SELECT COUNT(*) FROM outbox_event WHERE status = 'pending' AND locked_by IS NULL"
            " AND id IN (%s, %s, %s)", later).fetchone()[0] == 3
        with pytest.raises(KeyError):
            group.remove("second")
    finally:
        stop.set()
        assert not group.wait(60)
    assert group.errors == {} and added.handed == 6
