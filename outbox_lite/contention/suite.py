"""The contention suite itself: a fresh database, worker threads released together, the
server's lock counters around each scenario, and the helpers the scenarios share (seeding,
claiming, the sink that stands for the broker, the invariant checks). The scenarios are in
:mod:`.scenarios`, registered by name with :func:`scenario`."""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import peewee as pw

from .. import migrate as schema
from .._clock import server_clock
from .._db import execute
from .._families import family_of
from .._families.contract import LockCounters
from .._families.url import DatabaseUrl
from ..backoff import Backoff
from ..errors import LockConflictError
from ..repository import OutboxRepository

_PROGRESS_EVERY = 5.0  # seconds between progress lines during a long race
STALLED = 10.0  # seconds without a claim anywhere after which polling workers give up


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
    #: Whether ``lock_waits`` are the waits seen by looking at the server's lock table during
    #: the scenario (a server that keeps no count of them: PostgreSQL), not its own counter.
    lock_waits_seen: bool = False
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
    """The database server's time (the library's own clock, :mod:`outbox_lite._clock`) plus
    an offset the suite moves forward to expire claims."""

    def __init__(self, database: pw.Database) -> None:
        self._server = server_clock(database)
        self._offset = dt.timedelta(0)
        self._lock = threading.Lock()

    def __call__(self) -> dt.datetime:
        now = self._server()
        with self._lock:
            return now + self._offset

    def advance(self, delta: dt.timedelta) -> None:
        with self._lock:
            self._offset += delta


class Workers:
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


class _LockWaitLooker:
    """Looks at the server's lock table every few milliseconds on a session of its own,
    from now until :meth:`stop`, and counts the distinct lock waits it saw there: a wait
    shorter than a look's interval may pass unseen, so the count is a lower bound."""

    INTERVAL = 0.005

    def __init__(self, url: DatabaseUrl, waits_now: Callable[[pw.Database], set[Any]]) -> None:
        self._database = url.database()
        self._waits_now = waits_now
        self._seen: set[Any] = set()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._look, name="outbox-lock-waits",
                                        daemon=True)
        self._thread.start()

    def _look(self) -> None:
        try:
            while True:
                self._seen |= self._waits_now(self._database)
                if self._stop.wait(self.INTERVAL):
                    return
        except BaseException as exc:  # noqa: BLE001 - raised by stop(), in the suite's thread
            self._error = exc
        finally:
            self._database.close()

    def stop(self) -> int:
        """Stop looking (the session ends); how many distinct lock waits were seen."""
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return len(self._seen)


