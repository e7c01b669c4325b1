"""What the server's clock costs, side by side with the host's clock in the same run.

* write: ``create_in_transaction`` in its own transaction (BEGIN, INSERT, COMMIT), with the
  default clock (the server's: ``SELECT UTC_TIMESTAMP(6)`` once, then per 10 s) against a
  repository given the host's clock; and a claim+record round (claim 50, mark them published).
  The two take turns in blocks (A B B A …) on one connection.
* reading: one ``clock()`` call, with no SQL (the estimate) and with a read every time
  (refresh 0, what option "compute every instant in SQL" would cost as a separate round trip).
* accuracy: the estimate against ``UTC_TIMESTAMP(6)`` read right after it, in microseconds.

Usage: python scripts/bench.py clock [--database-url URL] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time


from outbox_lite import OutboxRepository
from outbox_lite._checks import utc_now
from outbox_lite._clock import ServerClock, server_clock

from ._setup import add_database_option, scratch_database

BLOCK = 200


def writes(repo: OutboxRepository, count: int) -> float:
    """Microseconds per create_in_transaction, each in a transaction of its own."""
    started = time.perf_counter()
    for n in range(count):
        with repo.database.atomic():
            repo.create_in_transaction(event_type="e", aggregate_type="a",
                                       aggregate_id=str(n % 50), payload={"n": n})
    return (time.perf_counter() - started) / count * 1e6


def rounds(repo: OutboxRepository, count: int) -> float:
    """Microseconds per claimed-and-recorded event (batches of 50)."""
    started, done = time.perf_counter(), 0
    while done < count:
        with repo.database.atomic():
            batch = repo.claim_batch("bench", 50)
        if not batch:
            break
        repo.mark_published_many([e.id for e in batch], "bench")
        done += len(batch)
    return (time.perf_counter() - started) / max(done, 1) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_database_option(parser, "clock")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with scratch_database(args.database_url, "clock") as url:
        database = url.database()
        server = OutboxRepository(database)
        host = OutboxRepository(database, clock=utc_now)
        results: dict[str, list[float]] = {"server": [], "host": []}
        claims: dict[str, list[float]] = {"server": [], "host": []}
        for n in range(args.rounds):
            order = [("server", server), ("host", host)]
            for name, repo in order if n % 2 == 0 else order[::-1]:
                results[name].append(writes(repo, BLOCK))
                claims[name].append(rounds(repo, BLOCK))
        clock = server_clock(database)
        print(f"{'per operation (median µs)':<34}{'server clock':>14}{'host clock':>14}")
        print(f"{'create_in_transaction + COMMIT':<34}{statistics.median(results['server']):>14.0f}"
              f"{statistics.median(results['host']):>14.0f}")
        print(f"{'claimed and recorded, per event':<34}{statistics.median(claims['server']):>14.1f}"
              f"{statistics.median(claims['host']):>14.1f}")
        print(f"server reads in {2 * args.rounds * BLOCK} writes and their claims:"
              f" {clock.reads}")

        reads = 2000
        started = time.perf_counter()
        for _ in range(reads):
            clock.naive()
        estimate = (time.perf_counter() - started) / reads * 1e6
        every_time = ServerClock(database, refresh=0.0)
        started = time.perf_counter()
        for _ in range(reads):
            every_time.naive()
        round_trip = (time.perf_counter() - started) / reads * 1e6
        print(f"one clock() reading: {estimate:.1f} µs from the estimate,"
              f" {round_trip:.0f} µs reading the server every time")

        errors = []
        for _ in range(200):
            before = time.monotonic()
            guess = clock.naive()
            (actual,) = database.execute_sql("SELECT UTC_TIMESTAMP(6)").fetchone()
            rtt = time.monotonic() - before
            errors.append((guess - actual) / dt.timedelta(microseconds=1) + rtt * 5e5)
        print(f"estimate minus server time (µs, centred on the read's round trip):"
              f" median {statistics.median(errors):+.0f}, worst {max(errors, key=abs):+.0f}")
        database.close()
    return 0
