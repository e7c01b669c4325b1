"""The scenarios of SPEC §3 and §4, one function each, registered by name and run in the
order they are defined here. Each seeds the outbox, races the workers and records its figures
and the invariants it broke in the Result."""

from __future__ import annotations

import datetime as dt
import threading
import time

from ..errors import DuplicateEventError, LockConflictError
from ..repository import OutboxRepository
from .suite import STALLED, ContentionSuite, Result, SuiteClock, Workers, scenario


@scenario("batch")
def _batch(suite: ContentionSuite, result: Result, workers: Workers) -> None:
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
def _cas(suite: ContentionSuite, result: Result, workers: Workers) -> None:
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
def _crash(suite: ContentionSuite, result: Result, workers: Workers) -> None:
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
    stuck = suite.count("SELECT COUNT(*) FROM outbox_event WHERE status = 'processing'")
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
    released = suite.count("SELECT COUNT(*) FROM outbox_event"
                           " WHERE last_error_code = 'lock_expired'")
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
def _fencing(suite: ContentionSuite, result: Result, workers: Workers) -> None:
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
    still_held = suite.count("SELECT COUNT(*) FROM outbox_event WHERE status = 'processing'"
                             " AND locked_by = 'fresh-probe'")
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
    stale_sink = suite.count("SELECT COUNT(*) FROM contention_sink"
                             " WHERE worker LIKE 'stale-%%'")
    if stale_sink:
        result.violations.append(f"{stale_sink} publishes by stale workers")


@scenario("retry")
def _retry(suite: ContentionSuite, result: Result, workers: Workers) -> None:
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
    wrong_code = suite.count("SELECT COUNT(*) FROM outbox_event WHERE status = 'failed'"
                             " AND last_error_code <> 'publish_failed'")
    if wrong_code:
        result.violations.append(f"{wrong_code} dead letters with the wrong error code")


@scenario("dedupe")
def _dedupe(suite: ContentionSuite, result: Result, workers: Workers) -> None:
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
                        suite.add_job(key)
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
def _ordered(suite: ContentionSuite, result: Result, workers: Workers) -> None:
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
                        or time.monotonic() - last_claim[0] > STALLED:
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
    leaked = suite.count(
        "SELECT COUNT(*) FROM outbox_event e JOIN outbox_event f ON f.status = 'failed'"
        " AND f.aggregate_type = e.aggregate_type AND f.aggregate_id = e.aggregate_id"
        " AND f.id < e.id WHERE e.status <> 'pending' OR e.attempt_count > 0")
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
def _lease(suite: ContentionSuite, result: Result, workers: Workers) -> None:
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
    released = suite.count("SELECT COUNT(*) FROM outbox_event"
                           " WHERE last_error_code = 'lock_expired'")
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
