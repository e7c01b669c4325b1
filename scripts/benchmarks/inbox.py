"""The inbox's cost, in one run, side by side with baselines measured in the same run.

* consumer: a consumer's transaction (BEGIN, its business INSERT, COMMIT, through Peewee) with
  ``inbox.accept(message_id)`` in it against the same transaction without it; and, for
  reference, with the inbox row written by a plain INSERT through Peewee instead of accept.
  One connection; the three take turns in blocks of 50 transactions (A B C C B A …), so the
  server's background work (flushing, purge) weighs on all alike.
* accept: accepts per second with 8 threads (each its own connection) on distinct ids, one
  accept per transaction (``with db.atomic(): inbox.accept(id)``), against a raw PyMySQL
  ``BEGIN; INSERT INTO inbox_message …; COMMIT`` of the same rows, and for reference against
  that INSERT through Peewee alone (its ``atomic()`` and ``execute_sql``, no outbox_lite):
  rounds take turns A B C C B A …, each on an emptied table. Ids are random, like the message
  ids of generated dedupe keys.

Usage: python scripts/bench.py inbox [--database-url URL] [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import threading
import time
from typing import Any, Callable


import pymysql

from outbox_lite import Inbox
from outbox_lite._families.mysql_server import peewee_query, server_of
from outbox_lite._families.url import DatabaseUrl

from ._setup import add_database_option, scratch_database

RAW_INSERT = "INSERT INTO inbox_message (consumer, message_id, received_at) VALUES (%s, %s, %s)"
EFFECT = ("CREATE TABLE effect (id BIGINT AUTO_INCREMENT PRIMARY KEY, message_id"
          " VARCHAR(64) NOT NULL, amount INT NOT NULL) ENGINE=InnoDB")


def _ids(count: int) -> list[str]:
    return ["outbox-" + os.urandom(16).hex() for _ in range(count)]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


# ---------------------------------------------------------------------------
# consumer: the transaction with accept, without it, and with a plain INSERT instead
# ---------------------------------------------------------------------------

def consumer_round(url: DatabaseUrl, transactions: int, block: int = 50) -> dict[str, float]:
    database = url.database()
    database.connect()
    inbox = Inbox(database, "bench")
    effect = "INSERT INTO effect (message_id, amount) VALUES (%s, %s)"

    def with_accept(message_id: str) -> None:
        with database.atomic():
            if inbox.accept(message_id):
                database.execute_sql(effect, (message_id, 42))

    def without(message_id: str) -> None:
        with database.atomic():
            database.execute_sql(effect, (message_id, 42))

    def plain_insert(message_id: str) -> None:
        with database.atomic():
            database.execute_sql(RAW_INSERT, ("bench", message_id, _now()))
            database.execute_sql(effect, (message_id, 42))

    sides: dict[str, Callable[[str], None]] = {
        "with accept": with_accept, "without": without, "plain INSERT": plain_insert}
    spent = dict.fromkeys(sides, 0.0)
    ids = iter(_ids(transactions * len(sides)))
    for turn in range(0, transactions, block):
        order = list(sides) if turn // block % 2 == 0 else list(sides)[::-1]
        for name in order:
            side = sides[name]
            started = time.perf_counter()
            for _ in range(min(block, transactions - turn)):
                side(next(ids))
            spent[name] += time.perf_counter() - started
    database.close()
    return {name: transactions / seconds for name, seconds in spent.items()}


# ---------------------------------------------------------------------------
# accept: 8 threads on distinct ids, against a raw INSERT of the same rows
# ---------------------------------------------------------------------------

def _threads(count: int, body: Callable[[int], None]) -> float:
    barrier = threading.Barrier(count + 1)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            body(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


def accept_round(url: DatabaseUrl, side: str, threads: int, per_thread: int) -> float:
    """Accepts (or raw INSERTs) per second; each thread connects before the clock starts."""
    admin = url.database()
    admin.execute_sql("TRUNCATE TABLE inbox_message")
    admin.close()
    ids = [_ids(per_thread) for _ in range(threads)]
    ready: list[Any] = [None] * threads
    for i in range(threads):
        if side in ("library", "peewee"):
            database = url.database()
            ready[i] = (database, Inbox(database, "bench"))
        else:
            ready[i] = pymysql.connect(host=url.host, port=url.port, user=url.user,
                                       password=url.password, database=url.name,
                                       charset="utf8mb4", autocommit=True)

    def library(i: int) -> None:
        database, inbox = ready[i]
        database.connect()
        for message_id in ids[i]:
            with database.atomic():
                inbox.accept(message_id)
        database.close()

    def peewee(i: int) -> None:
        database, _ = ready[i]
        database.connect()
        for message_id in ids[i]:
            with database.atomic():
                database.execute_sql(RAW_INSERT, ("bench", message_id, _now()))
        database.close()

    def raw(i: int) -> None:
        conn = ready[i]
        with conn.cursor() as cur:
            for message_id in ids[i]:
                conn.begin()
                cur.execute(RAW_INSERT, ("bench", message_id, _now()))
                conn.commit()
        conn.close()

    elapsed = _threads(threads, {"library": library, "peewee": peewee, "raw": raw}[side])
    check = url.database()
    rows = check.execute_sql("SELECT COUNT(*) FROM inbox_message").fetchone()[0]
    check.close()
    if rows != threads * per_thread:
        raise AssertionError(f"{side} wrote {rows} of {threads * per_thread} records")
    return threads * per_thread / elapsed


def taking_turns(rounds: int, sides: dict[str, Callable[[], float]]) -> list[dict[str, float]]:
    """Each round runs every side once, in order A B C then C B A …, so drift on a noisy
    machine hits all alike."""
    runs = []
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        runs.append({name: sides[name]() for name in order})
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_inbox")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--transactions", type=int, default=1000,
                        help="consumer transactions per side and round (default 1000)")
    parser.add_argument("--threads", type=int, default=8, help="accept threads (default 8)")
    parser.add_argument("--per-thread", type=int, default=500,
                        help="accepts per thread and round (default 500)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)

    with scratch_database(args.database_url, "bench_inbox", EFFECT) as url:
        database = url.database()
        query = peewee_query(database)
        server = server_of(query)
        settings = dict(query("SELECT 'innodb_flush_log_at_trx_commit',"
                              " @@innodb_flush_log_at_trx_commit UNION ALL"
                              " SELECT 'log_bin', @@log_bin"))
        database.close()
        consumer = [consumer_round(url, args.transactions) for _ in range(args.rounds)]
        accepts = taking_turns(args.rounds, {
            side: (lambda side=side: accept_round(url, side, args.threads, args.per_thread))
            for side in ("library", "raw", "peewee")})

    def row(name: str, runs: list[dict[str, float]], a: str, b: str,
            target: str) -> tuple[str, float, float, float, str]:
        ratio = statistics.median(run[a] / run[b] for run in runs)
        if target.startswith(">="):
            target += " met" if ratio >= float(target.split()[1]) else " MISSED"
        return (name, statistics.median(run[a] for run in runs),
                statistics.median(run[b] for run in runs), ratio, target)

    rows = [
        row("consumer txn/s: with accept / without", consumer, "with accept", "without",
            "reported"),
        row("  with accept / with a plain INSERT of the row", consumer, "with accept",
            "plain INSERT", "reference"),
        row(f"accepts/s, {args.threads} threads, distinct ids / raw INSERT", accepts,
            "library", "raw", ">= 0.90"),
        row("  accept / the INSERT through Peewee alone", accepts, "library", "peewee",
            "reference"),
        row("  Peewee alone / raw INSERT", accepts, "peewee", "raw", "reference"),
    ]
    if args.json:
        print(json.dumps({"server": str(server), "settings": settings, "rounds": args.rounds,
                          "measures": [{"measure": m.strip(), "side": round(a, 1),
                                        "baseline": round(b, 1), "ratio": round(r, 3),
                                        "target": t} for m, a, b, r, t in rows]}, indent=2))
        return 0
    print(f"{server}; " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print(f"{'measure':<58} {'side':>9} {'baseline':>9} {'ratio':>6}  target")
    for m, a, b, r, t in rows:
        print(f"{m:<58} {a:>9.0f} {b:>9.0f} {r:>6.3f}  {t}")
    print(f"medians of {args.rounds} rounds (ratio: the median of the rounds' own ratios);"
          f" consumer: {args.transactions} transactions per side per round, in blocks of 50"
          f" taking turns; accepts: {args.threads} x {args.per_thread} per round and side,"
          " taking turns")
    return 0
