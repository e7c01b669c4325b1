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

from . import migrate as schema
from ._db import DatabaseUrl
from .backoff import Backoff
from .errors import DuplicateEventError, LockConflictError
from .repository import OutboxRepository

SCENARIOS = ("batch", "cas", "crash", "fencing", "retry", "dedupe")

_SINK = ("CREATE TABLE contention_sink (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
         " event_id BIGINT NOT NULL, worker VARCHAR(64) NOT NULL, attempt INT NOT NULL,"
         " KEY ix_sink_event (event_id)) ENGINE=InnoDB")
_PROGRESS_EVERY = 5.0  # seconds between progress lines during a long race
_JOBS = ("CREATE TABLE contention_job (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
         " dedupe_key VARCHAR(64) NOT NULL) ENGINE=InnoDB")


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
    deadlocks: int = 0  # Innodb_deadlocks during the scenario
    lock_waits: int = 0  # Innodb_row_lock_waits during the scenario
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


class ContentionSuite:
    """The scenarios of SPEC §3 against a database created for the run.

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

    def _repository(self, max_attempts: int | None = None) -> OutboxRepository:
        # Retries in real milliseconds, so the retry scenario never waits on a backoff.
        return self.factory(self.database, clock=self.clock,
                            max_attempts=max_attempts or self.max_attempts,
                            backoff=Backoff(base=0.001, factor=2, cap=0.004, jitter=0.5))

    # -- the run ------------------------------------------------------------------------

    def run(self, scenarios: Iterable[str] = SCENARIOS) -> list[Result]:
        """Run the scenarios in order on a fresh database; returns one Result each."""
        scenarios = list(scenarios)
        unknown = sorted(set(scenarios) - set(SCENARIOS))
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
            self.database.execute_sql(_SINK)
            self.database.execute_sql(_JOBS)
            results = []
            for name in scenarios:
                self._reset()
                self.progress(f"{name}: seeding")
                results.append(self._measured(name, getattr(self, f"_scenario_{name}")))
            return results
        finally:
            self.database.close()
            if not self.keep:
                self.url.drop_database()

    def _reset(self) -> None:
        for table in ("outbox_event", "contention_sink", "contention_job"):
            self.database.execute_sql(f"TRUNCATE TABLE {table}")

    def _server_counters(self) -> dict[str, int]:
        rows = self.database.execute_sql(
            "SHOW GLOBAL STATUS WHERE Variable_name IN"
            " ('Innodb_deadlocks', 'Innodb_row_lock_waits')").fetchall()
        return {name: int(value) for name, value in rows}

    def _measured(self, name: str, scenario: Callable[[Result, _Workers], None]) -> Result:
        result = Result(scenario=name, workers=self.workers, events=self.events, seconds=0.0,
                        claims=0)
        monitor = self.url.database()

        def report(seconds: float) -> None:
            rows = monitor.execute_sql(
                "SELECT status, COUNT(*) FROM outbox_event GROUP BY status").fetchall()
            self.progress(f"{name}: {seconds:.0f} s in, "
                          + ", ".join(f"{count} {status}" for status, count in sorted(rows)))

        workers = _Workers(self.database, report)
        before = self._server_counters()
        scenario(result, workers)
        result.seconds = workers.seconds
        after = self._server_counters()
        result.deadlocks = after["Innodb_deadlocks"] - before["Innodb_deadlocks"]
        result.lock_waits = after["Innodb_row_lock_waits"] - before["Innodb_row_lock_waits"]
        result.lock_conflicts = workers.lock_conflicts
        monitor.close()
        self.progress(f"{name}: {'ok' if result.ok else 'INVARIANT BROKEN'}"
                      f" in {result.seconds:.2f} s")
        return result

    # -- helpers ------------------------------------------------------------------------

    def _seed(self, count: int) -> list[int]:
        repo = self._repository()
        ids: list[int] = []
        for start in range(0, count, 1000):
            with self.database.atomic():
                ids += [repo.create_in_transaction(
                    event_type="job.created", aggregate_type="contention",
                    aggregate_id=str(n), payload={"n": n}).id
                    for n in range(start, min(count, start + 1000))]
        return ids

    def _query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return list(self.database.execute_sql(sql, params).fetchall())

    def _publish(self, worker: str, events: Iterable[tuple[int, int]]) -> None:
        """The "broker": one sink row per (event id, attempt) published."""
        rows = list(events)
        if rows:
            self.database.execute_sql(
                "INSERT INTO contention_sink (event_id, worker, attempt) VALUES "
                + ", ".join(["(%s, %s, %s)"] * len(rows)),
                [value for event_id, attempt in rows for value in (event_id, worker, attempt)])

    def _pending_left(self) -> int:
        return self._query("SELECT COUNT(*) FROM outbox_event WHERE status = 'pending'")[0][0]

    def _claim(self, repo: OutboxRepository, worker: str, workers: _Workers) -> list[Any] | None:
        """One claim transaction; None after a lock conflict (the caller just retries)."""
        try:
            with self.database.atomic():
                return repo.claim_batch(worker, limit=self.batch_size)
        except LockConflictError:
            workers.count_conflict()
            return None

    def _batch_worker(self, repo: OutboxRepository, workers: _Workers, name: str,
                      fail: Callable[[int, int], bool] | None = None,
                      many: bool = False) -> list[tuple[int, int]]:
        """The documented worker loop; returns the (event id, attempt) pairs it claimed.
        With ``many`` it records each batch's publishes with one mark_published_many."""
        claims: list[tuple[int, int]] = []
        while True:
            batch = self._claim(repo, name, workers)
            if batch is None:
                continue
            if not batch:
                if self._pending_left() == 0:
                    return claims
                time.sleep(0.002)  # retries wait out a millisecond backoff
                continue
            claims += [(e.id, e.attempt_count) for e in batch]
            good = {e.id for e in batch if not (fail and fail(e.id, e.attempt_count))}
            self._publish(name, ((e.id, e.attempt_count) for e in batch if e.id in good))
            if many:
                repo.mark_published_many(good, name)
            for event in batch:
                if event.id not in good:
                    repo.mark_failed(event.id, name, "publish_failed", "broker said no")
                elif not many:
                    repo.mark_published(event.id, name)

    # -- invariants ---------------------------------------------------------------------

    def _check_common(self, result: Result, ids: list[int], claims: list[tuple[int, int]],
                      errors: list[BaseException]) -> None:
        v = result.violations
        for exc in errors[:3]:
            v.append(f"worker raised {type(exc).__name__}: {exc}")
        if len(errors) > 3:
            v.append(f"... and {len(errors) - 3} more worker errors")
        rows = self._query("SELECT id FROM outbox_event ORDER BY id")
        if [r[0] for r in rows] != ids:
            v.append(f"rows lost or invented: {len(rows)} in the table, {len(ids)} seeded")
        twice = len(claims) - len(set(claims))
        if twice:
            v.append(f"{twice} claims handed an event to two workers at once")
        leaked = self._query("SELECT COUNT(*) FROM outbox_event WHERE status <> 'processing'"
                             " AND (locked_by IS NOT NULL OR locked_at IS NOT NULL)")[0][0]
        if leaked:
            v.append(f"{leaked} finished events still carry a lock")
        dupes = self._query("SELECT COUNT(*) FROM (SELECT event_id FROM contention_sink"
                            " GROUP BY event_id HAVING COUNT(*) > 1) d")[0][0]
        if dupes:
            v.append(f"{dupes} events were published more than once")
        unpublished = self._query(
            "SELECT COUNT(*) FROM outbox_event e WHERE (e.status = 'published') <>"
            " EXISTS (SELECT 1 FROM contention_sink s WHERE s.event_id = e.id)")[0][0]
        if unpublished:
            v.append(f"{unpublished} events disagree between their status and the sink")
        result.claims = len(claims)

    def _expect_statuses(self, result: Result, expected: dict[str, int]) -> None:
        actual = dict(self._query("SELECT status, COUNT(*) FROM outbox_event GROUP BY status"))
        if {k: n for k, n in actual.items() if n} != {k: n for k, n in expected.items() if n}:
            result.violations.append(f"statuses {actual}, expected {expected}")

    def _expect_attempts(self, result: Result, where: str, attempts: int, count: int) -> None:
        found = self._query(f"SELECT COUNT(*) FROM outbox_event WHERE {where}"
                            " AND attempt_count = %s", attempts)[0][0]
        if found != count:
            result.violations.append(
                f"{found} events where {where} have attempt_count {attempts}, expected {count}")

    # -- scenarios ----------------------------------------------------------------------

    def _scenario_batch(self, result: Result, workers: _Workers) -> None:
        ids = self._seed(self.events)
        repo = self._repository()
        self.progress("batch: racing")
        results, errors = workers.run(  # odd workers record each batch at once
            self.workers, lambda i: self._batch_worker(repo, workers, f"batch-{i}",
                                                       many=i % 2 == 1))
        claims = [c for r in results if r for c in r]
        self._check_common(result, ids, claims, errors)
        self._expect_statuses(result, {"published": len(ids)})
        self._expect_attempts(result, "status = 'published'", 1, len(ids))

    def _scenario_cas(self, result: Result, workers: _Workers) -> None:
        ids = self._seed(self.events)
        repo = self._repository()
        misses = [0] * self.workers

        def worker(i: int) -> list[tuple[int, int]]:
            name, claims = f"cas-{i}", []  # type: str, list[tuple[int, int]]
            while True:
                candidates = repo.find_dispatchable(limit=self.batch_size)
                if not candidates:
                    return claims
                for event in candidates:
                    if repo.mark_processing(event.id, name):
                        claims.append((event.id, event.attempt_count + 1))
                        self._publish(name, [(event.id, event.attempt_count + 1)])
                        repo.mark_published(event.id, name)
                    else:
                        misses[i] += 1

        self.progress("cas: racing")
        results, errors = workers.run(self.workers, worker)
        claims = [c for r in results if r for c in r]
        self._check_common(result, ids, claims, errors)
        self._expect_statuses(result, {"published": len(ids)})
        self._expect_attempts(result, "status = 'published'", 1, len(ids))
        result.cas_misses = sum(misses)

    def _scenario_crash(self, result: Result, workers: _Workers) -> None:
        ids = self._seed(self.events)
        repo = self._repository()
        crashed = max(1, self.workers // 4)
        held: list[list[int]] = [[] for _ in range(self.workers)]

        def first_round(i: int) -> list[tuple[int, int]]:
            name = f"crash-{i}"
            if i < crashed:  # claims one batch, then vanishes: no publish, no release
                batch = self._claim(repo, name, workers) or []
                held[i] = [e.id for e in batch]
                return [(e.id, e.attempt_count) for e in batch]
            return self._batch_worker(repo, workers, name)

        def second_round(i: int) -> list[tuple[int, int]]:
            repo.release_expired_locks(self.lock_timeout)  # every survivor, racing
            return self._batch_worker(repo, workers, f"survivor-{i}")

        self.progress("crash: racing")
        results, errors = workers.run(self.workers, first_round)
        orphans = sum(len(h) for h in held)
        stuck = self._query("SELECT COUNT(*) FROM outbox_event WHERE status = 'processing'")[0][0]
        if stuck != orphans:
            result.violations.append(f"{stuck} events in processing, {orphans} held by the dead")
        self.clock.advance(self.lock_timeout + dt.timedelta(seconds=1))
        self.progress("crash: survivors release expired claims")
        results2, errors2 = workers.run(self.workers - crashed, second_round)
        claims = [c for r in results + results2 if r for c in r]
        self._check_common(result, ids, claims, errors + errors2)
        self._expect_statuses(result, {"published": len(ids)})
        self._expect_attempts(result, "status = 'published'", 2, orphans)
        self._expect_attempts(result, "status = 'published'", 1, len(ids) - orphans)
        released = self._query("SELECT COUNT(*) FROM outbox_event"
                               " WHERE last_error_code = 'lock_expired'")[0][0]
        if released != orphans:
            result.violations.append(f"{released} claims released, {orphans} orphaned")

    @staticmethod
    def _finish_late(repo: OutboxRepository, event_id: int, name: str) -> int:
        """A stale worker tries every way to finish an event; how many calls were accepted."""
        return (repo.mark_published_many([event_id], name)
                + repo.mark_published(event_id, name)
                + repo.mark_failed(event_id, name, "late", "late"))

    def _scenario_fencing(self, result: Result, workers: _Workers) -> None:
        ids = self._seed(self.events)
        repo = self._repository()
        stale: list[list[int]] = [[] for _ in range(self.workers)]

        def claim_and_stall(i: int) -> list[tuple[int, int]]:
            claims: list[tuple[int, int]] = []
            while True:
                batch = self._claim(repo, f"stale-{i}", workers)
                if batch == []:
                    return claims
                for event in batch or []:
                    stale[i].append(event.id)
                    claims.append((event.id, event.attempt_count))

        self.progress("fencing: stale workers claim everything")
        results, errors = workers.run(self.workers, claim_and_stall)
        self.clock.advance(self.lock_timeout + dt.timedelta(seconds=1))
        released = repo.release_expired_locks(self.lock_timeout)  # the take-over
        if released != len(ids):
            result.violations.append(f"released {released} expired claims of {len(ids)}")
        # First a take-over without timing luck: a fresh worker holds a batch while the
        # stale owners of those events try to finish them.
        owner = {event_id: n for n, held in enumerate(stale) for event_id in held}
        probe = self._claim(repo, "fresh-probe", workers) or []
        late = 0
        for event in probe:
            late += self._finish_late(repo, event.id, f"stale-{owner[event.id]}")
        still_held = self._query("SELECT COUNT(*) FROM outbox_event WHERE status = 'processing'"
                                 " AND locked_by = 'fresh-probe'")[0][0]
        if still_held != len(probe):
            result.violations.append(
                f"stale calls changed {len(probe) - still_held} events another worker held")
        self._publish("fresh-probe", ((e.id, e.attempt_count) for e in probe))
        repo.mark_published_many([e.id for e in probe], "fresh-probe")
        accepted = [late] + [0] * (self.workers - 1)

        def race(i: int) -> list[tuple[int, int]]:
            half = self.workers // 2
            if i < half:  # the stale workers wake up and try to finish their old claims
                for n in range(i, self.workers, half):
                    for event_id in stale[n]:
                        accepted[i] += self._finish_late(repo, event_id, f"stale-{n}")
                return []
            return self._batch_worker(repo, workers, f"fresh-{i}", many=i % 2 == 1)

        self.progress("fencing: fresh workers take over while the stale ones wake up")
        results2, errors2 = workers.run(self.workers, race)
        claims = [c for r in results + results2 if r for c in r]
        claims += [(e.id, e.attempt_count) for e in probe]
        self._check_common(result, ids, claims, errors + errors2)
        if sum(accepted):
            result.violations.append(f"{sum(accepted)} stale calls were accepted")
        self._expect_statuses(result, {"published": len(ids)})
        self._expect_attempts(result, "status = 'published'", 2, len(ids))
        stale_sink = self._query("SELECT COUNT(*) FROM contention_sink"
                                 " WHERE worker LIKE 'stale-%%'")[0][0]
        if stale_sink:
            result.violations.append(f"{stale_sink} publishes by stale workers")

    def _scenario_retry(self, result: Result, workers: _Workers) -> None:
        ids = self._seed(self.events)
        repo = self._repository()
        # Every 5th event always fails: dead letter after max_attempts. Every 5th + 1 fails
        # its first attempts and succeeds on the last allowed one. The rest succeed at once.
        doomed = {i for i in ids if i % 5 == 0}
        late = {i for i in ids if i % 5 == 1}

        def fail(event_id: int, attempt: int) -> bool:
            return event_id in doomed or (event_id in late and attempt < self.max_attempts)

        self.progress("retry: racing")
        results, errors = workers.run(
            self.workers, lambda i: self._batch_worker(repo, workers, f"retry-{i}", fail))
        claims = [c for r in results if r for c in r]
        self._check_common(result, ids, claims, errors)
        self._expect_statuses(result, {"published": len(ids) - len(doomed),
                                       "failed": len(doomed)})
        self._expect_attempts(result, "status = 'failed'", self.max_attempts, len(doomed))
        self._expect_attempts(result, "status = 'published' AND MOD(id, 5) = 1", self.max_attempts,
                              len(late))
        self._expect_attempts(result, "status = 'published' AND MOD(id, 5) > 1", 1,
                              len(ids) - len(doomed) - len(late))
        wrong_code = self._query("SELECT COUNT(*) FROM outbox_event WHERE status = 'failed'"
                                 " AND last_error_code <> 'publish_failed'")[0][0]
        if wrong_code:
            result.violations.append(f"{wrong_code} dead letters with the wrong error code")

    def _scenario_dedupe(self, result: Result, workers: _Workers) -> None:
        repo = self._repository()
        keys = [f"order-{n}" for n in range(max(1, self.events // self.workers))]
        outcomes = [[0, 0] for _ in range(self.workers)]  # [inserted, duplicate]

        def worker(i: int) -> None:
            order = keys[i % len(keys):] + keys[:i % len(keys)]  # start at different keys
            for key in order:
                while True:
                    try:
                        with self.database.atomic():
                            self.database.execute_sql(
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

        self.progress("dedupe: racing")
        _, errors = workers.run(self.workers, worker)
        v = result.violations
        v += [f"worker raised {type(e).__name__}: {e}" for e in errors[:3]]
        inserted = sum(o[0] for o in outcomes)
        duplicates = sum(o[1] for o in outcomes)
        rows = self._query("SELECT dedupe_key, COUNT(*) FROM outbox_event GROUP BY dedupe_key")
        if sorted(k for k, _ in rows) != sorted(keys) or any(n != 1 for _, n in rows):
            v.append(f"{len(rows)} distinct keys stored for {len(keys)} raced keys")
        jobs = self._query("SELECT COUNT(*), COUNT(DISTINCT dedupe_key) FROM contention_job")[0]
        if tuple(jobs) != (len(keys), len(keys)):
            v.append(f"business rows {tuple(jobs)} do not match one per key ({len(keys)})")
        if inserted != len(keys) or duplicates != len(keys) * (self.workers - 1):
            v.append(f"{inserted} inserts and {duplicates} DuplicateEventErrors for "
                     f"{len(keys)} keys x {self.workers} workers")
        result.events = len(keys) * self.workers
        result.claims = inserted


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
