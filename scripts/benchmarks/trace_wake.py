"""Where one wake-up's time goes: a relay thread woken in-process, one event at a time, each of
its steps timed from the writer's COMMIT to the end of the BullMQ add, beside the server's floor
(a raw ``SELECT 1`` and the durable COMMIT of a one-row UPDATE), on each server.

The writer commits a keyed event through the repository every ``1 / rate`` seconds; the relay
(``Relay.run`` in a thread of this process, the in-process wake-up, BullMQ on Redis) claims and
publishes it. Peewee's ``execute_sql``, ``begin`` and ``commit`` and the publisher's ``publish``
are wrapped to stamp ``time.perf_counter()`` as each starts and ends, in the relay's thread
only; each event's steps are the gaps between its stamps, from the writer's COMMIT returned.
The first events (while the relay's pause settles) are left out. Medians and p90 over the
rest; nothing else of the library is changed.

The floor is measured with the raw driver on a connection of its own (PyMySQL or psycopg 3),
the same number of times, at the same pace: on this machine an idle CPU takes longer to answer
a statement that comes every 200 ms than one that follows another at once.

Usage: python scripts/bench.py trace-wake [--database-url URL ...] [--events 60] [--rate 5]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any, Callable

import peewee as pw
import redis

from ._setup import ALL_THREE, add_database_option, load, scratch_database, server_url
from .relay import DEFAULT_REDIS_URL, delete_queue
from .write import Raw

SKIP = 5  # first events left out


class Stamps:
    """(perf_counter, step) pairs stamped in one thread, by name."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self.stamps: list[tuple[float, str]] = []

    def mark(self, step: str) -> None:
        if threading.current_thread().name == self.thread_name:
            self.stamps.append((time.perf_counter(), step))

    def around(self, function: Callable[..., Any], step: Callable[..., str]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            name = step(*args)
            self.mark(f"{name} starts")
            try:
                return function(*args, **kwargs)
            finally:
                self.mark(f"{name} ends")
        return timed


def _statement(_db: Any, sql: Any, *_rest: Any) -> str:
    """The statement's first words: enough to tell the claim's three apart."""
    return " ".join(str(sql).replace("`", "").split()[:5]).rstrip(",")


def trace(url: Any, events: int, rate: float) -> tuple[dict[str, list[float]], int]:
    """Each step's durations (ms) over the events after the first SKIP, and how many of
    those were left out (the relay's round had begun before the writer's COMMIT returned)."""
    from outbox_lite import OutboxRepository
    from outbox_lite.publishers.bullmq import BullMQPublisher
    from outbox_lite.relay import Relay

    stamps = Stamps("traced-relay")
    patched: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, step: Callable[..., str]) -> None:
        original = owner.__dict__[name]
        patched.append((owner, name, original))
        setattr(owner, name, stamps.around(original, step))

    patch(pw.Database, "execute_sql", _statement)
    for cls in (pw.Database, pw.MySQLDatabase, pw.PostgresqlDatabase):
        for name in ("begin", "commit"):
            if name in cls.__dict__:
                patch(cls, name, lambda *_a, _n=name: _n.upper())
    patch(BullMQPublisher, "publish", lambda *_a: "BullMQ add")
    queue = f"trace-wake-{time.time_ns()}"
    publisher = BullMQPublisher(DEFAULT_REDIS_URL, queue)
    relay = Relay(OutboxRepository(url.database()), publisher, max_idle_pause=2.0,
                  progress_every=0)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), name="traced-relay", daemon=True)
    db = url.database()
    repo = OutboxRepository(db)
    committed: list[float] = []
    try:
        thread.start()
        time.sleep(2)  # imports, connections, the first claims
        for n in range(events):
            time.sleep(1 / rate)  # pacing the writer, not waiting for a lock
            with db.atomic():
                repo.create_in_transaction(event_type="job.created", aggregate_type="job",
                                           aggregate_id=str(n), payload={"n": n},
                                           dedupe_key=f"trace-{n}")
            committed.append(time.perf_counter())
        time.sleep(1)
    finally:
        stop.set()
        thread.join(30)
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)
        client = redis.Redis.from_url(DEFAULT_REDIS_URL)
        delete_queue(client, queue)
        client.close()
        publisher.close()
        db.close()
    steps: dict[str, list[float]] = {}
    busy = 0
    for at in committed[SKIP:]:
        after = [s for s in stamps.stamps if s[0] > at]
        if not after or after[0][1] != "BEGIN starts":
            # The relay's round began before the writer's COMMIT returned: a poll, or on
            # PostgreSQL the LISTEN notification, which can wake the relay before the
            # writer's own call returns. Its steps do not start at the COMMIT: left out.
            busy += 1
            continue
        previous = at
        for when, step in after:
            name, _, edge = step.rpartition(" ")
            label = name if edge == "ends" else f"  (client, before {name})"
            if previous == at:
                label = "the ring: the writer's COMMIT returned -> BEGIN sent"
            steps.setdefault(label, []).append((when - previous) * 1e3)
            previous = when
            if step == "BullMQ add ends":
                break
        steps.setdefault("in all, COMMIT returned -> BullMQ add returned", []).append(
            (previous - at) * 1e3)
    return steps, busy


