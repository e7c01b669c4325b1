"""The write path's cost of capturing the trace context (SPEC §11): a business INSERT plus
create_in_transaction in one transaction, with and without the ``[otel]`` extra, beside raw
PyMySQL doing the same two INSERTs, on each server, printed side by side in one run.

Four clients, one connection each, take turns in blocks of --block transactions (A B C D,
then D C B A, …) so the server's background work weighs on all alike:

* raw: PyMySQL ``BEGIN``, ``INSERT INTO job``, the event INSERT, ``COMMIT``
  (``write``'s baseline);
* no otel: the library as in a process without ``opentelemetry-api`` (``tracing`` finds no
  module: one cached check per write);
* otel, no span: the extra installed, no span current (the context is read and found empty);
* otel, span: the extra and the SDK, a span current (as in a request handler): the event's
  ``traceparent`` is formatted and stored in ``headers``, one more column of the INSERT.

The span is started once per block, not per write: the service's request span exists
whatever the outbox does; what is measured is the capture. Ratios are medians over blocks.
Usage: python scripts/bench.py trace-write [--database-url URL ...] [--writes 600]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from outbox_lite import OutboxRepository, tracing
from outbox_lite._families.url import DatabaseUrl

from ._setup import (MARIADB_AND_MYSQL, PAYLOAD, add_database_option, job_table,
                     scratch_database, take_turns)
from .write import JOB_INSERT, Raw, _server_name

_OTEL = tracing._otel()  # the modules, loaded once


class Library:
    name = "no otel"
    api: Any = None

    def __init__(self, url: DatabaseUrl, init: str) -> None:
        self.db = url.database(init_command=init)
        self.db.connect()
        self.repo = OutboxRepository(self.db)
        self.tracer = TracerProvider().get_tracer("bench")

    def block(self) -> Any:
        """What is current during a block (nothing here)."""
        tracing._api = self.api
        return _Nothing()

    def write(self, n: int) -> None:
        with self.db.atomic():
            job_id = self.db.execute_sql(JOB_INSERT, (f"library-{n}",)).lastrowid
            self.repo.create_in_transaction(
                event_type="job.created", aggregate_type="ai_job", aggregate_id=str(job_id),
                payload={**PAYLOAD, "job_id": n})

    def close(self) -> None:
        self.db.close()


class OtelNoSpan(Library):
    name = "otel, no span"
    api = _OTEL


class OtelSpan(Library):
    name = "otel, span"
    api = _OTEL

    def block(self) -> Any:
        tracing._api = self.api
        return self.tracer.start_as_current_span("POST /jobs")


class RawClient(Raw):
    def block(self) -> Any:
        return _Nothing()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def measure(url: DatabaseUrl, writes: int, block: int) -> dict[str, Any]:
    init = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
    clients = [RawClient(url, {"init_command": init}), Library(url, init), OtelNoSpan(url, init),
               OtelSpan(url, init)]
    spent, per_block = take_turns(clients, writes, block, around=lambda client: client.block())
    for client in clients:
        client.close()
    tracing._api = _OTEL

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(per_block[a], per_block[b]))

    return {"rates": {name: writes / s for name, s in spent.items()},
            "span/no otel": ratio("otel, span", "no otel"),
            "no span/no otel": ratio("otel, no span", "no otel"),
            "no otel/raw": ratio("no otel", "raw"), "span/raw": ratio("otel, span", "raw")}


def capture_cost(calls: int = 200_000) -> dict[str, float]:
    """Microseconds per ``tracing.capture`` call, without the servers' noise: the extra
    missing, installed with no span current, and with a span current."""
    tracer = TracerProvider().get_tracer("bench")
    costs = {}
    for name, api, span in (("no otel", None, False), ("otel, no span", _OTEL, False),
                            ("otel, span", _OTEL, True)):
        tracing._api = api
        with tracer.start_as_current_span("POST /jobs") if span else _Nothing():
            started = time.perf_counter()
            for _ in range(calls):
                tracing.capture({})
            costs[name] = (time.perf_counter() - started) / calls * 1e6
    tracing._api = _OTEL
    return costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_trace_<pid>", repeat=True,
                        default="MariaDB :3306 and MySQL :3308")
    parser.add_argument("--writes", type=int, default=600, help="transactions per client")
    parser.add_argument("--block", type=int, default=25, help="turn size (default 25)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    for text in args.database_url or MARIADB_AND_MYSQL:
        base = DatabaseUrl.parse(text)
        with scratch_database(base, f"bench_trace_{os.getpid()}", job_table(base)) as url:
            rows.append((_server_name(base), measure(url, args.writes, args.block)))
    costs = capture_cost()
    load_after = os.getloadavg()
    print("tracing.capture alone, µs per write: " + ", ".join(
        f"{name} {cost:.2f}" for name, cost in costs.items()))
    print("write (business INSERT + event, READ COMMITTED): txn/s per client; ratios ="
          " medians of the blocks' ratios")
    print(f"{'server':<14} {'raw':>7} {'no otel':>8} {'otel,nospan':>11} {'otel,span':>10}"
          f" {'nospan/none':>11} {'span/none':>10} {'none/raw':>9} {'span/raw':>9}")
    for name, r in rows:
        q = r["rates"]
        print(f"{name:<14} {q['raw']:>7.0f} {q['no otel']:>8.0f} {q['otel, no span']:>11.0f}"
              f" {q['otel, span']:>10.0f} {r['no span/no otel']:>11.3f}"
              f" {r['span/no otel']:>10.3f} {r['no otel/raw']:>9.3f} {r['span/raw']:>9.3f}")
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after"
          f" {' '.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} cores, shared)")
    return 0
