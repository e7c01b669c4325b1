"""How the inbox locks, on the real server: accepts of different ids never wait on each other,
and racing deliveries of one id end with exactly one record and one effect.

A wait is made visible by the session's lock wait limit of 1 s: each probe runs in a
transaction of its own while the contending transaction stays open for as long as the probe
takes, so a probe that waits at all fails with the lock-wait error (LockConflictError: MySQL
1205, PostgreSQL 55P03). The probes are the ids that sort right before and right after the
contended one, inside the gap its neighbours bound (committed records ``m2`` and ``m8`` around
``m5``) and past the last record. PostgreSQL has no gap locks (FAMILY.GAP_LOCKS).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest

from outbox_lite import Inbox, LockConflictError

from _helpers import FAMILY, run_threads
from _sessions import ThreadSession

ISOLATION_LEVELS = ["REPEATABLE READ", "READ COMMITTED", "SERIALIZABLE"]
NEIGHBOURS = ["m4", "m6", "m3", "m7"]  # m5 contended; m2 and m8 committed around it


class Session(ThreadSession):
    """A thread session that accepts messages for ``consumer``."""

    def __init__(self, db_url: Any, consumer: str = "c") -> None:
        super().__init__(db_url)
        self.inbox = Inbox(self.db, consumer)

    def accept(self, message_id: str) -> bool:
        return self.run(self.inbox.accept, message_id)


@pytest.fixture
def sessions(db_url):
    made: list[Session] = []

    def make(consumer: str = "c") -> Session:
        made.append(Session(db_url, consumer))
        return made[-1]

    yield make
    errors = []
    for session in made:
        try:
            session.close()
        except Exception as exc:  # noqa: BLE001 - every session is closed, then we fail
            errors.append(exc)
    assert errors == []


def probe(sessions: Callable[..., Session], ids: list[str], isolation: str) -> dict[str, Any]:
    """Accept each id in a new transaction (rolled back); what each got: True, False, or
    the errno of a LockConflictError."""
    answers: dict[str, Any] = {}
    for message_id in ids:
        session = sessions()
        session.begin(isolation)
        try:
            answers[message_id] = session.accept(message_id)
        except LockConflictError as exc:
            answers[message_id] = exc.errno
        finally:
            session.rollback()
    return answers


@pytest.fixture
def bounded(fetch):
    """Committed records on either side of the contended id's gap."""
    fetch(f"INSERT INTO inbox_message VALUES ('c', 'm2', {FAMILY.UTC_NOW}),"
          f" ('c', 'm8', {FAMILY.UTC_NOW})")


@pytest.mark.parametrize("isolation", ISOLATION_LEVELS)
def test_an_open_accept_makes_no_other_id_wait(sessions, bounded, isolation):
    a = sessions()
    a.begin(isolation)
    assert a.accept("m5") is True
    ids = [*NEIGHBOURS, "m1", "m9", "n0"]
    assert probe(sessions, ids, isolation) == {i: True for i in ids}
    assert probe(sessions, ["m5"], isolation) == {"m5": FAMILY.LOCK_WAIT}  # it sees a wait
    a.commit()
    assert probe(sessions, ["m5"], isolation) == {"m5": False}


@pytest.mark.parametrize("isolation", ISOLATION_LEVELS)
def test_the_last_id_open_makes_no_later_id_wait(sessions, isolation):
    """In an empty table the gap after the record runs to the end of the index."""
    a = sessions()
    a.begin(isolation)
    assert a.accept("m5") is True
    assert probe(sessions, ["m4", "m6", "z"], isolation) == {"m4": True, "m6": True, "z": True}
    a.rollback()


@pytest.mark.parametrize("isolation", ISOLATION_LEVELS)
def test_a_redelivery_answered_false_in_an_open_transaction_makes_nobody_wait(
        sessions, bounded, fetch, isolation):
    fetch(f"INSERT INTO inbox_message VALUES ('c', 'm5', {FAMILY.UTC_NOW})")
    b = sessions()
    b.begin(isolation)
    assert b.accept("m5") is False
    assert b.run(b.db.execute_sql, "SELECT 1").fetchone() == (1,)  # still usable
    ids = [*NEIGHBOURS, "m1", "m9"]
    assert probe(sessions, ids, isolation) == {i: True for i in ids}
    # Other redeliveries of the same id share its lock: False at once, no wait either.
    assert [probe(sessions, ["m5"], isolation) for _ in range(2)] == [{"m5": False}] * 2
    b.commit()


def _twin_waiting_for_m5(sessions, fetch, isolation):
    """Session a has accepted m5 and not committed; b's accept of m5 waits for it."""
    a, b = sessions(), sessions()
    b.run(FAMILY.limit_lock_waits, b.db, 30)
    a.begin(isolation)
    assert a.accept("m5") is True
    b.begin(isolation)
    twin = b.start(b.inbox.accept, "m5")
    _until_waiting(fetch, b)
    return a, b, twin


