"""Migration 006 (headers, expires_at) on a table with rows, while a writer goes on: how long
the ALTER and its rollback take on each server, and how long the writer's INSERTs wait meanwhile.

On each server: a database of its own at migration 005 with --rows events (made by doubling
INSERT … SELECT), then a writer thread inserting one event per transaction without pause
(raw PyMySQL, the 005 columns) while the main thread applies 006 and rolls it back, each
timed. The writer's slowest INSERTs during each step are printed beside its median before
them. Usage: python scripts/bench.py migration [--database-url URL ...] [--rows 1000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time


import pymysql

from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl

from ._setup import MARIADB_AND_MYSQL, add_database_option, load, scratch_database

INSERT = ("INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key,"
          " payload, status, attempt_count, available_at, created_at, updated_at) VALUES"
          " ('job.created', 'ai_job', %s, %s, '{\"n\": 1}', 'pending', 0, UTC_TIMESTAMP(6),"
          " UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")


def _connect(url: DatabaseUrl) -> pymysql.Connection:
    return pymysql.connect(host=url.host, port=url.port, user=url.user, password=url.password,
                           database=url.name, charset="utf8mb4", autocommit=True)


def _fill(url: DatabaseUrl, rows: int) -> None:
    conn = _connect(url)
    with conn.cursor() as cur:
        cur.execute(INSERT, ("seed", "seed-0"))
        count = 1
        while count < rows:
            take = min(count, rows - count)
            cur.execute(
                "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key,"
                " payload, status, attempt_count, available_at, created_at, updated_at)"
                " SELECT event_type, aggregate_type, CONCAT('a', n), CONCAT('k', n), payload,"
                " status, attempt_count, available_at, created_at, updated_at FROM"
                " (SELECT *, %s + ROW_NUMBER() OVER (ORDER BY id) AS n FROM outbox_event"
                " ORDER BY id LIMIT %s) AS page", (count, take))
            count += take
    conn.close()


class Writer(threading.Thread):
    """Inserts events one transaction each until stopped, noting (start, seconds) of each."""

    def __init__(self, url: DatabaseUrl) -> None:
        super().__init__(daemon=True)
        self.conn = _connect(url)
        self.stop = threading.Event()
        self.times: list[tuple[float, float]] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        n = 0
        try:
            with self.conn.cursor() as cur:
                while not self.stop.is_set():
                    n += 1
                    started = time.perf_counter()
                    cur.execute(INSERT, (f"w{n}", f"writer-{os.getpid()}-{n}"))
                    self.times.append((started, time.perf_counter() - started))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.errors.append(exc)
        finally:
            self.conn.close()

    def between(self, start: float, end: float) -> list[float]:
        return [t for s, t in self.times if s + t >= start and s <= end]


def measure(url: DatabaseUrl, rows: int) -> dict[str, float]:
    database = url.database()
    schema.migrate(database)
    assert schema.rollback(database) == "006_headers_and_expiry"
    started = time.perf_counter()
    _fill(url, rows)
    fill = time.perf_counter() - started
    writer = Writer(url)
    writer.start()
    time.sleep(2.0)
    before = [t for _, t in writer.times]
    result = {"fill_s": fill, "writer_median_ms": statistics.median(before) * 1e3}
    for step, run in (("migrate", lambda: schema.migrate(database)),
                      ("rollback", lambda: schema.rollback(database))):
        started = time.perf_counter()
        run()
        ended = time.perf_counter()
        during = writer.between(started, ended) or [0.0]
        result[f"{step}_s"] = ended - started
        result[f"{step}_writer_max_ms"] = max(during) * 1e3
        result[f"{step}_writes"] = len(during)
        time.sleep(1.0)
    writer.stop.set()
    writer.join(10)
    if writer.errors:
        raise writer.errors[0]
    result["writes"] = len(writer.times)
    database.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_migration_<pid>", repeat=True,
                        default="MariaDB :3306 and MySQL :3308")
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    out = []
    for text in args.database_url or MARIADB_AND_MYSQL:
        with scratch_database(DatabaseUrl.parse(text), f"bench_migration_{os.getpid()}") as url:
            out.append((text, measure(url, args.rows)))
    print(f"migration 006 on {args.rows:,} rows, a writer inserting throughout")
    print(f"{'server':<40} {'fill s':>7} {'med ms':>7} {'006 s':>7} {'max ms':>7} {'writes':>6}"
          f" {'undo s':>7} {'max ms':>7} {'writes':>6}")
    for text, r in out:
        print(f"{text:<40} {r['fill_s']:>7.1f} {r['writer_median_ms']:>7.2f}"
              f" {r['migrate_s']:>7.3f} {r['migrate_writer_max_ms']:>7.1f}"
              f" {r['migrate_writes']:>6} {r['rollback_s']:>7.3f}"
              f" {r['rollback_writer_max_ms']:>7.1f} {r['rollback_writes']:>6}")
    print(f"load average {load()}"
          f" ({os.cpu_count()} cores, shared)")
    return 0