#: A scenario seeds the outbox, races the workers and records its figures and violations.
Scenario = Callable[["ContentionSuite", "Result", "Workers"], None]
REGISTRY: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    """Register a scenario under ``name``; the suite runs them in registration order."""
    def register(function: Scenario) -> Scenario:
        REGISTRY[name] = function
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
        self.database: pw.Database = url.database()
        #: The server's family: its statements for the suite's own tables, its counters.
        self.family = family_of(self.database)
        self.clock = SuiteClock(self.database)

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
        scenarios = list(REGISTRY if scenarios is None else scenarios)
        unknown = sorted(set(scenarios) - set(REGISTRY))
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
            for create in self.family.sql.CONTENTION_TABLES.values():
                self.database.execute_sql(create)
            results = []
            for name in scenarios:
                self._reset()
                self.progress(f"{name}: seeding")
                results.append(self._measured(name, REGISTRY[name]))
            return results
        finally:
            self.database.close()
            if not self.keep:
                self.url.drop_database()

    def _reset(self) -> None:
        for empty in self.family.sql.CONTENTION_EMPTY.values():
            self.database.execute_sql(empty)

    def _lock_counters(self) -> LockCounters:
        return self.family.lock_counters(self.database)  # type: ignore[no-any-return]

    def _measured(self, name: str, scenario: Scenario) -> Result:
        result = Result(scenario=name, workers=self.workers, events=self.events, seconds=0.0,
                        claims=0)
        monitor = self.url.database()

        def report(seconds: float) -> None:
            rows = monitor.execute_sql(
                "SELECT status, COUNT(*) FROM outbox_event GROUP BY status").fetchall()
            self.progress(f"{name}: {seconds:.0f} s in, "
                          + ", ".join(f"{count} {status}" for status, count in sorted(rows)))

        workers = Workers(self.database, report)
        before = self._lock_counters()
        # A server that keeps no count of lock waits (PostgreSQL) has them looked at instead.
        looker = _LockWaitLooker(self.url, self.family.lock_waits_now) \
            if hasattr(self.family, "lock_waits_now") else None
        try:
            scenario(self, result, workers)
        finally:
            monitor.close()  # every session but this one ends before the counters are read
            seen = looker.stop() if looker else 0
        result.seconds = workers.seconds
        result.deadlocks, result.lock_waits = self._lock_counters() - before
        if looker:
            result.lock_waits, result.lock_waits_seen = result.lock_waits + seen, True
        result.lock_conflicts = workers.lock_conflicts
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

    def count(self, sql: str, *params: Any) -> int:
        """The one number a counting query (``SELECT COUNT(…) …``) answers."""
        return int(self.query(sql, *params)[0][0])

    def publish(self, worker: str, events: Iterable[tuple[int, int]]) -> None:
        """The "broker": one sink row per (event id, attempt) published."""
        rows = list(events)
        if rows:
            values: dict[str, Any] = {"worker": worker}
            for n, (event_id, attempt) in enumerate(rows):
                values[f"event_id_{n}"], values[f"attempt_{n}"] = event_id, attempt
            sink = self.family.sql.contention_sink(len(rows))
            self.database.execute_sql(sink, sink.params(values))

    def add_job(self, key: str) -> None:
        """The service's own business row of the dedupe scenario, in the caller's
        transaction."""
        job = self.family.sql.CONTENTION_JOB
        self.database.execute_sql(job, job.params({"key": key}))

    def pending_left(self) -> int:
        return self.count("SELECT COUNT(*) FROM outbox_event WHERE status = 'pending'")

    def unblocked_left(self) -> int:
        """Pending or processing events not behind a dead letter of their aggregate."""
        left = self.count("SELECT COUNT(*) FROM outbox_event"
                          " WHERE status IN ('pending', 'processing')")
        return left - self.count(self.family.sql.HELD_BACK) if left else 0

    def enter_flight(self, batch: list[Any], workers: Workers) -> int:
        """Mark the batch's aggregates in flight; returns how many already were.

        In key order, so two batches that share aggregates (only a broken claim makes them)
        lock them in the same order; a lock conflict all the same is counted and retried."""
        rows = sorted((f"{e.aggregate_type}:{e.aggregate_id}", e.id) for e in batch)
        values: dict[str, Any] = {}
        for n, (aggregate, event_id) in enumerate(rows):
            values[f"aggregate_{n}"], values[f"event_id_{n}"] = aggregate, event_id
        statement = self.family.sql.contention_enter_flight(len(rows))
        while True:
            try:
                inserted = execute(self.database, statement, statement.params(values)).rowcount
                return len(rows) - inserted
            except LockConflictError:
                workers.count_conflict()

    def leave_flight(self, batch: list[Any]) -> None:
        """The batch's aggregates are out of flight (by primary key: no scan, no gap locks).
        Inside the caller's transaction; a lock conflict is a LockConflictError."""
        statement = self.family.sql.CONTENTION_LEAVE_FLIGHT
        execute(self.database, *statement.bind({
            "aggregates": self.family.id_list([f"{e.aggregate_type}:{e.aggregate_id}"
                                               for e in batch]),
            "ids": self.family.id_list([e.id for e in batch])}))

    def claim(self, repo: OutboxRepository, worker: str, workers: Workers,
              ordered: bool = False) -> list[Any] | None:
        """One claim transaction; None after a lock conflict (the caller just retries)."""
        try:
            with self.database.atomic():
                return repo.claim_batch(worker, limit=self.batch_size, ordered=ordered)
        except LockConflictError:
            workers.count_conflict()
            return None

    def batch_worker(self, repo: OutboxRepository, workers: Workers, name: str,
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
        leaked = self.count("SELECT COUNT(*) FROM outbox_event WHERE status <> 'processing'"
                            " AND (locked_by IS NOT NULL OR locked_at IS NOT NULL)")
        if leaked:
            v.append(f"{leaked} finished events still carry a lock")
        dupes = self.count("SELECT COUNT(*) FROM (SELECT event_id FROM contention_sink"
                           " GROUP BY event_id HAVING COUNT(*) > 1) d")
        if dupes:
            v.append(f"{dupes} events were published more than once")
        unpublished = self.count(
            "SELECT COUNT(*) FROM outbox_event e WHERE (e.status = 'published') <>"
            " EXISTS (SELECT 1 FROM contention_sink s WHERE s.event_id = e.id)")
        if unpublished:
            v.append(f"{unpublished} events disagree between their status and the sink")
        result.claims = len(claims)

    def expect_statuses(self, result: Result, expected: dict[str, int]) -> None:
        actual = dict(self.query("SELECT status, COUNT(*) FROM outbox_event GROUP BY status"))
        if {k: n for k, n in actual.items() if n} != {k: n for k, n in expected.items() if n}:
            result.violations.append(f"statuses {actual}, expected {expected}")

    def expect_attempts(self, result: Result, where: str, attempts: int, count: int) -> None:
        found = self.count(f"SELECT COUNT(*) FROM outbox_event WHERE {where}"
                           " AND attempt_count = %s", attempts)
        if found != count:
            result.violations.append(
                f"{found} events where {where} have attempt_count {attempts}, expected {count}")


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
    if any(r.lock_waits_seen for r in results):
        lines.append("lock waits: the server keeps no count of them; the suite counted the"
                     " distinct waits it saw in the server's lock table, looking every"
                     f" {_LockWaitLooker.INTERVAL * 1000:.0f} ms (a lower bound)")
    for r in results:
        lines += [f"  {r.scenario}: {violation}" for violation in r.violations]
    return "\n".join(lines)