@pytest.mark.parametrize("isolation", ISOLATION_LEVELS)
def test_a_twin_waiting_for_the_first_delivery_gets_false_once_it_commits(
        sessions, bounded, fetch, isolation):
    """On PostgreSQL above READ COMMITTED the twin's snapshot cannot see the record it waited
    for: the server answers a serialization failure (40001), a LockConflictError to retry,
    and the retry's new snapshot sees it (False)."""
    a, b, twin = _twin_waiting_for_m5(sessions, fetch, isolation)
    assert probe(sessions, NEIGHBOURS, isolation) == {i: True for i in NEIGHBOURS}
    a.commit()
    if FAMILY.name == "postgresql" and isolation != "READ COMMITTED":
        with pytest.raises(LockConflictError) as info:
            twin.result(timeout=30)
        assert info.value.errno == "40001"
        b.rollback()
        b.begin(isolation)
        assert b.run(b.inbox.accept, "m5") is False
    else:
        assert twin.result(timeout=30) is False
    assert probe(sessions, NEIGHBOURS, isolation) == {i: True for i in NEIGHBOURS}
    b.commit()
    assert fetch("SELECT message_id FROM inbox_message ORDER BY message_id") == [
        {"message_id": m} for m in ("m2", "m5", "m8")]


@pytest.mark.parametrize("isolation", ISOLATION_LEVELS)
def test_a_twin_waiting_for_a_first_delivery_that_rolls_back_gets_true_and_its_gap(
        sessions, bounded, fetch, isolation):
    """What InnoDB does, on both servers, at every isolation level: when the first delivery
    rolls back, its record is removed and the waiting twin's lock is handed on to the gap
    (lock inheritance), so until the twin's transaction ends, inserts into that gap wait.
    This is the one case in which accepts of different ids wait on each other (README).
    PostgreSQL has no gap locks: nobody waits."""
    a, b, twin = _twin_waiting_for_m5(sessions, fetch, isolation)
    a.rollback()
    assert twin.result(timeout=30) is True
    gap = FAMILY.LOCK_WAIT if FAMILY.GAP_LOCKS else True  # the gap from m2 to m8
    assert probe(sessions, ["m4", "m6", "m1", "m9"], isolation) == {
        "m4": gap, "m6": gap, "m1": True, "m9": True}
    b.commit()
    assert probe(sessions, NEIGHBOURS, isolation) == {i: True for i in NEIGHBOURS}


def _until_waiting(fetch, session: Session) -> None:
    """Until ``session``'s transaction waits for a row lock (FAMILY.waits_for_lock): a twin
    that has not reached its wait proves nothing. InnoDB refreshes its view of waits only when
    it was not read for 0.1 s, hence the pause."""
    deadline = time.monotonic() + 10
    while not FAMILY.waits_for_lock(fetch, session.connection_id):
        assert time.monotonic() < deadline, "the twin never waited"
        time.sleep(0.15)


# ---------------------------------------------------------------------------
# Racing deliveries of one id: exactly one effect
# ---------------------------------------------------------------------------

EFFECT = (f"CREATE TABLE effect ({FAMILY.SERIAL_ID},"
          " message_id VARCHAR(64) NOT NULL, worker INT NOT NULL)")


def _deliver(db, inbox, message_id: str, worker: int, fail: Callable[[], bool]) -> list[str]:
    """A consumer's delivery, retried after a lock conflict as a consumer must; the outcome
    of each attempt: 'handled', 'duplicate', 'rolled back' or 'conflict'."""
    outcomes: list[str] = []
    while True:
        try:
            with db.atomic():
                if not inbox.accept(message_id):
                    outcomes.append("duplicate")
                    return outcomes
                db.execute_sql("INSERT INTO effect (message_id, worker) VALUES (%s, %s)",
                               (message_id, worker))
                if fail():
                    time.sleep(0.02)  # let the twins queue up behind this record first
                    raise _Failed
            outcomes.append("handled")
            return outcomes
        except _Failed:
            outcomes.append("rolled back")
            return outcomes
        except LockConflictError:
            outcomes.append("conflict")


class _Failed(Exception):
    pass


@pytest.mark.parametrize("first_fails", [False, True], ids=["commit", "rollback"])
def test_racing_deliveries_of_one_id_have_exactly_one_effect(db, fetch, first_fails):
    db.execute_sql(EFFECT)
    inbox = Inbox(db, "c")
    threads, rounds = 8, 12
    lock = threading.Lock()
    for n in range(rounds):
        message_id = f"race-{n}"
        failed: list[int] = []

        def fail() -> bool:
            with lock:  # the first delivery to get True rolls back, when asked to
                if first_fails and not failed:
                    failed.append(1)
                    return True
                return False

        results, errors = run_threads(
            threads, lambda i: _deliver(db, inbox, message_id, i, fail), db)
        assert errors == []
        finals = sorted(r[-1] for r in results)
        expected = ["duplicate"] * (threads - 1) + ["handled"]
        if first_fails:
            expected = ["duplicate"] * (threads - 2) + ["handled", "rolled back"]
        assert finals == sorted(expected), (n, results)
    effects = fetch("SELECT message_id, COUNT(*) AS n FROM effect GROUP BY message_id")
    assert sorted((r["message_id"], r["n"]) for r in effects) == sorted(
        (f"race-{n}", 1) for n in range(rounds))
    assert fetch("SELECT COUNT(*) AS n FROM inbox_message") == [{"n": rounds}]


def test_accepts_of_distinct_ids_from_many_threads_all_succeed_without_conflict(db, fetch):
    db.execute_sql(EFFECT)
    inbox = Inbox(db, "c")

    def work(i: int) -> list[str]:
        FAMILY.limit_lock_waits(db, 1)
        return [_deliver(db, inbox, f"t{i}-{k:03d}", i, lambda: False)[-1] for k in range(40)]

    results, errors = run_threads(8, work, db)
    assert errors == []
    assert all(outcome == "handled" for r in results for outcome in r)
    assert fetch("SELECT COUNT(*) AS n FROM effect") == [{"n": 320}]
    assert fetch("SELECT COUNT(*) AS n FROM inbox_message") == [{"n": 320}]
