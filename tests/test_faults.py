"""Faults on the real server: lock conflicts, killed connections, killed processes."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import threading
import time
from typing import Any

import peewee as pw
import pytest

from outbox_lite import (
    Backoff,
    ConnectionLostError,
    LockConflictError,
    OutboxRepository,
)
from outbox_lite.contention import SuiteClock

import _proc
from _helpers import FAMILY, claim_all, new_event, run_threads, seed
from _sessions import ThreadSession

CONNECTION_ERRORS = (ConnectionLostError, pw.OperationalError, pw.InterfaceError)


def _connection_id(database) -> int:
    return FAMILY.session_id(database)


def _deadlocks_above(fetch, before: int) -> bool:
    """Whether the server counted a deadlock since ``before`` (polled for FAMILY.COUNTERS_LAG:
    PostgreSQL's backends report theirs when they flush their statistics)."""
    deadline = time.monotonic() + FAMILY.COUNTERS_LAG
    while FAMILY.deadlocks(fetch) <= before:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _forget_dead_connection(database) -> None:
    """What a worker does after a connection error: drop it; Peewee reconnects on next use."""
    if not database.in_transaction():
        try:
            database.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may complain
            pass


def worker_loop(repo: OutboxRepository, name: str, *, lock_timeout: float, batch: int,
                fail_every: int = 0, stop: threading.Event | None = None,
                published: list[int] | None = None) -> dict[str, Any]:
    """The worker loop the README documents: release, claim, publish, record; retry on
    LockConflictError, reconnect after a connection error."""
    db = repo.database
    seen: dict[str, Any] = {"claims": [], "conflicts": 0, "connection_errors": 0}
    while stop is None or not stop.is_set():
        try:
            repo.release_expired_locks(lock_timeout)
            with db.atomic():
                claimed = repo.claim_batch(name, limit=batch)
            if not claimed:
                left = db.execute_sql("SELECT COUNT(*) FROM outbox_event WHERE status IN"
                                      " ('pending', 'processing')").fetchone()[0]
                if left == 0:
                    break
                time.sleep(0.001)  # polling for work, not for a lock to expire
                continue
            seen["claims"] += [(e.id, e.attempt_count) for e in claimed]
            for event in claimed:
                if fail_every and event.id % fail_every == 0 and event.attempt_count < 3:
                    repo.mark_failed(event.id, name, "broker_down", "try later")
                    continue
                db.execute_sql("INSERT INTO sink (event_id, worker) VALUES (%s, %s)",
                               (event.id, name))
                if repo.mark_published(event.id, name) and published is not None:
                    published.append(event.id)
        except LockConflictError:
            seen["conflicts"] += 1
        except CONNECTION_ERRORS:
            seen["connection_errors"] += 1
            _forget_dead_connection(db)
    return seen


@pytest.fixture
def sink(db):
    db.execute_sql(f"CREATE TABLE sink ({FAMILY.SERIAL_ID},"
                   " event_id BIGINT NOT NULL, worker VARCHAR(64) NOT NULL)")
    return db


# ---------------------------------------------------------------------------
# Lock conflicts are typed and retryable
# ---------------------------------------------------------------------------

def test_lock_wait_timeout_is_a_typed_retryable_error(db, repo, fetch):
    event = new_event(repo)
    assert repo.mark_processing(event.id, "w")
    with db.atomic():
        assert repo.mark_published(event.id, "w")  # holds the row until commit

        def late(_):
            FAMILY.limit_lock_waits(db, 1)
            return repo.mark_failed(event.id, "w", "x", "y")

        _, errors = run_threads(1, late, db)
    assert len(errors) == 1 and isinstance(errors[0], LockConflictError)
    assert errors[0].errno == FAMILY.LOCK_WAIT and errors[0].retryable is True
    assert isinstance(errors[0].__cause__, pw.OperationalError)
    # Retried after the holder committed, the call sees the truth: already published.
    assert repo.mark_failed(event.id, "w", "x", "y") is False
    assert fetch("SELECT status, last_error_code FROM outbox_event") == [
        {"status": "published", "last_error_code": None}]


@pytest.mark.parametrize("round_", range(3))
def test_deadlock_is_a_typed_retryable_error_and_the_victim_is_rolled_back(
        db, repo, fetch, round_):
    a, b = seed(repo, 2)
    barrier = threading.Barrier(2)
    before = FAMILY.deadlocks(fetch)

    def cross(i):
        first, second = (a, b) if i == 0 else (b, a)
        with db.atomic():
            assert repo.mark_processing(first, f"w{i}")
            barrier.wait(timeout=10)
            return repo.mark_processing(second, f"w{i}")

    results, errors = run_threads(2, cross, db)
    assert len(errors) == 1, errors
    assert isinstance(errors[0], LockConflictError) and errors[0].errno == FAMILY.DEADLOCK
    winner = results.index(True)
    # The survivor's transaction holds both claims; the victim's first claim was undone.
    rows = fetch("SELECT locked_by, status FROM outbox_event ORDER BY id")
    assert rows == [{"locked_by": f"w{winner}", "status": "processing"}] * 2
    assert _deadlocks_above(fetch, before)


# ---------------------------------------------------------------------------
# Killed connections
# ---------------------------------------------------------------------------

def test_writer_connection_killed_before_commit_leaves_nothing(db, repo, fetch):
    with pytest.raises((pw.OperationalError, pw.InterfaceError)) as info:
        with db.atomic():
            db.execute_sql("INSERT INTO job (name) VALUES ('resize')")
            repo.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="1",
                                       payload={})
            fetch(FAMILY.kill_sql(_connection_id(db)))
    assert any(words in str(info.value) for words in FAMILY.LOST_CONNECTION_WORDS), info.value
    assert fetch("SELECT COUNT(*) AS n FROM job") == [{"n": 0}]
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]
    _forget_dead_connection(db)
    with db.atomic():  # the next transaction reconnects and works
        repo.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="1",
                                   payload={})
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 1}]


