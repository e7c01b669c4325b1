"""The multi-worker lock contention suite behind ``outbox-lite contention``.

Worker threads, each on its own connection, race over an outbox seeded in a fresh database.
Every scenario ends by checking its invariants against the database itself: the outbox rows,
and a sink table that stands for the broker (one row per publish). Time moves through an
injected clock, never by sleeping until a lock expires.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import peewee as pw

from . import _sql as sql
from . import migrate as schema
from ._db import DatabaseUrl, execute
from ._server import LockCounters, peewee_query, server_of
from .backoff import Backoff
from .errors import DuplicateEventError, LockConflictError
from .repository import OutboxRepository

_TABLES = {
    # The "broker": one row per publish, in publish order.
    "contention_sink": "CREATE TABLE contention_sink (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
                       " event_id BIGINT NOT NULL, worker VARCHAR(64) NOT NULL,"
                       " attempt INT NOT NULL, KEY ix_sink_event (event_id)) ENGINE=InnoDB",
    # Business rows of the dedupe scenario.
    "contention_job": "CREATE TABLE contention_job (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
                      " dedupe_key VARCHAR(64) NOT NULL) ENGINE=InnoDB",
    # One row per aggregate with an event in flight (claimed and not yet recorded).
    "contention_flight": "CREATE TABLE contention_flight (aggregate VARCHAR(64) PRIMARY KEY,"
                         " event_id BIGINT NOT NULL) ENGINE=InnoDB",
}
_PROGRESS_EVERY = 5.0  # seconds between progress lines during a long race
_STALLED = 10.0  # seconds without a claim anywhere after which polling workers give up


@dataclass
class Result:
    """One scenario's figures and the invariants it broke (none when ``ok``)."""

    scenario: str
    workers: int
    events: int
    seconds: float  # racing only: seeding and checks are not counted
    claims: int  # successful claims (dedupe: successful inserts)
    cas_misses: int | None = None
    lock_conflicts: int = 0  # LockConflictError seen by the workers
    deadlocks: int = 0  # the server's deadlocks during the scenario (all sessions)
    lock_waits: int = 0  # the server's row-lock waits during the scenario (all sessions)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def claims_per_second(self) -> float:
        return self.claims / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(ok=self.ok, claims_per_second=round(self.claims_per_second, 1),
                    seconds=round(self.seconds, 3))
        return data


class SuiteClock:
    """Real UTC time plus an offset the suite moves forward to expire claims."""

    def __init__(self) -> None:
        self._offset = dt.timedelta(0)
        self._lock = threading.Lock()

    def __call__(self) -> dt.datetime:
        with self._lock:
            return dt.datetime.now(dt.timezone.utc) + self._offset

    def advance(self, delta: dt.timedelta) -> None:
        with self._lock:
            self._offset += delta


class _Workers:
    """Runs ``count`` threads released by one Barrier; collects results and errors."""

    def __init__(self, database: pw.Database, report: Callable[[float], None]) -> None:
        self.database = database
        self.report = report  # called with the seconds raced so far, every few seconds
        self.lock_conflicts = 0
        self.seconds = 0.0  # time spent racing, seeding and checks excluded
        #: Set when a worker raised: the others stop waiting for work it will never finish.
        self.failed = threading.Event()
        self._lock = threading.Lock()

    def count_conflict(self) -> None:
        with self._lock:
            self.lock_conflicts += 1

    def run(self, count: int, target: Callable[[int], Any]) -> tuple[list[Any], list[BaseException]]:
        barrier = threading.Barrier(count)
        results: list[Any] = [None] * count
        errors: list[BaseException] = []

        def body(i: int) -> None:
            try:
                barrier.wait(timeout=60)
                results[i] = target(i)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                with self._lock:
                    errors.append(exc)
                self.failed.set()
            finally:
                if not self.database.is_closed():
                    self.database.close()

        threads = [threading.Thread(target=body, args=(i,), name=f"outbox-worker-{i}")
                   for i in range(count)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=_PROGRESS_EVERY)
                if thread.is_alive():
                    self.report(self.seconds + time.perf_counter() - started)
        self.seconds += time.perf_counter() - started
        return results, errors


#: A scenario seeds the outbox, races the workers and records its figures and violations.
Scenario = Callable[["ContentionSuite", "Result", "_Workers"], None]
_REGISTRY: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    """Register a scenario under ``name``; the suite runs them in registration order."""
    def register(function: Scenario) -> Scenario:
        _REGISTRY[name] = function
        return function
    return register


