"""The relay against BullMQ's own limit and a raw twin, side by side in one run.

Throughput (``--only relay``): ``--workers`` fresh processes drain ``--events`` events in
batches of ``--batch``, start-up counted (from the first spawn to the last exit), three ways
that take turns round by round:

* ``addBulk``: fresh processes add the same jobs (names, data, ids, job options) with
  ``Queue.addBulk``, no database: BullMQ's own limit here;
* ``relay``: fresh ``outbox-lite relay --until-empty`` processes;
* ``twin``: fresh processes of a raw twin, PyMySQL and the same ``bullmq`` calls without
  outbox_lite (the library's claim protocol written out, the same idle pause): the library's
  own overhead is relay / twin.

Each side is checked: one waiting job per event, every event published. The relays' time
split (claim, publish, record, idle) comes from their last progress line.

Latency (``--only latency``): one relay at the default settings while a writer commits
``--rate`` business transactions a second (each given rate in turn), each with one event,
through the repository; the time from each COMMIT to its job's ``added`` entry in the queue's
event stream (whose id is the Redis server's clock), p50 and p99. Then the relay alone on an
empty outbox: the queries a second it sends (counted by a proxy in front of the server, so
other clients of a shared server do not count). Each ``--wake`` (none, in-process, redis,
nats, or all) is measured in turn and printed side by side.

On PostgreSQL (a ``postgresql://`` URL) the twin is psycopg 3 with the PostgreSQL family's
statements (raw_pg.py); the relay LISTENs by itself, so the latency's wake-ups
are ``listen`` (the relay as it ships: LISTEN outbox_event, polling every 2 s at most) and
``none`` (polling alone: the same relay with its LISTEN turned off, a 50 ms cap); the proxy
counts the PostgreSQL protocol's queries (Query and Execute messages) instead of MySQL's.
Give ``--database-url`` more than once and each measure runs on each server in turn, with the
load average beside each figure.

Usage: python scripts/bench.py relay [--database-url URL ...] [--redis-url URL] [--rounds 3]
       [--events 20000] [--batch 100] [--workers 4] [--rate 200 ...] [--seconds 20]
       [--idle-seconds 10] [--wake none|listen|in-process|redis|nats|all ...] [--nats-url URL]
       [--json]
Also run by ``python scripts/bench.py protocol --only relay --only relay-latency``; the
PostgreSQL figures of issue 22 by ``python scripts/bench.py drain`` and ``… listen``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from . import raw_mysql  # the library's SQL without the library
from ._proxies import CountingProxy
from ._setup import (PAYLOAD, add_database_option, add_sizes, is_postgresql, job_table, scratch_database,
                     server_name, server_url, utcnow)

#: The benchmarks' entry point, which the fresh processes run (``bench.py relay _twin …``).
ENTRY = Path(__file__).resolve().parent.parent / "bench.py"
ROOT = ENTRY.parent.parent
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: The publisher's default job options (retention), spelled out so the baseline and the twin
#: need not import outbox_lite; checked against the publisher's in ``compare``.
JOB_OPTIONS = {"removeOnComplete": {"age": 86400}, "removeOnFail": {"age": 604800}}
_ROW = {name: n for n, name in enumerate(raw_mysql.COLUMNS)}
_PROGRESS = re.compile(r"seconds in claim ([\d.]+), publish ([\d.]+), record ([\d.]+),"
                       r" idle ([\d.]+)")


def _job_id(dedupe_key: str) -> str:
    return "outbox-" + quote(dedupe_key, safe="-._~")


# ---------------------------------------------------------------------------
# The fresh processes' bodies (``python bench.py relay _addbulk|_twin …``): they import
# nothing of outbox_lite, so their start-up is BullMQ's (and PyMySQL's) alone.
# ---------------------------------------------------------------------------

def _addbulk_main(redis_url: str, queue: str, first: int, count: int, batch: int,
                  run: str) -> None:
    from bullmq import Queue

    jobs = [{"name": "job.created", "data": {**PAYLOAD, "job_id": n},
             "opts": {"jobId": _job_id(f"{run}-{n}")}} for n in range(first, first + count)]

    async def main() -> None:
        q = Queue(queue, {"connection": redis_url, "defaultJobOptions": JOB_OPTIONS})
        for i in range(0, len(jobs), batch):
            await q.addBulk(jobs[i:i + batch])
        await q.close()

    asyncio.run(main())


def _twin_main(db: dict[str, Any], redis_url: str, queue: str, batch: int,
               worker: str) -> None:
    """The relay's work without outbox_lite: the library's claim (raw_mysql.claim, or
    raw_pg.claim on PostgreSQL) in a transaction that first records the previous batch
    (one UPDATE), then addBulk; the relay's default idle pause (10 ms doubling to 50 ms) and
    its exit rule (nothing pending or processing)."""
    from bullmq import Queue

    pg = db.pop("scheme", "mysql") == "postgresql"
    raw: Any
    conn: Any
    if pg:
        import psycopg

        from . import raw_pg

        raw = raw_pg
        conn = psycopg.connect(host=db["host"], port=db["port"], user=db["user"],
                               password=db["password"] or None, dbname=db["database"],
                               autocommit=True)
        begin, commit = (lambda: conn.execute("BEGIN")), (lambda: conn.execute("COMMIT"))
        remaining = ("SELECT COUNT(*) FROM outbox_event WHERE status IN"
                     " ('pending', 'processing')")
    else:
        import pymysql

        raw = raw_mysql
        conn = pymysql.connect(autocommit=True, charset="utf8mb4", **db)
        begin, commit = conn.begin, conn.commit
        remaining = ("SELECT COUNT(*) FROM outbox_event FORCE INDEX"
                     " (ix_outbox_event_status_available_at) WHERE status IN"
                     " ('pending', 'processing')")
    cur = conn.cursor()

    def claim(published: list[int]) -> list[tuple[Any, ...]]:
        begin()
        if published:
            raw.publish_many(cur, published, worker)
        rows = raw.claim(cur, worker, batch)
        commit()
        return rows

    async def main() -> None:
        q = Queue(queue, {"connection": redis_url, "defaultJobOptions": JOB_OPTIONS})
        pause = 0.0
        published: list[int] = []
        while True:
            rows = claim(published)
            published = []
            if rows:
                pause = 0.0
                await q.addBulk([{"name": r[_ROW["event_type"]],
                                  "data": json.loads(r[_ROW["payload"]]),
                                  "opts": {"jobId": _job_id(r[_ROW["dedupe_key"]])}}
                                 for r in rows])
                published = [r[0] for r in rows]
                continue
            cur.execute(remaining)
            if cur.fetchone()[0] == 0:  # type: ignore[index]
                break
            pause = min(0.05, pause * 2 or 0.01)
            time.sleep(pause)
        await q.close()

    asyncio.run(main())
    conn.close()


# ---------------------------------------------------------------------------
# The parent: seeding, timing, checking
# ---------------------------------------------------------------------------

def delete_queue(client: Any, queue: str) -> None:
    """Delete every key of BullMQ's ``queue`` (its jobs' and its own)."""
    keys = list(client.scan_iter(match=f"bull:{queue}:*", count=1000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i:i + 1000])


def _poll_relay_main(database_url: str, redis_url: str, queue: str) -> None:
    """A relay at the defaults but for its database's own wake-up, turned off (PostgreSQL's
    LISTEN): polling alone, every 50 ms at most, as the relay polls on MySQL."""
    import signal
    import threading

    from outbox_lite import OutboxRepository
    from outbox_lite._families.url import DatabaseUrl
    from outbox_lite.publishers.bullmq import BullMQPublisher
    from outbox_lite.relay import Relay

    relay = Relay(OutboxRepository(DatabaseUrl.parse(database_url).database()),
                  BullMQPublisher(redis_url, queue), max_idle_pause=0.05, progress_every=0)
    relay.native_wake = None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    relay.run(stop)


class _Sides:
    def __init__(self, url: Any, redis_url: str, *, events: int, batch: int,
                 workers: int) -> None:
        import redis

        self.url, self.redis_url = url, redis_url
        self.events, self.batch, self.workers = events, batch, workers
        self.pg = is_postgresql(url)
        if self.pg:
            from . import raw_pg

            raw_pg.check()
            self.admin = raw_pg.connect(url)
        else:
            import pymysql

            self.admin = pymysql.connect(host=url.host, port=url.port, user=url.user,
                                         password=url.password, database=url.name,
                                         charset="utf8mb4", autocommit=True)
        self.redis = redis.Redis.from_url(redis_url)

    def close(self) -> None:
        self.admin.close()
        self.redis.close()

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.admin.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def seed(self, run: str) -> None:
        self.sql("TRUNCATE TABLE outbox_event")
        now = utcnow() - dt.timedelta(seconds=1)
        with self.admin.cursor() as cur:
            # One commit: row by row, MySQL's fsync per commit takes minutes.
            cur.execute("BEGIN") if self.pg else self.admin.begin()
            for start in range(0, self.events, 2000):
                cur.executemany(
                    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id,"
                    " dedupe_key, payload, status, available_at, created_at, updated_at)"
                    " VALUES ('job.created', 'ai_job', %s, %s, %s, 'pending', %s, %s, %s)",
                    [(str(n), f"{run}-{n}", json.dumps({**PAYLOAD, "job_id": n}), now, now, now)
                     for n in range(start, min(self.events, start + 2000))])
            cur.execute("COMMIT") if self.pg else self.admin.commit()
            if self.pg:
                cur.execute("ANALYZE outbox_event")

    def _python(self, *args: str) -> list[str]:
        return [sys.executable, str(ENTRY), "relay", *args]

    def run(self, side: str) -> tuple[float, list[tuple[float, ...]]]:
        """One round of ``side``: seconds from the first spawn to the last exit, and the
        relays' time splits."""
        run = uuid.uuid4().hex[:12]
        queue = f"bench-relay-{run}"
        if side != "addBulk":
            self.seed(run)
        share = -(-self.events // self.workers)
        db = {"host": self.url.host, "port": self.url.port, "user": self.url.user,
              "password": self.url.password, "database": self.url.name,
              **({"scheme": "postgresql"} if self.pg else {})}
        if side == "addBulk":
            commands = [self._python("_addbulk", self.redis_url, queue, str(i * share),
                                     str(min(share, self.events - i * share)),
                                     str(self.batch), run) for i in range(self.workers)]
        elif side == "twin":
            commands = [self._python("_twin", json.dumps(db), self.redis_url, queue,
                                     str(self.batch), f"twin-{i}")
                        for i in range(self.workers)]
        else:
            commands = [[sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
                         self.url.secret_text(), "--bullmq-url", self.redis_url,
                         "--queue", queue, "--batch-size", str(self.batch), "--until-empty",
                         "--progress-every", "3600"] for _ in range(self.workers)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        started = time.perf_counter()
        procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for c in commands]
        errors = [p.communicate(timeout=600)[1] for p in procs]
        elapsed = time.perf_counter() - started
        try:
            failed = [e for p, e in zip(procs, errors) if p.returncode != 0]
            if failed:
                raise RuntimeError(f"{side} failed: {failed[0][-2000:]}")
            waiting = self.redis.llen(f"bull:{queue}:wait")
            if waiting != self.events:
                raise AssertionError(f"{side}: {waiting} jobs waiting, not {self.events}")
            if side != "addBulk":
                [(published,)] = self.sql("SELECT COUNT(*) FROM outbox_event"
                                          " WHERE status = 'published'")
                if published != self.events:
                    raise AssertionError(f"{side}: {published} published of {self.events}")
            probe = _job_id(f"{run}-{self.events - 1}")
            if not self.redis.exists(f"bull:{queue}:{probe}"):
                raise AssertionError(f"{side}: the job ids are not the publisher's")
        finally:
            delete_queue(self.redis, queue)
        splits = [tuple(map(float, m.groups())) for e in errors
                  for m in [_PROGRESS.search(e)] if m]
        return elapsed, splits


def compare(url: Any, redis_url: str = DEFAULT_REDIS_URL, *, events: int = 20_000,
            batch: int = 100, workers: int = 4, rounds: int = 3) -> dict[str, Any]:
    """Take turns (A B C, C B A, …); returns per side the median events/s, the medians of the
    rounds' own ratios, and the relays' median time split."""
    from outbox_lite.models import COLUMNS as LIBRARY_COLUMNS
    from outbox_lite.publishers.bullmq import DEFAULT_JOB_OPTIONS, job_id

    assert LIBRARY_COLUMNS == raw_mysql.COLUMNS, "outbox_event's columns changed"
    assert dict(DEFAULT_JOB_OPTIONS) == JOB_OPTIONS, "the publisher's job options changed"
    assert job_id("a b:c/é") == _job_id("a b:c/é"), "the publisher's job ids changed"
    sides = _Sides(url, redis_url, events=events, batch=batch, workers=workers)
    order = ["addBulk", "relay", "twin"]
    rates: dict[str, list[float]] = {name: [] for name in order}
    splits: list[tuple[float, ...]] = []
    try:
        for r in range(rounds):
            for side in (order if r % 2 == 0 else order[::-1]):
                seconds, split = sides.run(side)
                rates[side].append(events / seconds)
                splits += split
    finally:
        sides.close()
    result: dict[str, Any] = {
        side: statistics.median(values) for side, values in rates.items()}
    result["relay/addBulk"] = statistics.median(
        a / b for a, b in zip(rates["relay"], rates["addBulk"]))
    result["relay/twin"] = statistics.median(
        a / b for a, b in zip(rates["relay"], rates["twin"]))
    result["twin/addBulk"] = statistics.median(
        a / b for a, b in zip(rates["twin"], rates["addBulk"]))
    result["split"] = {name: statistics.median(s[i] for s in splits) if splits else None
                       for i, name in enumerate(("claim", "publish", "record", "idle"))}
    result["rounds"] = {side: [round(v) for v in values] for side, values in rates.items()}
    result["load"] = os.getloadavg()
    return result


WAKES = ("none", "in-process", "redis", "nats")
#: On PostgreSQL: the relay as it ships (LISTEN) and polling alone.
PG_WAKES = ("none", "listen")
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def latency(url: Any, redis_url: str = DEFAULT_REDIS_URL, *, rate: Any = 200,
            seconds: float = 20, idle_seconds: float = 10, wakes: Any = ("none",),
            nats_url: str = DEFAULT_NATS_URL) -> dict[str, Any]:
    """COMMIT-to-Redis latency of one relay (BullMQ publisher) under steady write rates, then
    the queries a second it costs on an empty outbox (counted by a proxy in front of the
    server, its own only), for each wake-up in ``wakes``: ``none`` (polling alone, the
    defaults), ``in-process`` (the relay a thread of the writer's process, no server; with
    ``max_idle_pause=2``, as for a service whose every writer is that process), ``redis``
    and ``nats`` (a relay process with ``--wake-url``, the writer's repository with the same
    ``wake=``). The writer commits a business row and its event through the repository."""
    rates = [rate] if isinstance(rate, (int, float)) else list(rate)
    proxy = CountingProxy(url)
    try:
        modes = [_latency_of(url, proxy, redis_url, nats_url, wake, rates, seconds,
                             idle_seconds) for wake in wakes]
    finally:
        proxy.close()
    return {"rates": rates, "seconds": seconds, "modes": modes,
            "load": os.getloadavg()}


def _latency_of(url: Any, proxy: CountingProxy, redis_url: str, nats_url: str, wake: str,
                rates: list[float], seconds: float, idle_seconds: float) -> dict[str, Any]:
    import threading

    import redis

    from outbox_lite import OutboxRepository
    from outbox_lite.relay import Relay

    run = uuid.uuid4().hex[:12]
    queue = f"bench-latency-{run}"
    wake_url = {"redis": redis_url, "nats": nats_url}.get(wake)
    pg = is_postgresql(url)
    db = url.database()
    repo = OutboxRepository(db, wake=wake_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    db.execute_sql("TRUNCATE TABLE outbox_event")
    cap = 2.0 if wake != "none" else 0.05  # PostgreSQL's relay: 2 s, as it LISTENs
    stop = threading.Event()
    relays: list[Any] = []

    def start_relay(database_url: Any) -> None:
        """The relay: a thread of this process (in-process), else a process of its own."""
        if wake == "in-process":
            from outbox_lite.publishers.bullmq import BullMQPublisher

            relay = Relay(OutboxRepository(database_url.database()),
                          BullMQPublisher(redis_url, queue), max_idle_pause=cap,
                          progress_every=0)
            thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
            thread.start()
            relays.append(thread)
        elif pg and wake == "none":  # the relay with its LISTEN turned off
            relays.append(subprocess.Popen(
                [sys.executable, str(ENTRY), "relay", "_poll_relay", database_url.secret_text(),
                 redis_url, queue], env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        else:
            relays.append(subprocess.Popen(
                [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
                 database_url.secret_text(), "--bullmq-url", redis_url, "--queue", queue,
                 *(["--wake-url", wake_url] if wake_url else [])],
                env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, text=True))

    def stop_relays() -> None:
        stop.set()
        for relay in relays:
            if isinstance(relay, threading.Thread):
                relay.join(30)
            else:
                relay.terminate()
                relay.communicate(timeout=60)
        relays.clear()
        stop.clear()

    start_relay(url)  # straight to the server: the proxy would add its own hop
    result: dict[str, Any] = {"wake": wake, "max_idle_pause": cap, "rates": []}
    try:
        time.sleep(2)  # let it start (imports, connections) before the clock matters
        total = 0
        for rate in rates:
            committed: dict[str, float] = {}
            count = int(rate * seconds)
            started = time.perf_counter()
            for n in range(count):
                wait = started + n / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)  # pacing the writer, not waiting on a lock
                key = f"{run}-{total + n}"
                with db.atomic():
                    db.execute_sql("INSERT INTO job (name) VALUES (%s)", (key,))
                    repo.create_in_transaction(
                        event_type="job.created", aggregate_type="ai_job", aggregate_id=key,
                        payload={**PAYLOAD, "job_id": n}, dedupe_key=key)
                committed[_job_id(key)] = time.time() * 1000
            total += count
            deadline = time.monotonic() + 30
            while client.llen(f"bull:{queue}:wait") < total and time.monotonic() < deadline:
                time.sleep(0.05)
            added: dict[str, float] = {}
            for entry_id, fields in client.xrange(f"bull:{queue}:events", count=total * 4):
                if fields.get("event") == "added":
                    added[fields["jobId"]] = float(entry_id.split("-")[0])
            delays = sorted(added[j] - committed[j] for j in committed if j in added)
            if len(delays) != count:
                raise AssertionError(f"{wake}: {len(delays)} of {count} jobs seen")
            result["rates"].append({
                "rate": rate, "events": count, "p50_ms": statistics.median(delays),
                "p99_ms": delays[min(len(delays) - 1, int(len(delays) * 0.99))],
                "max_ms": delays[-1],
                "delays_ms": [round(d, 3) for d in delays]})  # for scripts/plot_benchmarks.py
            time.sleep(0.5)
        # The idle cost: a relay alone on the drained outbox, through the counting proxy,
        # once its pause has grown to the cap.
        stop_relays()
        # The writer is done: its session ends now, so that PostgreSQL counts its last
        # transactions at once (a backend left idle reports them up to 10 s later, into
        # the idle window: about 40 a second, all of them the writer's).
        db.close()
        start_relay(proxy.url)
        time.sleep(2 + 2 * cap + 1)
        before = proxy.count()
        xacts = _pg_transactions(url) if pg else 0
        time.sleep(idle_seconds)
        result["idle_queries_per_s"] = (proxy.count() - before) / idle_seconds
        if pg:  # the server's own count, a cross-check: only the relay works in this database
            result["idle_transactions_per_s"] = (_pg_transactions(url) - xacts) / idle_seconds
    finally:
        stop_relays()
        delete_queue(client, queue)
        client.close()
        db.close()
    return result


def _pg_transactions(url: Any) -> int:
    """The transactions committed and rolled back in ``url``'s database so far
    (pg_stat_database, read from the maintenance database so the reading adds none; each
    backend reports its counts at most once a second)."""
    conn = url.server_connection()
    try:
        cur = conn.cursor()
        cur.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database"
                    " WHERE datname = %s", (url.name,))
        return int(cur.fetchone()[0])
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] and given[0] in ("_addbulk", "_twin", "_poll_relay"):  # a fresh process
        role, args = given[0], given[1:]
        if role == "_poll_relay":
            _poll_relay_main(*args)
        elif role == "_addbulk":
            _addbulk_main(args[0], args[1], int(args[2]), int(args[3]), int(args[4]), args[5])
        else:
            _twin_main(json.loads(args[0]), args[1], args[2], int(args[3]), args[4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_relay", repeat=True)  # each measure on each in turn
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL,
                        help=f"Redis for BullMQ (default: {DEFAULT_REDIS_URL})")
    parser.add_argument("--only", choices=("relay", "latency"), action="append",
                        help="run only this measure (default: both)")
    add_sizes(parser, rounds=3, events=20_000, batch=100, workers=4)
    parser.add_argument("--rate", type=float, action="append",
                        help="events/s written, once per rate given (default 200)")
    parser.add_argument("--seconds", type=float, default=20,
                        help="writing time per rate (default 20)")
    parser.add_argument("--idle-seconds", type=float, default=10,
                        help="time the idle relay's queries are counted (default 10)")
    parser.add_argument("--wake", choices=WAKES + ("listen", "all"), action="append",
                        help="latency: the wake-up to measure, side by side when given more"
                             " than once (default: none; all: every one)")
    parser.add_argument("--nats-url", default=DEFAULT_NATS_URL,
                        help=f"NATS for --wake nats (default: {DEFAULT_NATS_URL})")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    reports: list[tuple[str, dict[str, Any]]] = []
    for option in args.database_url or [None]:
        base = server_url(option)
        wakes = tuple(args.wake or ("none",))
        if is_postgresql(base):  # its relay LISTENs by itself: that, or polling alone
            wakes = PG_WAKES if "all" in wakes else tuple(w for w in wakes if w in PG_WAKES)
        elif "all" in wakes:
            wakes = WAKES
        wakes = tuple(w for w in wakes if w != "listen" or is_postgresql(base)) or ("none",)
        with scratch_database(option, "bench_relay", job_table(base)) as url:
            report = run_measures(url, args.redis_url, set(args.only or ("relay", "latency")),
                                  rounds=args.rounds, events=args.events, batch=args.batch,
                                  workers=args.workers, rate=args.rate or [200],
                                  seconds=args.seconds, idle_seconds=args.idle_seconds,
                                  wakes=wakes, nats_url=args.nats_url)
        reports.append((server_name(base), report))
    if args.json:  # one server: its report, as scripts/plot_benchmarks.py reads it
        print(json.dumps(reports[0][1] if len(reports) == 1 else dict(reports), indent=2))
        return 0
    for name, report in reports:
        print(f"== {name}")
        print(format_report(report))
    if len(reports) > 1 and all("relay" in r for _, r in reports):
        print(format_drains(reports))
    return 0


def format_drains(reports: list[tuple[str, dict[str, Any]]]) -> str:
    """The drains side by side: each server's relay and twin, and each relay over the
    first server's."""
    first = reports[0][1]["relay"]["relay"]
    lines = ["== drain side by side, events/s (median of rounds; load average at the end of"
             " each server's run)",
             f"  {'server':<36} {'relay':>8} {'twin':>8} {'relay/twin':>10} {'addBulk':>8}"
             f" {'relay/1st':>9} {'load':>5}"]
    for name, report in reports:
        r = report["relay"]
        lines.append(f"  {name:<36} {r['relay']:>8,.0f} {r['twin']:>8,.0f}"
                     f" {r['relay/twin']:>10.3f} {r['addBulk']:>8,.0f}"
                     f" {r['relay'] / first:>9.2f} {r['load'][0]:>5.1f}")
    return "\n".join(lines)


def run_measures(url: Any, redis_url: str, only: set[str], **sizes: Any) -> dict[str, Any]:
    report: dict[str, Any] = {}
    if "relay" in only:
        report["relay"] = compare(url, redis_url, events=sizes["events"], batch=sizes["batch"],
                                  workers=sizes["workers"], rounds=sizes["rounds"])
    if "latency" in only:
        report["latency"] = latency(url, redis_url, rate=sizes["rate"],
                                    seconds=sizes["seconds"],
                                    idle_seconds=sizes.get("idle_seconds", 10),
                                    wakes=sizes.get("wakes", ("none",)),
                                    nats_url=sizes.get("nats_url", DEFAULT_NATS_URL))
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = []
    if "relay" in report:
        r = report["relay"]
        split = r["split"]
        lines += [
            f"relay to BullMQ, events/s (start-up counted): addBulk {r['addBulk']:,.0f},"
            f" relay {r['relay']:,.0f}, raw twin {r['twin']:,.0f}",
            f"  relay / addBulk {r['relay/addBulk']:.3f} (target >= 0.55),"
            f" relay / twin {r['relay/twin']:.3f} (target >= 0.90),"
            f" twin / addBulk {r['twin/addBulk']:.3f}",
            "  relay time split per process, s: " + ", ".join(
                f"{k} {v:.2f}" for k, v in split.items() if v is not None),
            f"  rounds: {r['rounds']}; load average"
            f" {' '.join(f'{x:.2f}' for x in r.get('load', ()))}"]
    if "latency" in report:
        lat = report["latency"]
        listen = any(mode["wake"] == "listen" for mode in lat["modes"])
        lines.append(f"COMMIT to job in Redis, one relay ({lat['seconds']:g} s per rate; load"
                     f" average {' '.join(f'{x:.2f}' for x in lat['load'])}); targets with "
                     + ("LISTEN: p50 <= 2 ms, p99 <= 10 ms" if listen else
                        "a wake-up: p50 <= 3 ms, p99 <= 15 ms, idle <= 2 queries/s"))
        lines.append(f"  {'wake-up':<11} {'pause cap':>9} " + " ".join(
            f"{f'{r:g}/s p50':>10} {'p99':>7} {'max':>7}" for r in lat["rates"])
            + f" {'idle q/s':>9}" + (f" {'idle xact/s':>11}" if listen else ""))
        for mode in lat["modes"]:
            lines.append(f"  {mode['wake']:<11} {mode['max_idle_pause']:>8g}s " + " ".join(
                f"{r['p50_ms']:>7.1f} ms {r['p99_ms']:>7.1f} {r['max_ms']:>7.1f}"
                for r in mode["rates"]) + f" {mode['idle_queries_per_s']:>9.1f}"
                + (f" {mode.get('idle_transactions_per_s', float('nan')):>11.1f}"
                   if listen else ""))
        if listen:
            lines.append("  (idle q/s: the relay's queries, counted by a proxy; idle xact/s:"
                         " its database's transactions, from pg_stat_database)")
    return "\n".join(lines)