def test_a_lost_connection_is_a_clear_error_and_the_next_call_reconnects(db, repo, fetch):
    event = new_event(repo)
    assert repo.mark_processing(event.id, "w")
    fetch(FAMILY.kill_sql(_connection_id(db)))
    with pytest.raises(ConnectionLostError, match="lost the connection"):
        repo.mark_published(event.id, "w")
    assert repo.mark_published(event.id, "w") is True  # reconnected by itself
    assert fetch("SELECT status FROM outbox_event") == [{"status": "published"}]


def test_every_worker_connection_killed_at_once_loses_and_doubles_nothing(
        db, db_url, sink, fetch):
    clock = SuiteClock(db)
    repo = OutboxRepository(db, clock=clock)
    ids = seed(repo, 600)
    progress = []
    killed = threading.Event()

    def watcher():
        # Kill every connection to the test database but our own, as a restart looks.
        while len(progress) < 150:
            time.sleep(0.001)
        for row in fetch(FAMILY.OTHER_SESSIONS, db_url.name):
            try:
                fetch(FAMILY.kill_sql(row["id"]))
            except Exception:  # noqa: BLE001 - it may have closed by itself
                pass
        clock.advance(dt.timedelta(seconds=61))  # claims the dead held have now expired
        killed.set()

    kill_thread = threading.Thread(target=watcher)
    kill_thread.start()
    results, errors = run_threads(
        8, lambda i: worker_loop(repo, f"w{i}", lock_timeout=60, batch=10, published=progress),
        db)
    kill_thread.join()
    assert errors == []
    assert killed.is_set()
    assert sum(r["connection_errors"] for r in results) >= 1
    claims = [c for r in results for c in r["claims"]]
    assert len(claims) == len(set(claims)), "an event was held by two workers at once"
    rows = fetch("SELECT id, status, attempt_count FROM outbox_event ORDER BY id")
    assert [r["id"] for r in rows] == ids and {r["status"] for r in rows} == {"published"}
    doubles = fetch("SELECT event_id FROM sink GROUP BY event_id HAVING COUNT(*) > 1")
    retried = {r["id"] for r in rows if r["attempt_count"] > 1}
    assert {d["event_id"] for d in doubles} <= retried  # only claims cut off by the kill


# ---------------------------------------------------------------------------
# Killed processes
# ---------------------------------------------------------------------------

