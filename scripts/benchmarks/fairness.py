#!/usr/bin/env python3
"""One relay process for two databases: how much a large backlog in one delays the other's
events (issue 33; about a minute):

    python scripts/bench.py fairness [--database-url URL] [--backlog 100000] [--rate 5]
                                     [--seconds 10] [--broker-pause 0.01] [--json]

Two databases of the script's own on the server of ``--database-url`` (``<database>_bench_big``
and ``<database>_bench_small``, dropped at the end). A :class:`RelayGroup` (the relay command's
many-databases mode, in this process) relays both, each to a broker that takes
``--broker-pause`` seconds a batch. ``--rate`` events a second are written to the small database
for ``--seconds``, each committed alone, and the delay from each COMMIT to its hand-off to the
broker is measured: first with the big database empty (the baseline), then while its relay
drains ``--backlog`` pending events seeded before. Prints the small database's p50, p99 and max
delay in both runs side by side, the big one's drain rate, and how much of its backlog was still
pending when the measure ended (more than 0: it drained the whole time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

from ._setup import PAYLOAD, add_database_option, load, scratch_database, server_name, utcnow


class Broker:
    """Takes ``pause`` seconds a batch; keeps when it was handed each event."""

    def __init__(self, pause: float) -> None:
        self.pause = pause
        self.at: dict[int, float] = {}
        self.handed = 0

    def publish(self, events: Any) -> dict[int, BaseException]:
        time.sleep(self.pause)
        now = time.monotonic()
        self.handed += len(events)
        self.at.update((event.id, now) for event in events)
        return {}

    def close(self) -> None:
        pass


def seed(database: Any, events: int) -> None:
    """``events`` pending events, in commits of 1,000 rows (row by row would time fsyncs)."""
    now = utcnow()
    payload = json.dumps(PAYLOAD)
    for start in range(0, events, 1000):
        rows = [("bench.backlog", "job", str(n), f"backlog-{n}", payload, "pending", now, now,
                 now) for n in range(start, min(events, start + 1000))]
        with database.atomic():
            database.execute_sql(
                "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key,"
                " payload, status, available_at, created_at, updated_at) VALUES "
                + ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows)),
                [value for row in rows for value in row])


def measure(big_url: Any, small_url: Any, backlog: int, rate: float, seconds: float,
            pause: float) -> dict[str, Any]:
    """One run: seed ``backlog`` in the big database, relay both, write to the small one."""
    from outbox_lite import OutboxRepository
    from outbox_lite.relay import Relay, RelayGroup

    big_db, small_db = big_url.database(), small_url.database()
    for database in (big_db, small_db):
        database.execute_sql("DELETE FROM outbox_event")
    seed(big_db, backlog)
    big, small = Broker(pause), Broker(pause)
    small_repo = OutboxRepository(small_db)
    group = RelayGroup({"big": Relay(OutboxRepository(big_url.database()), big,
                                     progress_every=0),
                        "small": Relay(OutboxRepository(small_url.database()), small,
                                       progress_every=0)})
    stop = threading.Event()
    runner = threading.Thread(target=group.run, args=(stop,))
    runner.start()
    written: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 30
        while backlog and not big.handed and time.monotonic() < deadline:
            time.sleep(0.005)  # the big relay is draining before the first write
        started = time.monotonic()
        for n in range(int(rate * seconds)):
            time.sleep(max(0.0, started + n / rate - time.monotonic()))
            with small_db.atomic():
                event = small_repo.create_in_transaction(
                    event_type="bench.small", aggregate_type="job", aggregate_id=str(n),
                    payload=PAYLOAD)
            written[event.id] = time.monotonic()
        deadline = time.monotonic() + 30
        while not written.keys() <= small.at.keys() and time.monotonic() < deadline:
            time.sleep(0.005)
        left = backlog - big.handed
        big_rate = big.handed / (time.monotonic() - started) if backlog else 0.0
    finally:
        stop.set()
        runner.join(120)
        big_db.close()
        small_db.close()
    if group.errors:
        raise SystemExit(f"a relay failed: {group.errors}")
    missing = written.keys() - small.at.keys()
    if missing:
        raise SystemExit(f"{len(missing)} of the small database's events were not published")
    delays = sorted((small.at[i] - at) * 1000 for i, at in written.items())
    return {"p50_ms": statistics.median(delays),
            "p99_ms": delays[min(len(delays) - 1, int(len(delays) * 0.99))],
            "max_ms": delays[-1], "events": len(delays), "big_left": left,
            "big_events_per_s": big_rate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py fairness", description=__doc__.split(
        "\n\n")[0])
    add_database_option(parser, "big and <database>_bench_small")
    parser.add_argument("--backlog", type=int, default=100_000,
                        help="pending events in the big database (default 100000)")
    parser.add_argument("--rate", type=float, default=5.0,
                        help="events/s written to the small database (default 5)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long they are written (default 10)")
    parser.add_argument("--broker-pause", type=float, default=0.01,
                        help="seconds each broker takes a batch (default 0.01)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    with scratch_database(args.database_url, "bench_big") as big_url, \
            scratch_database(args.database_url, "bench_small") as small_url:
        server = server_name(big_url)
        runs = {"alone": measure(big_url, small_url, 0, args.rate, args.seconds,
                                 args.broker_pause),
                "beside a backlog": measure(big_url, small_url, args.backlog, args.rate,
                                            args.seconds, args.broker_pause)}
    if args.json:
        print(json.dumps({"server": server, "load": load(), "args": vars(args),
                          "runs": runs}, indent=2))
        return 0
    print(f"== {server}; load average {load()}")
    print(f"the small database's COMMIT -> broker delay, {args.rate:g} events/s for"
          f" {args.seconds:g} s; broker {args.broker_pause * 1000:g} ms a batch")
    print(f"  {'big database':<18} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
          f" {'big events/s':>13} {'big left':>9}")
    for name, run in runs.items():
        backlog = "empty" if name == "alone" else f"{args.backlog:,} pending"
        print(f"  {backlog:<18} {run['p50_ms']:8.1f} {run['p99_ms']:8.1f} {run['max_ms']:8.1f}"
              f" {run['big_events_per_s']:13,.0f} {run['big_left']:9,}")
    return 0