class ContentionSuite:
    """The scenarios of SPEC §3 and §4 against a database created for the run.

    ``repository_factory`` builds the repository under test from (database, clock,
    max_attempts, backoff); the tests swap in a broken one to prove the checks bite.
    """

    def __init__(
        self,
        url: DatabaseUrl,
        *,
        workers: int = 8,
        events: int = 2000,
        batch_size: int = 50,
        max_attempts: int = 3,
        lock_timeout: float = 30.0,
        keep: bool = False,
        force: bool = False,
        repository_factory: Callable[..., OutboxRepository] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        if workers < 2 or events < workers:
            raise ValueError("the suite needs at least 2 workers and one event per worker")
        self.url = url
        self.workers = workers
        self.events = events
        self.batch_size = batch_size
        self.max_attempts = max_attempts
        self.lock_timeout = dt.timedelta(seconds=lock_timeout)
        self.keep = keep
        self.force = force
        self.factory = repository_factory or self._default_factory
        self.progress = progress or (lambda message: None)
        self.clock = SuiteClock()
        self.database: pw.MySQLDatabase = url.database()

    @staticmethod
    def _default_factory(database: pw.Database, **options: Any) -> OutboxRepository:
        return OutboxRepository(database, **options)

    def repository(self, max_attempts: int | None = None) -> OutboxRepository:
        # Retries in real milliseconds, so the retry scenario never waits on a backoff.
        return self.factory(self.database, clock=self.clock,
                            max_attempts=max_attempts or self.max_attempts,
                            backoff=Backoff(base=0.001, factor=2, cap=0.004, jitter=0.5))

    # -- the run ------------------------------------------------------------------------

    def run(self, scenarios: Iterable[str] | None = None) -> list[Result]:
        """Run the scenarios (default: all) in order on a fresh database; returns one Result
        each."""
        scenarios = list(_REGISTRY if scenarios is None else scenarios)
        unknown = sorted(set(scenarios) - set(_REGISTRY))
        if unknown:
            raise ValueError(f"unknown scenario(s): {', '.join(unknown)}")
        # The run creates its database and drops only that one (unless keep). One that exists
        # already raises DatabaseExistsError and is left alone, unless force lets the run
        # drop it and create its own.
        if self.force:
            self.url.drop_database()
        self.url.create_database(exclusive=True)
        try:
            schema.migrate(self.database)
            for create in _TABLES.values():
                self.database.execute_sql(create)
            results = []
            for name in scenarios:
                self._reset()
                self.progress(f"{name}: seeding")
                results.append(self._measured(name, _REGISTRY[name]))
            return results
        finally:
            self.database.close()
            if not self.keep:
                self.url.drop_database()

    def _reset(self) -> None:
        for table in ("outbox_event", *_TABLES):
            self.database.execute_sql(f"TRUNCATE TABLE {table}")

    def _lock_counters(self) -> LockCounters:
        query = peewee_query(self.database)
        return server_of(query).lock_counters(query)

    def _measured(self, name: str, scenario: Scenario) -> Result:
        result = Result(scenario=name, workers=self.workers, events=self.events, seconds=0.0,
                        claims=0)
        monitor = self.url.database()

        def report(seconds: float) -> None:
            rows = monitor.execute_sql(
                "SELECT status, COUNT(*) FROM outbox_event GROUP BY status").fetchall()
            self.progress(f"{name}: {seconds:.0f} s in, "
                          + ", ".join(f"{count} {status}" for status, count in sorted(rows)))

        workers = _Workers(self.database, report)
        before = self._lock_counters()
        scenario(self, result, workers)
        result.seconds = workers.seconds
        result.deadlocks, result.lock_waits = self._lock_counters() - before
        result.lock_conflicts = workers.lock_conflicts
        monitor.close()
        self.progress(f"{name}: {'ok' if result.ok else 'INVARIANT BROKEN'}"
                      f" in {result.seconds:.2f} s")
        return result

    # -- helpers ------------------------------------------------------------------------

    def seed(self, count: int) -> list[int]:
        repo = self.repository()
        ids: list[int] = []
        for start in range(0, count, 1000):
            with self.database.atomic():
                ids += [repo.create_in_transaction(
                    event_type="job.created", aggregate_type="contention",
                    aggregate_id=str(n), payload={"n": n}).id
                    for n in range(start, min(count, start + 1000))]
        return ids

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return list(self.database.execute_sql(sql, params).fetchall())

    def publish(self, worker: str, events: Iterable[tuple[int, int]]) -> None:
        """The "broker": one sink row per (event id, attempt) published."""
        rows = list(events)
        if rows:
            self.database.execute_sql(
                "INSERT INTO contention_sink (event_id, worker, attempt) VALUES "
                + ", ".join(["(%s, %s, %s)"] * len(rows)),
                [value for event_id, attempt in rows for value in (event_id, worker, attempt)])

    def pending_left(self) -> int:
        return self.query("SELECT COUNT(*) FROM outbox_event WHERE status = 'pending'")[0][0]

    def unblocked_left(self) -> int:
        """Pending or processing events not behind a dead letter of their aggregate."""
        left = self.query("SELECT COUNT(*) FROM outbox_event"
                          " WHERE status IN ('pending', 'processing')")[0][0]
        return left - self.query(sql.HELD_BACK)[0][0] if left else 0

    def enter_flight(self, batch: list[Any], workers: _Workers) -> int:
        """Mark the batch's aggregates in flight; returns how many already were.

        In key order, so two batches that share aggregates (only a broken claim makes them)
        lock them in the same order; a lock conflict all the same is counted and retried."""
        rows = sorted((f"{e.aggregate_type}:{e.aggregate_id}", e.id) for e in batch)
        statement = ("INSERT IGNORE INTO contention_flight (aggregate, event_id) VALUES "
                     + ", ".join(["(%s, %s)"] * len(rows)))
        while True:
            try:
                inserted = execute(self.database, statement,
                                   [v for row in rows for v in row]).rowcount
                return len(rows) - inserted
            except LockConflictError:
                workers.count_conflict()

    def leave_flight(self, batch: list[Any]) -> None:
        """The batch's aggregates are out of flight (by primary key: no scan, no gap locks).
        Inside the caller's transaction; a lock conflict is a LockConflictError."""
        aggregates = [f"{e.aggregate_type}:{e.aggregate_id}" for e in batch]
        execute(self.database,  # the hint: left alone, a short table is scanned, all locked
                "DELETE f FROM contention_flight AS f FORCE INDEX (PRIMARY) WHERE f.aggregate"
                " IN (" + ", ".join(["%s"] * len(batch)) + ") AND f.event_id IN ("
                + ", ".join(["%s"] * len(batch)) + ")", [*aggregates, *(e.id for e in batch)])

    def claim(self, repo: OutboxRepository, worker: str, workers: _Workers,
              ordered: bool = False) -> list[Any] | None:
        """One claim transaction; None after a lock conflict (the caller just retries)."""
        try:
            with self.database.atomic():
                return repo.claim_batch(worker, limit=self.batch_size, ordered=ordered)
        except LockConflictError:
            workers.count_conflict()
            return None

    def batch_worker(self, repo: OutboxRepository, workers: _Workers, name: str,
                      fail: Callable[[int, int], bool] | None = None,
                      many: bool = False) -> list[tuple[int, int]]:
        """The documented worker loop; returns the (event id, attempt) pairs it claimed.
        With ``many`` it records each batch's publishes with one mark_published_many."""
        claims: list[tuple[int, int]] = []
        while True:
            batch = self.claim(repo, name, workers)
            if batch is None:
                continue
            if not batch:
                if self.pending_left() == 0 or workers.failed.is_set():
                    return claims
                time.sleep(0.002)  # retries wait out a millisecond backoff
                continue
            claims += [(e.id, e.attempt_count) for e in batch]
            good = {e.id for e in batch if not (fail and fail(e.id, e.attempt_count))}
            self.publish(name, ((e.id, e.attempt_count) for e in batch if e.id in good))
            if many:
                repo.mark_published_many(good, name)
            for event in batch:
                if event.id not in good:
                    repo.mark_failed(event.id, name, "publish_failed", "broker said no")
                elif not many:
                    repo.mark_published(event.id, name)

    # -- invariants ---------------------------------------------------------------------

    def check_common(self, result: Result, ids: list[int], claims: list[tuple[int, int]],
                      errors: list[BaseException]) -> None:
        v = result.violations
        for exc in errors[:3]:
            v.append(f"worker raised {type(exc).__name__}: {exc}")
        if len(errors) > 3:
            v.append(f"... and {len(errors) - 3} more worker errors")
        rows = self.query("SELECT id FROM outbox_event ORDER BY id")
        if [r[0] for r in rows] != ids:
            v.append(f"rows lost or invented: {len(rows)} in the table, {len(ids)} seeded")
        twice = len(claims) - len(set(claims))
        if twice:
            v.append(f"{twice} claims handed an event to two workers at once")
        leaked = self.query("SELECT COUNT(*) FROM outbox_event WHERE status <> 'processing'"
                             " AND (locked_by IS NOT NULL OR locked_at IS NOT NULL)")[0][0]
        if leaked:
            v.append(f"{leaked} finished events still carry a lock")
        dupes = self.query("SELECT COUNT(*) FROM (SELECT event_id FROM contention_sink"
                            " GROUP BY event_id HAVING COUNT(*) > 1) d")[0][0]
        if dupes:
            v.append(f"{dupes} events were published more than once")
        unpublished = self.query(
            "SELECT COUNT(*) FROM outbox_event e WHERE (e.status = 'published') <>"
            " EXISTS (SELECT 1 FROM contention_sink s WHERE s.event_id = e.id)")[0][0]
        if unpublished:
            v.append(f"{unpublished} events disagree between their status and the sink")
        result.claims = len(claims)

    def expect_statuses(self, result: Result, expected: dict[str, int]) -> None:
        actual = dict(self.query("SELECT status, COUNT(*) FROM outbox_event GROUP BY status"))
        if {k: n for k, n in actual.items() if n} != {k: n for k, n in expected.items() if n}:
            result.violations.append(f"statuses {actual}, expected {expected}")

    def expect_attempts(self, result: Result, where: str, attempts: int, count: int) -> None:
        found = self.query(f"SELECT COUNT(*) FROM outbox_event WHERE {where}"
                            " AND attempt_count = %s", attempts)[0][0]
        if found != count:
            result.violations.append(
                f"{found} events where {where} have attempt_count {attempts}, expected {count}")


# ---------------------------------------------------------------------------
# Scenarios: each is a function registered by name, run in this order.
# ---------------------------------------------------------------------------

@scenario("batch")
def _batch(suite: ContentionSuite, result: Result, workers: _Workers) -> None:
    """claim_batch, then mark_published per event (even workers) or per batch (odd ones)."""
    ids = suite.seed(suite.events)
    repo = suite.repository()
    suite.progress("batch: racing")
    results, errors = workers.run(
        suite.workers, lambda i: suite.batch_worker(repo, workers, f"batch-{i}",
                                                    many=i % 2 == 1))
    claims = [c for r in results if r for c in r]
    suite.check_common(result, ids, claims, errors)
    suite.expect_statuses(result, {"published": len(ids)})
    suite.expect_attempts(result, "status = 'published'", 1, len(ids))


@scenario("cas")
def _cas(suite: ContentionSuite, result: Result, workers: _Workers) -> None:
    """find_dispatchable + mark_processing: the compare-and-set flow claim_batch replaces."""
    ids = suite.seed(suite.events)
    repo = suite.repository()
    misses = [0] * suite.workers

    def worker(i: int) -> list[tuple[int, int]]:
        name, claims = f"cas-{i}", []  # type: str, list[tuple[int, int]]
        while True:
            candidates = repo.find_dispatchable(limit=suite.batch_size)
            if not candidates:
                return claims
            for event in candidates:
                if repo.mark_processing(event.id, name):
                    claims.append((event.id, event.attempt_count + 1))
                    suite.publish(name, [(event.id, event.attempt_count + 1)])
                    repo.mark_published(event.id, name)
                else:
                    misses[i] += 1

    suite.progress("cas: racing")
    results, errors = workers.run(suite.workers, worker)
    claims = [c for r in results if r for c in r]
    suite.check_common(result, ids, claims, errors)
    suite.expect_statuses(result, {"published": len(ids)})
    suite.expect_attempts(result, "status = 'published'", 1, len(ids))
    result.cas_misses = sum(misses)


@scenario("crash")
def _crash(suite: ContentionSuite, result: Result, workers: _Workers) -> None:
    """A quarter of the workers die holding claims; survivors release them and finish."""
    ids = suite.seed(suite.events)
    repo = suite.repository()
    crashed = max(1, suite.workers // 4)
    held: list[list[int]] = [[] for _ in range(suite.workers)]

    def first_round(i: int) -> list[tuple[int, int]]:
        name = f"crash-{i}"
        if i < crashed:  # claims one batch, then vanishes: no publish, no release
            batch = suite.claim(repo, name, workers) or []
            held[i] = [e.id for e in batch]
            return [(e.id, e.attempt_count) for e in batch]
        return suite.batch_worker(repo, workers, name)

    def second_round(i: int) -> list[tuple[int, int]]:
        repo.release_expired_locks(suite.lock_timeout)  # every survivor, racing
        return suite.batch_worker(repo, workers, f"survivor-{i}")

    suite.progress("crash: racing")
    results, errors = workers.run(suite.workers, first_round)
    orphans = sum(len(h) for h in held)
    stuck = suite.query("SELECT COUNT(*) FROM outbox_event WHERE status = 'processing'")[0][0]
    if stuck != orphans:
        result.violations.append(f"{stuck} events in processing, {orphans} held by the dead")
    suite.clock.advance(suite.lock_timeout + dt.timedelta(seconds=1))
    suite.progress("crash: survivors release expired claims")
    results2, errors2 = workers.run(suite.workers - crashed, second_round)
    claims = [c for r in results + results2 if r for c in r]
    suite.check_common(result, ids, claims, errors + errors2)
    suite.expect_statuses(result, {"published": len(ids)})
    suite.expect_attempts(result, "status = 'published'", 2, orphans)
    suite.expect_attempts(result, "status = 'published'", 1, len(ids) - orphans)
    released = suite.query("SELECT COUNT(*) FROM outbox_event"
                           " WHERE last_error_code = 'lock_expired'")[0][0]
    if released != orphans:
        result.violations.append(f"{released} claims released, {orphans} orphaned")


def _finish_late(repo: OutboxRepository, event_id: int, name: str) -> int:
    """A stale worker tries every way to finish or keep an event; how many calls were
    accepted."""
    return (repo.extend_locks([event_id], name)
            + repo.mark_published_many([event_id], name)
            + repo.mark_published(event_id, name)
            + repo.mark_failed(event_id, name, "late", "late"))


@scenario("fencing")
def _fencing(suite: ContentionSuite, result: Result, workers: _Workers) -> None:
    """Stale workers whose claims were taken over try to renew, publish or fail them."""
    ids = suite.seed(suite.events)
    repo = suite.repository()
    stale: list[list[int]] = [[] for _ in range(suite.workers)]

    def claim_and_stall(i: int) -> list[tuple[int, int]]:
        claims: list[tuple[int, int]] = []
        while True:
            batch = suite.claim(repo, f"stale-{i}", workers)
            if batch == []:
                return claims
            for event in batch or []:
                stale[i].append(event.id)
                claims.append((event.id, event.attempt_count))

    suite.progress("fencing: stale workers claim everything")
    results, errors = workers.run(suite.workers, claim_and_stall)
    suite.clock.advance(suite.lock_timeout + dt.timedelta(seconds=1))
    released = repo.release_expired_locks(suite.lock_timeout)  # the take-over
    if released != len(ids):
        result.violations.append(f"released {released} expired claims of {len(ids)}")
    # First a take-over without timing luck: a fresh worker holds a batch while the
    # stale owners of those events try to finish them.
    owner = {event_id: n for n, held in enumerate(stale) for event_id in held}
    probe = suite.claim(repo, "fresh-probe", workers) or []
    late = 0
    for event in probe:
        late += _finish_late(repo, event.id, f"stale-{owner[event.id]}")
    still_held = suite.query("SELECT COUNT(*) FROM outbox_event WHERE status = 'processing'"
                             " AND locked_by = 'fresh-probe'")[0][0]
    if still_held != len(probe):
        result.violations.append(
            f"stale calls changed {len(probe) - still_held} events another worker held")
    suite.publish("fresh-probe", ((e.id, e.attempt_count) for e in probe))
    repo.mark_published_many([e.id for e in probe], "fresh-probe")
    accepted = [late] + [0] * (suite.workers - 1)

    def race(i: int) -> list[tuple[int, int]]:
        half = suite.workers // 2
        if i < half:  # the stale workers wake up and try to finish their old claims
            for n in range(i, suite.workers, half):
                for event_id in stale[n]:
                    accepted[i] += _finish_late(repo, event_id, f"stale-{n}")
            return []
        return suite.batch_worker(repo, workers, f"fresh-{i}", many=i % 2 == 1)

    suite.progress("fencing: fresh workers take over while the stale ones wake up")
    results2, errors2 = workers.run(suite.workers, race)
    claims = [c for r in results + results2 if r for c in r]
    claims += [(e.id, e.attempt_count) for e in probe]
    suite.check_common(result, ids, claims, errors + errors2)
    if sum(accepted):
        result.violations.append(f"{sum(accepted)} stale calls were accepted")
    suite.expect_statuses(result, {"published": len(ids)})
    suite.expect_attempts(result, "status = 'published'", 2, len(ids))
    stale_sink = suite.query("SELECT COUNT(*) FROM contention_sink"
                             " WHERE worker LIKE 'stale-%%'")[0][0]
    if stale_sink:
        result.violations.append(f"{stale_sink} publishes by stale workers")


@scenario("retry")
def _retry(suite: ContentionSuite, result: Result, workers: _Workers) -> None:
    """Retryable failures back off and retry; exhausted ones dead-letter."""
    ids = suite.seed(suite.events)
    repo = suite.repository()
    # Every 5th event always fails: dead letter after max_attempts. Every 5th + 1 fails
    # its first attempts and succeeds on the last allowed one. The rest succeed at once.
    doomed = {i for i in ids if i % 5 == 0}
    late = {i for i in ids if i % 5 == 1}

    def fail(event_id: int, attempt: int) -> bool:
        return event_id in doomed or (event_id in late and attempt < suite.max_attempts)

    suite.progress("retry: racing")
    results, errors = workers.run(
        suite.workers, lambda i: suite.batch_worker(repo, workers, f"retry-{i}", fail))
    claims = [c for r in results if r for c in r]
    suite.check_common(result, ids, claims, errors)
    suite.expect_statuses(result, {"published": len(ids) - len(doomed), "failed": len(doomed)})
    suite.expect_attempts(result, "status = 'failed'", suite.max_attempts, len(doomed))
    suite.expect_attempts(result, "status = 'published' AND MOD(id, 5) = 1", suite.max_attempts,
                          len(late))
    suite.expect_attempts(result, "status = 'published' AND MOD(id, 5) > 1", 1,
                          len(ids) - len(doomed) - len(late))
    wrong_code = suite.query("SELECT COUNT(*) FROM outbox_event WHERE status = 'failed'"
                             " AND last_error_code <> 'publish_failed'")[0][0]
    if wrong_code:
        result.violations.append(f"{wrong_code} dead letters with the wrong error code")


@scenario("dedupe")
def _dedupe(suite: ContentionSuite, result: Result, workers: _Workers) -> None:
    """Every worker inserts the same keys together with a business row."""
    repo = suite.repository()
    keys = [f"order-{n}" for n in range(max(1, suite.events // suite.workers))]
    outcomes = [[0, 0] for _ in range(suite.workers)]  # [inserted, duplicate]

    def worker(i: int) -> None:
        order = keys[i % len(keys):] + keys[:i % len(keys)]  # start at different keys
        for key in order:
            while True:
                try:
                    with suite.database.atomic():
                        suite.database.execute_sql(
                            "INSERT INTO contention_job (dedupe_key) VALUES (%s)", (key,))
                        repo.create_in_transaction(
                            event_type="order.placed", aggregate_type="order",
                            aggregate_id=key, payload={"key": key}, dedupe_key=key)
                    outcomes[i][0] += 1
                except DuplicateEventError:
                    outcomes[i][1] += 1
                except LockConflictError:
                    workers.count_conflict()
                    continue
                break

    suite.progress("dedupe: racing")
    _, errors = workers.run(suite.workers, worker)
    v = result.violations
    v += [f"worker raised {type(e).__name__}: {e}" for e in errors[:3]]
    inserted = sum(o[0] for o in outcomes)
    duplicates = sum(o[1] for o in outcomes)
    rows = suite.query("SELECT dedupe_key, COUNT(*) FROM outbox_event GROUP BY dedupe_key")
    if sorted(k for k, _ in rows) != sorted(keys) or any(n != 1 for _, n in rows):
        v.append(f"{len(rows)} distinct keys stored for {len(keys)} raced keys")
    jobs = suite.query("SELECT COUNT(*), COUNT(DISTINCT dedupe_key) FROM contention_job")[0]
    if tuple(jobs) != (len(keys), len(keys)):
        v.append(f"business rows {tuple(jobs)} do not match one per key ({len(keys)})")
    if inserted != len(keys) or duplicates != len(keys) * (suite.workers - 1):
        v.append(f"{inserted} inserts and {duplicates} DuplicateEventErrors for "
                 f"{len(keys)} keys x {suite.workers} workers")
    result.events = len(keys) * suite.workers
    result.claims = inserted


@scenario("ordered")
def _ordered(suite: ContentionSuite, result: Result, workers: _Workers) -> None:
    """Ordered claims over many aggregates, two of them hot, a few poisoned: each aggregate
    is published in id order with one event in flight at a time, a dead letter stops its
    own aggregate only, and every other aggregate completes."""
    hot = max(1, suite.events // 20)  # two hot aggregates with a tenth of the events
    plan = [f"hot-{n % 2}" for n in range(2 * hot)]
    plan += [f"agg-{n // 10}" for n in range(suite.events - len(plan))]  # ten per aggregate
    ids, aggregate_of = _seed_interleaved(suite, plan)
    # The 4th event of every 45th ten-event aggregate always fails: a dead letter after
    # max_attempts (its retries wait in backoff, which must hold back the aggregate too).
    position: dict[int, int] = {}
    seen: dict[str, int] = {}
    for event_id in ids:
        agg = aggregate_of[event_id]
        position[event_id] = seen[agg] = seen.get(agg, 0) + 1
    poisoned = {i for i in ids if position[i] == 4 and aggregate_of[i].startswith("agg-")
                and int(aggregate_of[i][4:]) % 45 == 7}
    repo = suite.repository()
    overlaps = [0] * suite.workers
    last_claim = [time.monotonic()]

    def worker(i: int) -> list[tuple[int, int]]:
        name, claims = f"ordered-{i}", []  # type: str, list[tuple[int, int]]
        pause = 0.0
        while True:
            batch = suite.claim(repo, name, workers, ordered=True)
            if batch is None:
                continue
            if not batch:
                if suite.unblocked_left() == 0 or workers.failed.is_set() \
                        or time.monotonic() - last_claim[0] > _STALLED:
                    return claims  # done, or a broken claim left work no one can take
                # Heads in flight elsewhere or retries backing off: poll as a relay does,
                # with a growing pause, not in a loop that would load the server for nothing.
                pause = min(0.05, pause * 2 or 0.002)
                time.sleep(pause)
                continue
            pause = 0.0
            last_claim[0] = time.monotonic()
            claims += [(e.id, e.attempt_count) for e in batch]
            overlaps[i] += suite.enter_flight(batch, workers)
            good = [e.id for e in batch if e.id not in poisoned]
            suite.publish(name, ((e.id, e.attempt_count) for e in batch if e.id in good))
            while True:
                try:
                    with suite.database.atomic():  # out of flight with the outcome's commit
                        repo.mark_published_many(good, name)
                        for event in batch:
                            if event.id in poisoned:
                                repo.mark_failed(event.id, name, "publish_failed", "poison")
                        suite.leave_flight(batch)
                    break
                except LockConflictError:  # rolled back whole: record it all again
                    workers.count_conflict()

    suite.progress(f"ordered: racing over {len(set(plan))} aggregates")
    results, errors = workers.run(suite.workers, worker)
    claims = [c for r in results if r for c in r]
    suite.check_common(result, ids, claims, errors)
    v = result.violations
    if sum(overlaps):
        v.append(f"{sum(overlaps)} claims found their aggregate already in flight")
    sink = suite.query("SELECT s.event_id, CONCAT(e.aggregate_type, ':', e.aggregate_id)"
                       " FROM contention_sink s JOIN outbox_event e ON e.id = s.event_id"
                       " ORDER BY s.id")
    last: dict[str, int] = {}
    out_of_order = 0
    for event_id, agg in sink:
        out_of_order += event_id < last.get(agg, 0)
        last[agg] = max(event_id, last.get(agg, 0))
    if out_of_order:
        v.append(f"{out_of_order} events reached the sink before an older one of their"
                 " aggregate")
    behind = {i for i in ids for p in poisoned
              if aggregate_of[i] == aggregate_of[p] and i > p}
    leaked = suite.query(
        "SELECT COUNT(*) FROM outbox_event e JOIN outbox_event f ON f.status = 'failed'"
        " AND f.aggregate_type = e.aggregate_type AND f.aggregate_id = e.aggregate_id"
        " AND f.id < e.id WHERE e.status <> 'pending' OR e.attempt_count > 0")[0][0]
    if leaked:
        v.append(f"{leaked} events behind a dead letter were claimed")
    suite.expect_statuses(result, {"published": len(ids) - len(poisoned) - len(behind),
                                   "failed": len(poisoned), "pending": len(behind)})
    suite.expect_attempts(result, "status = 'failed'", suite.max_attempts, len(poisoned))
    suite.expect_attempts(result, "status = 'published'", 1,
                          len(ids) - len(poisoned) - len(behind))


def _seed_interleaved(suite: ContentionSuite, plan: list[str]) -> tuple[list[int], dict[int, str]]:
    """Create one event per entry of ``plan`` (an aggregate id each), the aggregates'
    events interleaved round-robin as concurrent traffic would write them."""
    queues: dict[str, int] = {}
    for agg in plan:
        queues[agg] = queues.get(agg, 0) + 1
    order: list[str] = []
    while queues:
        for agg in list(queues):
            order.append(agg)
            queues[agg] -= 1
            if not queues[agg]:
                del queues[agg]
    repo = suite.repository()
    ids: list[int] = []
    for start in range(0, len(order), 1000):
        with suite.database.atomic():
            ids += [repo.create_in_transaction(
                event_type="job.step", aggregate_type="job", aggregate_id=agg,
                payload={"n": start + n}).id
                for n, agg in enumerate(order[start:start + 1000])]
    return ids, dict(zip(ids, order))


@scenario("lease")
def _lease(suite: ContentionSuite, result: Result, workers: _Workers) -> None:
    """Slow publishers renew their claims with extend_locks while a releaser keeps running
    release_expired_locks with the suite's lock timeout: no renewed claim is taken over and
    nothing reaches the sink twice. Stalled publishers stop renewing: their claims are taken
    over as before, and their late calls are refused.

    Time moves only when every publisher holding claims has renewed since the last step
    (a step is 0.4 of the lock timeout), so a renewed claim is never older than one step;
    the stalled ones age without bound.
    """
    ids = suite.seed(suite.events)
    repo = suite.repository()
    ticks = _Ticks(suite.clock, suite.lock_timeout * 0.4)
    stalled = max(1, (suite.workers - 1) // 4)
    publishers = suite.workers - 1 - stalled
    if publishers < 1:
        raise ValueError("the lease scenario needs at least 3 workers")
    stalled_held: list[list[int]] = [[] for _ in range(suite.workers)]
    lost = [0] * suite.workers
    late = [0] * suite.workers
    done = threading.Event()
    finished = [0]
    finished_lock = threading.Lock()

    def releaser() -> list[tuple[int, int]]:
        while not done.is_set() and not workers.failed.is_set():
            repo.release_expired_locks(suite.lock_timeout)
            ticks.advance_if_renewed()
        return []

    def stall(i: int) -> list[tuple[int, int]]:
        name = f"stalled-{i}"
        batch = suite.claim(repo, name, workers) or []
        stalled_held[i] = [e.id for e in batch]
        if batch:  # four steps: past the timeout, and a release has run since
            ticks.wait_for(ticks.now() + 4)
            late[i] += _finish_late_many(repo, stalled_held[i], name)
        return [(e.id, e.attempt_count) for e in batch]

    def publish_slowly(i: int) -> list[tuple[int, int]]:
        name, claims = f"slow-{i}", []  # type: str, list[tuple[int, int]]
        try:
            while True:
                ticks.hold(i)  # before claiming: time waits for this publisher from now on
                batch = suite.claim(repo, name, workers)
                if not batch:
                    ticks.release(i)
                    if workers.failed.is_set() or batch == [] and suite.pending_left() == 0 \
                            and not suite.query("SELECT 1 FROM outbox_event"
                                                " WHERE status = 'processing' LIMIT 1"):
                        return claims
                    time.sleep(0.002)  # polling for claims the releaser frees
                    continue
                claims += [(e.id, e.attempt_count) for e in batch]
                held = [e.id for e in batch]
                for _ in range(3):  # a publish that spans three steps of time
                    ticks.wait_for(ticks.renewed(i) + 1)
                    renewed = repo.extend_locks(held, name)
                    lost[i] += len(held) - renewed
                    ticks.renew(i)
                suite.publish(name, ((e.id, e.attempt_count) for e in batch))
                lost[i] += len(held) - repo.mark_published_many(held, name)
                ticks.release(i)
        finally:
            with finished_lock:
                finished[0] += 1
                if finished[0] == publishers:
                    done.set()

    def role(i: int) -> list[tuple[int, int]]:
        if i == 0:
            return releaser()
        if i <= stalled:
            return stall(i)
        return publish_slowly(i)

    suite.progress(f"lease: {publishers} slow publishers renew, {stalled} stall")
    results, errors = workers.run(suite.workers, role)
    claims = [c for r in results if r for c in r]
    suite.check_common(result, ids, claims, errors)
    v = result.violations
    if sum(lost):
        v.append(f"{sum(lost)} renewed claims were taken over")
    if sum(late):
        v.append(f"{sum(late)} stale calls of stalled publishers were accepted")
    orphans = sum(len(h) for h in stalled_held)
    released = suite.query("SELECT COUNT(*) FROM outbox_event"
                           " WHERE last_error_code = 'lock_expired'")[0][0]
    if released != orphans:
        v.append(f"{released} claims released, {orphans} held by stalled publishers")
    suite.expect_statuses(result, {"published": len(ids)})
    suite.expect_attempts(result, "status = 'published'", 2, orphans)
    suite.expect_attempts(result, "status = 'published'", 1, len(ids) - orphans)


def _finish_late_many(repo: OutboxRepository, event_ids: list[int], name: str) -> int:
    """What a stalled publisher tries when it wakes: renew, then record, the whole batch."""
    return repo.extend_locks(event_ids, name) + repo.mark_published_many(event_ids, name)


class _Ticks:
    """The lease scenario's time: the suite clock moves ``step`` at a time, and only once
    every publisher that holds claims has renewed them since the last step."""

    def __init__(self, clock: SuiteClock, step: dt.timedelta) -> None:
        self.clock = clock
        self.step = step
        self._tick = 0
        self._holders: dict[int, int] = {}  # publisher -> the tick it last renewed at
        self._cond = threading.Condition()

    def now(self) -> int:
        with self._cond:
            return self._tick

    def hold(self, worker: int) -> None:
        with self._cond:
            self._holders[worker] = self._tick

    def renew(self, worker: int) -> None:
        with self._cond:
            self._holders[worker] = self._tick
            self._cond.notify_all()

    def renewed(self, worker: int) -> int:
        with self._cond:
            return self._holders[worker]

    def release(self, worker: int) -> None:
        with self._cond:
            self._holders.pop(worker, None)
            self._cond.notify_all()

    def wait_for(self, tick: int) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._tick >= tick, timeout=60):
                raise TimeoutError(f"time stood still at tick {self._tick}")

    def advance_if_renewed(self) -> None:
        with self._cond:
            if all(t == self._tick for t in self._holders.values()):
                self.clock.advance(self.step)
                self._tick += 1
                self._cond.notify_all()
            else:
                self._cond.wait(timeout=0.01)


SCENARIOS = tuple(_REGISTRY)  #: the scenario names, in the order they run


def format_table(results: list[Result]) -> str:
    """The figures as a fixed-width table."""
    header = ("scenario", "workers", "events", "seconds", "claims/s", "CAS misses",
              "lock conflicts", "deadlocks", "lock waits", "invariants")
    rows = [header] + [(
        r.scenario, str(r.workers), str(r.events), f"{r.seconds:.2f}",
        f"{r.claims_per_second:.0f}",
        "-" if r.cas_misses is None else f"{r.cas_misses} ({r.cas_misses / max(r.claims, 1):.2f}/claim)",
        str(r.lock_conflicts), str(r.deadlocks), str(r.lock_waits),
        "ok" if r.ok else "BROKEN") for r in results]
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        lines += [f"  {r.scenario}: {violation}" for violation in r.violations]
    return "\n".join(lines)