def test_worker_processes_killed_while_holding_claims(db, db_url, sink, fetch):
    ids = seed(OutboxRepository(db), 120)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    procs = [ctx.Process(target=_proc.claim_then_hang, args=(db_url.secret_text(), f"p{i}", 20,
                                                            ready)) for i in range(3)]
    for p in procs:
        p.start()
    held = {}
    for _ in procs:
        name, batch = ready.get(timeout=60)
        held[name] = batch
    for p in procs:
        p.kill()  # SIGKILL: no cleanup, claims stay processing
        p.join(timeout=30)
        assert p.exitcode == -9
    held_ids = {i for batch in held.values() for i in batch}
    assert len(held_ids) == 60  # three disjoint batches
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'processing'") == [
        {"n": 30}]

    clock = SuiteClock(db)
    clock.advance(dt.timedelta(seconds=301))  # past the lock timeout, without waiting
    survivors = OutboxRepository(db, clock=clock)
    results, errors = run_threads(
        4, lambda i: worker_loop(survivors, f"s{i}", lock_timeout=300, batch=10), db)
    assert errors == []
    rows = fetch("SELECT id, status FROM outbox_event ORDER BY id")
    assert [r["id"] for r in rows] == ids and {r["status"] for r in rows} == {"published"}
    doubles = {r["event_id"] for r in fetch(
        "SELECT event_id FROM sink GROUP BY event_id HAVING COUNT(*) > 1")}
    assert doubles and doubles <= held_ids  # duplicates only among what the dead held
    assert fetch("SELECT COUNT(DISTINCT event_id) AS n FROM sink") == [{"n": 120}]


def test_dedupe_key_raced_by_many_processes_has_exactly_one_row(db, db_url, fetch):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_proc.insert_key,
                         args=(db_url.secret_text(), "order-1", barrier, results))
             for _ in range(6)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert outcomes == ["duplicate"] * 5 + ["inserted"], outcomes
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE dedupe_key = 'order-1'") == [
        {"n": 1}]
    assert fetch("SELECT COUNT(*) AS n FROM job") == [{"n": 1}]


# ---------------------------------------------------------------------------
# The documented loop never deadlocks against itself
# ---------------------------------------------------------------------------

