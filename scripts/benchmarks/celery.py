#!/usr/bin/env python3
"""Celery's throughput beside BullMQ's, in one run (issue 33; about a minute on 2 cores):

    python scripts/bench.py celery [--database-url URL] [--redis-url URL] [--events 5000]
                                  [--batch 100] [--rounds 3] [--json]

Each round seeds ``--events`` pending events (one commit) in a database of the script's own
(``outbox_lite_bench_celery`` on the server of ``--database-url``, dropped at the end), then
times one fresh ``outbox-lite relay --until-empty`` process draining them, start-up counted:
once with ``--celery-url`` (a Celery task message per event, the batch in one Redis pipeline)
and once with ``--bullmq-url`` (a BullMQ job per event, one bulk add per batch), on the same
Redis, taking turns round by round. Each side is checked: every event published, and the
broker holds one message (a Celery task message, a waiting BullMQ job) per event. Prints
events/s per side: the median of the rounds and their spread (min-max), with the load average.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from outbox_lite import migrate  # noqa: E402
from outbox_lite._families.url import DatabaseUrl  # noqa: E402

PAYLOAD = {"order_id": 0, "customer": "naïve café", "lines": [{"sku": "A-1", "qty": 2}]}
SIDES = ("celery", "bullmq")


def seed(database: Any, events: int, run: str) -> None:
    """``events`` pending events, written in one commit (row by row would time fsyncs)."""
    database.execute_sql("DELETE FROM outbox_event")
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(seconds=1)
    with database.atomic():
        for start in range(0, events, 1000):
            rows = [("order.paid", "order", str(n), f"{run}-{n}",
                     json.dumps({**PAYLOAD, "order_id": n}), "pending", now, now, now)
                    for n in range(start, min(events, start + 1000))]
            database.execute_sql(
                "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id,"
                " dedupe_key, payload, status, available_at, created_at, updated_at) VALUES "
                + ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows)),
                [value for row in rows for value in row])


def drain(url: DatabaseUrl, side: str, redis_url: str, queue: str, batch: int) -> float:
    """Seconds for one fresh relay to drain the outbox into ``side``, start-up counted."""
    broker = (["--celery-url", redis_url, "--celery-task", "bench.order_paid",
               "--celery-queue", queue] if side == "celery"
              else ["--bullmq-url", redis_url, "--queue", queue])
    command = [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
               url.secret_text(), *broker, "--batch-size", str(batch), "--until-empty",
               "--progress-every", "3600"]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{side}: the relay failed: {result.stderr[-2000:]}")
    return elapsed


def held(client: Any, side: str, queue: str) -> int:
    """The messages the broker holds for ``queue``."""
    return int(client.llen(queue if side == "celery" else f"bull:{queue}:wait"))


def forget(client: Any, side: str, queue: str) -> None:
    if side == "celery":
        client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        return
    keys = list(client.scan_iter(match=f"bull:{queue}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="mysql://root@127.0.0.1:3306/outbox_lite_test")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    import redis

    url = DatabaseUrl.parse(args.database_url).with_name("outbox_lite_bench_celery")
    url.drop_database()
    url.create_database()
    database = url.database()
    migrate.migrate(database)
    client = redis.Redis.from_url(args.redis_url)
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    try:
        for number in range(args.rounds):
            for side in SIDES if number % 2 == 0 else SIDES[::-1]:
                run = uuid.uuid4().hex[:12]
                queue = f"bench-celery-{run}"
                seed(database, args.events, run)
                database.close()
                try:
                    seconds = drain(url, side, args.redis_url, queue, args.batch)
                    [(published,)] = database.execute_sql(
                        "SELECT COUNT(*) FROM outbox_event WHERE status = 'published'"
                    ).fetchall()
                    if published != args.events or held(client, side, queue) != args.events:
                        raise AssertionError(
                            f"{side}: {published} published, {held(client, side, queue)} at"
                            f" the broker, of {args.events}")
                finally:
                    forget(client, side, queue)
                rates[side].append(args.events / seconds)
                print(f"round {number + 1} {side}: {args.events / seconds:,.0f} events/s"
                      f" ({seconds:.2f} s)", file=sys.stderr, flush=True)
    finally:
        database.close()
        url.drop_database()
        client.close()
    report = {side: {"median": statistics.median(r), "min": min(r), "max": max(r), "runs": r}
              for side, r in rates.items()}
    report["load_average"] = list(os.getloadavg())
    report["server"] = str(url)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.events:,} events, one relay, batches of {args.batch}, {args.rounds} rounds,"
          f" {url}; load average"
          f" {report['load_average'][0]:.2f}")
    for side in SIDES:
        figures = report[side]
        print(f"  {side:<7} {figures['median']:>8,.0f} events/s (median;"
              f" {figures['min']:,.0f}-{figures['max']:,.0f} over {args.rounds} runs)")
    return 0
