"""The isolation levels the claim's promises hold for (issue 21, "said nowhere").

``claim_batch`` promises disjoint sets without waiting, and no deadlock. Under READ
UNCOMMITTED, READ COMMITTED and REPEATABLE READ that holds: its candidate read locks nothing.
Under SERIALIZABLE InnoDB turns that read into a locking one (shared next-key locks), so
claimers wait for each other and for writers, and deadlock. So ``claim_batch`` refuses a
SERIALIZABLE transaction (IsolationLevelError, before any claim statement), and the relay runs
its claim transaction at REPEATABLE READ when its session's level is SERIALIZABLE. Sessions are
made SERIALIZABLE with a session variable of the shared server (never a global one), whose name
the server fixture gives (MariaDB 10.11 knows only ``tx_isolation``).

PostgreSQL states the same answers for other reasons: there no read locks, but above READ
COMMITTED a claim that meets a row another claimer changed after its snapshot fails with a
serialization failure (40001; three claimers at once, 30 rounds: 15 of 90 claims at REPEATABLE
READ, 58 of 90 at SERIALIZABLE), so ``claim_batch`` refuses SERIALIZABLE there too and the relay
claims at READ COMMITTED (PostgreSQL's default; READ UNCOMMITTED is READ COMMITTED there).
Sessions get their level from libpq's ``options`` (``default_transaction_isolation``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from outbox_lite import IsolationLevelError, LockConflictError, OutboxRepository
from outbox_lite.relay import Relay

from _helpers import FAMILY

LEVELS = ("READ UNCOMMITTED", "READ COMMITTED", "REPEATABLE READ")


def _database(db_url: Any, server: Any, isolation: str | None = None, wait: int = 1) -> Any:
    """A database whose sessions wait at most ``wait`` s for a lock (then the lock-wait
    error), at ``isolation`` when given."""
    return db_url.database(**FAMILY.session_options(server, isolation, wait))


def _write(repo: OutboxRepository, count: int, first: int = 0) -> list[int]:
    with repo.database.atomic():
        return [repo.create_in_transaction(event_type="job.created", aggregate_type="job",
                                           aggregate_id=str(n), payload={"n": n}).id
                for n in range(first, first + count)]


def _nothing_locked(db_url: Any, ids: list[int]) -> None:
    """Another session locks every row at once (NOWAIT): no lock is held on them."""
    database = db_url.database()
    try:
        with database.atomic() as transaction:
            rows = database.execute_sql(
                "SELECT id FROM outbox_event WHERE id IN (%s) FOR UPDATE NOWAIT"
                % ", ".join(["%s"] * len(ids)), ids).fetchall()
            assert len(rows) == len(ids)
            transaction.rollback()
    finally:
        database.close()


@pytest.mark.parametrize("isolation", LEVELS)
def test_claims_are_disjoint_without_waiting_at(isolation, db_url, server, fetch):
    dbs = [_database(db_url, server) for _ in range(3)]
    first, second, writer = (OutboxRepository(d) for d in dbs)
    ids = _write(writer, 10)
    try:
        with dbs[0].atomic(isolation_level=isolation):
            a = first.claim_batch("a", limit=5)
            started = time.monotonic()
            with dbs[1].atomic(isolation_level=isolation):
                b = second.claim_batch("b", limit=10)  # waits 1 s, then 1205, if it waits
            with dbs[2].atomic(isolation_level=isolation):
                _write(writer, 1, first=10)  # a writer does not wait for the open claim
            waited = time.monotonic() - started
    finally:
        for d in dbs:
            d.close()
    assert {e.id for e in a} | {e.id for e in b} == set(ids)
    assert not {e.id for e in a} & {e.id for e in b}
    assert waited < 0.5
    rows = fetch("SELECT locked_by, COUNT(*) AS n FROM outbox_event GROUP BY locked_by")
    assert {r["locked_by"]: r["n"] for r in rows} == {"a": 5, "b": 5, None: 1}


def test_claim_batch_refuses_a_serializable_transaction_before_any_claim(db_url, server,
                                                                        fetch):
    serializable = _database(db_url, server, "SERIALIZABLE")
    repeatable = _database(db_url, server)
    repo = OutboxRepository(serializable)
    ids = _write(OutboxRepository(repeatable), 5)
    try:
        with serializable.atomic():  # the session's level
            with pytest.raises(IsolationLevelError, match="SERIALIZABLE") as caught:
                repo.claim_batch("w", limit=5)
            assert caught.value.isolation == "SERIALIZABLE"
            _nothing_locked(db_url, ids)  # no locking read ran
        with repeatable.atomic(isolation_level="SERIALIZABLE"):  # the transaction's level
            with pytest.raises(IsolationLevelError):
                OutboxRepository(repeatable).claim_batch("w", limit=5)
            _nothing_locked(db_url, ids)
        with serializable.atomic(isolation_level="REPEATABLE READ"):  # what the error says
            assert len(repo.claim_batch("w", limit=5)) == 5
    finally:
        serializable.close()
        repeatable.close()
    assert [r["n"] for r in fetch("SELECT COUNT(*) AS n FROM outbox_event"
                                  " WHERE status = 'processing' AND attempt_count = 1")] == [5]


class _Collect:
    def __init__(self) -> None:
        self.published: list[int] = []
        self._lock = threading.Lock()

    def publish(self, events: Any) -> dict[int, BaseException]:
        with self._lock:
            self.published.extend(e.id for e in events)
        return {}

    def close(self) -> None:
        pass


def test_a_relay_on_a_serializable_session_skips_held_claims_without_waiting(db_url, server,
                                                                            fetch):
    holder = _database(db_url, server)
    relay_db = _database(db_url, server, "SERIALIZABLE")
    ids = _write(OutboxRepository(holder), 10)
    publisher = _Collect()
    relay = Relay(OutboxRepository(relay_db), publisher, batch_size=10, progress_every=0)
    try:
        with holder.atomic():
            held = OutboxRepository(holder).claim_batch("holder", limit=5)
            started = time.monotonic()
            result = relay.run_once()  # its claim would wait on the held rows, then 1205
            waited = time.monotonic() - started
    finally:
        relay.close()
        holder.close()
        relay_db.close()
    assert result.published == 5 and waited < 0.5
    assert sorted(publisher.published + [e.id for e in held]) == ids
    assert {r["status"] for r in fetch("SELECT status FROM outbox_event WHERE locked_by"
                                       " IS NULL")} == {"published"}


def test_four_relays_and_two_writers_on_serializable_sessions_never_deadlock(db_url, server,
                                                                            fetch):
    per_writer, relays_n = 300, 4
    dbs = [_database(db_url, server, "SERIALIZABLE", wait=5) for _ in range(relays_n + 2)]
    publisher = _Collect()
    relays = [Relay(OutboxRepository(d), publisher, batch_size=20, progress_every=0,
                    idle_pause=0.005, max_idle_pause=0.01) for d in dbs[:relays_n]]
    writer_errors: list[BaseException] = []
    stop = threading.Event()
    barrier = threading.Barrier(relays_n + 2)

    def write(database: Any, first: int) -> None:
        repo = OutboxRepository(database)
        barrier.wait()
        for n in range(first, first + per_writer, 2):
            try:
                _write(repo, 2, first=n)
            except (LockConflictError, Exception) as exc:  # noqa: BLE001 - counted below
                writer_errors.append(exc)
        database.close()

    def run(relay: Relay) -> None:
        barrier.wait()
        relay.run(stop)
        relay.repository.database.close()

    threads = [threading.Thread(target=run, args=(r,)) for r in relays]
    threads += [threading.Thread(target=write, args=(dbs[relays_n + i], i * per_writer))
                for i in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'published'"
                 )[0]["n"] == 2 * per_writer:
            break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    conflicts = sum(r.stats.lock_conflicts for r in relays)
    assert (conflicts, writer_errors) == (0, [])
    assert sorted(publisher.published) == sorted(set(publisher.published))  # each once
    assert len(publisher.published) == 2 * per_writer
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": 2 * per_writer}]