def floor(url: Any, events: int, rate: float) -> dict[str, list[float]]:
    """The raw driver's SELECT 1 and durable one-row COMMIT, at the writer's pace (ms),
    connected as the library connects (on MySQL 9.7, which offers TLS, both use it)."""
    conn = Raw(url, {}).conn  # the write bench's raw client: PyMySQL or psycopg 3
    cur = conn.cursor()
    cur.execute("CREATE TABLE floor_row (id INT PRIMARY KEY, n INT NOT NULL)")
    cur.execute("INSERT INTO floor_row VALUES (1, 0)")
    ones, commits = [], []
    try:
        for _ in range(events):
            time.sleep(1 / rate)
            started = time.perf_counter()
            cur.execute("SELECT 1")
            cur.fetchall()
            ones.append((time.perf_counter() - started) * 1e3)
            cur.execute("BEGIN")
            cur.execute("UPDATE floor_row SET n = n + 1 WHERE id = 1")
            started = time.perf_counter()
            cur.execute("COMMIT")
            commits.append((time.perf_counter() - started) * 1e3)
    finally:
        cur.execute("DROP TABLE floor_row")
        conn.close()
    return {"raw SELECT 1": ones[SKIP:], "raw durable COMMIT (one-row UPDATE)": commits[SKIP:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_trace_wake", repeat=True,
                        default="MariaDB :3306, MySQL :3308, PostgreSQL :5432")
    parser.add_argument("--events", type=int, default=60, help="events (default 60)")
    parser.add_argument("--rate", type=float, default=5.0, help="events a second (default 5)")
    args = parser.parse_args(argv)
    for text in args.database_url or ALL_THREE:
        base = server_url(text)
        with scratch_database(base, "bench_trace_wake") as url:
            before = load()
            steps, busy = trace(url, args.events, args.rate)
            low = floor(url, args.events, args.rate)
            print(f"== {base.host}:{base.port} ({base.scheme}); load average {before} -> {load()};"
                  f" {args.events - SKIP - busy} events at {args.rate:g}/s, in-process wake-up,"
                  f" BullMQ ({busy} left out: the relay's round began before the writer's"
                  " COMMIT returned)")
            print(f"  {'step':<68} {'n':>3} {'p50 ms':>7} {'p90 ms':>7}")
            for name, values in list(steps.items()) + list(low.items()):
                values = sorted(values)
                print(f"  {name:<68} {len(values):>3} {statistics.median(values):>7.3f}"
                      f" {values[int(len(values) * 0.9)]:>7.3f}")
    return 0