class FastClock:
    """Real time running 200 times faster, so a 1 s lock timeout passes in 5 ms of work."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.origin = dt.datetime.now(dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.origin + dt.timedelta(seconds=(time.monotonic() - self.start) * 200)


@pytest.mark.parametrize("round_", range(2))
def test_sixteen_workers_in_the_documented_loop_never_deadlock(db, sink, fetch, round_):
    repo = OutboxRepository(db, clock=FastClock(), max_attempts=6,
                            backoff=Backoff(base=0.2, cap=1, jitter=0.5))
    ids = seed(repo, 1500)
    before = FAMILY.deadlocks(fetch)
    results, errors = run_threads(
        16, lambda i: worker_loop(repo, f"w{i}", lock_timeout=1, batch=20, fail_every=7), db)
    assert errors == []
    assert not _deadlocks_above(fetch, before), "the repository's own statements deadlocked"
    assert sum(r["conflicts"] for r in results) == 0
    claims = [c for r in results for c in r["claims"]]
    assert len(claims) == len(set(claims))
    statuses = fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status")
    assert {s["status"] for s in statuses} <= {"published", "failed"}
    assert sum(s["n"] for s in statuses) == len(ids)
    expired = fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE last_error_code ="
                    " 'lock_expired'")[0]["n"]
    retried = fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE attempt_count > 1")[0]["n"]
    assert retried > 0 and expired > 0  # failures and expiries both happened in the race


#: Session settings that make a statement visit rows in id order (an index scan) or in the
#: heap's order (a sequential scan). PostgreSQL's planner takes either, per session; MySQL's
#: statements name the primary key (FORCE INDEX (PRIMARY)), so both walk it in id order there
#: whatever the session asks.
_IN_ID_ORDER = {"postgresql": ["SET enable_seqscan = off", "SET enable_bitmapscan = off"],
                "mysql": []}
_IN_HEAP_ORDER = {"postgresql": ["SET enable_indexscan = off", "SET enable_bitmapscan = off"],
                  "mysql": []}


#: What a second session runs over the same expired claims: another releaser, or their late
#: owner recording or renewing them all (fenced off: the first releaser has taken them).
_LATE_CALLS = {
    "release": lambda repo, ids: repo.release_expired_locks(60),
    "publish_many": lambda repo, ids: repo.mark_published_many(ids, "dead-worker"),
    "extend": lambda repo, ids: repo.extend_locks(ids, "dead-worker"),
}


@pytest.mark.parametrize("late", sorted(_LATE_CALLS))
def test_statements_whose_plans_visit_the_claims_in_opposite_orders_never_deadlock(
        db, db_url, repo, clock, fetch, late):
    """A releaser's plan walks the expired claims in id order; the second session's (a
    releaser, or the late owner's batch record or renewal) in the heap's, which the
    renumbering made the opposite one. A third session holds the middle row: the releaser
    waits there holding the rows below it, then the second starts. A statement that changed
    rows in its plan's order would hold rows above the middle when the holder lets go: a
    deadlock, every time, on PostgreSQL before these statements locked in id order. Locked in
    id order first, the second waits for the releaser, and finds nothing left to change."""
    ids = _renumbered(db, claim_all(repo, "dead-worker", 60))
    clock.advance(minutes=10)
    outcome = _in_opposite_orders(
        db_url, fetch, ids[30],
        lambda session: OutboxRepository(session.db, clock=clock).release_expired_locks(60),
        lambda session: _LATE_CALLS[late](OutboxRepository(session.db, clock=clock), ids))
    assert outcome == (len(ids), 0)
    assert fetch("SELECT DISTINCT status, last_error_code, locked_by FROM outbox_event") == [
        {"status": "pending", "last_error_code": "lock_expired", "locked_by": None}]


#: An operator's statement over many dead letters (or old published events) at once.
_OPERATOR_CALLS = {
    "requeue": lambda repo, ids: repo.requeue_failed(ids),
    "delete": lambda repo, ids: repo.delete_failed(ids),
    "purge": lambda repo, ids: repo.purge_published(60),
}


@pytest.mark.parametrize("calls", [("requeue", "delete"), ("delete", "requeue"),
                                   ("requeue", "requeue"), ("delete", "delete"),
                                   ("purge", "purge")])
def test_operators_statements_whose_plans_visit_rows_in_opposite_orders_never_deadlock(
        db, db_url, repo, clock, fetch, calls):
    """Two operators at once (the CLI's dead-letters --requeue or --delete, two purges), as
    in the test above: the first's plan walks the rows in id order and waits at the middle
    row a third session holds, the second's walks them in the heap's order (the opposite
    one). Each locks the rows it changes in id order first, so the second waits for the
    first and finds nothing left to change: no deadlock on either server."""
    ids = _renumbered(db, seed(repo, 60))
    if calls[0] == "purge":
        db.execute_sql("UPDATE outbox_event SET status = 'published', published_at = %s",
                       (clock().replace(tzinfo=None) - dt.timedelta(hours=1),))
    else:
        db.execute_sql("UPDATE outbox_event SET status = 'failed', last_error_code = 'x'")
    first, second = (_OPERATOR_CALLS[call] for call in calls)
    outcome = _in_opposite_orders(
        db_url, fetch, ids[30],
        lambda session: first(OutboxRepository(session.db, clock=clock), ids),
        lambda session: second(OutboxRepository(session.db, clock=clock), ids))
    assert outcome == (len(ids), 0)
    left = fetch("SELECT status, attempt_count, COUNT(*) AS n FROM outbox_event"
                 " GROUP BY status, attempt_count")
    assert left == ([{"status": "pending", "attempt_count": 0, "n": len(ids)}]
                    if calls[0] == "requeue" else [])


def _renumbered(db, ids: list[int]) -> list[int]:
    """Renumber the table's rows so that the heap's order is the ids' opposite one; the new
    ids of ``ids``, ascending."""
    db.execute_sql("UPDATE outbox_event SET id = 1000000 - id")
    return sorted(1000000 - i for i in ids)


def _in_opposite_orders(db_url, fetch, middle: int, first_call, second_call) -> tuple:
    """Run ``first_call(session)`` on a session whose plans visit rows in id order, with a
    third session holding row ``middle`` until it waits there, then ``second_call(session)``
    on one whose plans visit them in the heap's order until it waits too; let ``middle`` go.
    Their results (or the deadlock one of them raises)."""
    holder, first, second = (ThreadSession(db_url, wait=60) for _ in range(3))
    try:
        for session, settings in ((first, _IN_ID_ORDER), (second, _IN_HEAP_ORDER)):
            for statement in settings[FAMILY.name]:
                session.run(session.db.execute_sql, statement)
        holder.begin()
        holder.run(holder.db.execute_sql,
                   "SELECT id FROM outbox_event WHERE id = %s FOR UPDATE", (middle,))
        running = first.start(first_call, first)
        _until_waiting(fetch, first)
        calling = second.start(second_call, second)
        _until_waiting(fetch, second)
        holder.commit()
        return running.result(timeout=60), calling.result(timeout=60)
    finally:
        for session in (holder, first, second):
            session.close()


def _until_waiting(fetch, session) -> None:
    """Until ``session``'s transaction waits for a row lock (FAMILY.waits_for_lock; InnoDB
    refreshes its view of waits when it was not read for 0.1 s, hence the pause)."""
    deadline = time.monotonic() + 30
    while not FAMILY.waits_for_lock(fetch, session.connection_id):
        assert time.monotonic() < deadline, "the releaser never reached its lock wait"
        time.sleep(0.1)
