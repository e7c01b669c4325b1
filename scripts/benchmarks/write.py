"""The write, with a dedupe_key: a business INSERT plus create_in_transaction in one
transaction, against raw PyMySQL doing the same two INSERTs, on each server, directly and
through a link with 1 ms of delay each way, printed side by side in one run.

Each configuration (server x link x isolation level) runs three clients, one connection
each, taking turns in blocks of --block transactions (A B C, then C B A, …) so the server's
background work weighs on all alike:

* library: ``INSERT INTO job`` + ``create_in_transaction(..., dedupe_key=...)`` in
  ``database.atomic()``;
* raw: PyMySQL ``BEGIN``, the same ``INSERT INTO job``, the event INSERT with the same
  columns and a dedupe_key, ``COMMIT``: no duplicate check at all (what the library must come
  close to);
* peewee: the raw statements through Peewee's ``atomic()`` and ``execute_sql``, no
  outbox_lite (reference: what of the gap is Peewee's).
* packed (MariaDB and MySQL): the library on a connection allowing multiple statements (the
  URL option ``multi_statements=true``), whose keyed write at REPEATABLE READ is one packet.

The ratio is the median over blocks of library/raw throughput; beside it, each client's own
CPU a write (``time.thread_time``: its Python and driver, not the server's or the delay
proxy's). Every client's connection is warm before timing (the library asks the server about
the session, ``max_allowed_packet`` and the table once per connection; that is not the common
case, so it is left out of both). The isolation level is set per session (``init_command``),
for every client alike, so no client pays a ``SET TRANSACTION`` the others do not.

The delayed link: this machine's kernel has no ``sch_netem`` (``tc qdisc … netem`` answers
"unknown qdisc"), and delaying the loopback would slow every other user of the shared
servers. So the script runs its own userspace TCP proxy (asyncio, in a thread): every chunk
read from one side is written to the other 1 ms after it arrived (``--delay-ms``), in order,
each way: a round trip costs 2 ms more, as between a service and a server 1 ms apart. The
proxy's own CPU is paid by all three clients alike. The load average is printed with the
figures: the machine is shared.

On PostgreSQL (a ``postgresql://`` URL) the raw client is psycopg 3 sending the library's own
statement, ``INSERT … ON CONFLICT (dedupe_key) DO NOTHING RETURNING id, pg_notify(…)``
(raw_pg.py), the business row's id read with ``RETURNING id`` by every client,
and the level set per session with ``options=-c default_transaction_isolation=…``.

Usage: python scripts/bench.py write [--database-url URL ...] [--writes 600]
       [--delayed-writes 150] [--delay-ms 1] [--levels "REPEATABLE READ" "READ COMMITTED"]
PostgreSQL beside MariaDB and MySQL, READ COMMITTED only (about 1 minute):
       python scripts/bench.py write --database-url postgresql://postgres@127.0.0.1:5432/outbox_lite \
           --database-url mysql://root@127.0.0.1:3306/outbox_lite \
           --database-url mysql://root@127.0.0.1:3308/outbox_lite --levels "READ COMMITTED"
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import time
from typing import Any, Iterator

import pymysql

from outbox_lite import OutboxRepository
from outbox_lite._families.url import DatabaseUrl

from . import raw_pg
from ._proxies import DelayProxy
from ._setup import (EVENT_INSERT, MARIADB_AND_MYSQL, PAYLOAD, add_database_option, job_table,
                     scratch_database, server_name, take_turns, utcnow)
from ._setup import is_postgresql as _is_pg

JOB_INSERT = "INSERT INTO job (name) VALUES (%s)"


# ---------------------------------------------------------------------------
# The three clients
# ---------------------------------------------------------------------------

def _row(job_id: int, n: int) -> tuple[Any, ...]:
    now = utcnow()
    return ("job.created", "ai_job", str(job_id), f"job-{job_id}-created",
            json.dumps({**PAYLOAD, "job_id": n}, separators=(",", ":")), now, now, now)


PG_JOB_INSERT = "INSERT INTO job (name) VALUES (%s) RETURNING id"


def _pg_values(job_id: int, n: int) -> dict[str, Any]:
    """_row's values as the PostgreSQL family's INSERT names them."""
    row = _row(job_id, n)
    return {"event_type": row[0], "aggregate_type": row[1], "aggregate_id": row[2],
            "dedupe_key": row[3], "payload": row[4], "available_at": row[5],
            "created_at": row[6], "updated_at": row[7], "headers": None, "expires_at": None}


def _session_options(url: DatabaseUrl, level: str) -> dict[str, Any]:
    """The connection options that set the session's isolation level ``level``."""
    if _is_pg(url):
        return {"options": "-c default_transaction_isolation=" + level.lower().replace(" ",
                                                                                    "\\ ")}
    return {"init_command": f"SET SESSION TRANSACTION ISOLATION LEVEL {level}"}


class Raw:
    name = "raw"

    def __init__(self, url: DatabaseUrl, init: dict[str, Any]) -> None:
        self.pg = _is_pg(url)
        self.conn: Any
        if self.pg:
            import psycopg

            self.conn = psycopg.connect(host=url.host, port=url.port, user=url.user,
                                        password=url.password or None, dbname=url.name,
                                        autocommit=True, **init)
        else:
            self.conn = pymysql.connect(host=url.host, port=url.port, user=url.user,
                                        password=url.password, database=url.name,
                                        charset="utf8mb4", autocommit=True, **init)

    def write(self, n: int) -> None:
        with self.conn.cursor() as cur:
            if self.pg:
                cur.execute("BEGIN")
                (job_id,) = cur.execute(PG_JOB_INSERT, (f"raw-{n}",)).fetchone()
                raw_pg.insert_event(cur, _pg_values(job_id, n), keyed=True)
                cur.execute("COMMIT")
                return
            self.conn.begin()
            cur.execute(JOB_INSERT, (f"raw-{n}",))
            cur.execute(EVENT_INSERT, _row(cur.lastrowid, n))
            self.conn.commit()

    def close(self) -> None:
        self.conn.close()


class Library:
    name = "library"

    def __init__(self, url: DatabaseUrl, init: dict[str, Any]) -> None:
        self.pg = _is_pg(url)
        self.db = url.database(**init)
        self.db.connect()
        self.repo = OutboxRepository(self.db)

    def _job(self, name: str) -> int:
        if self.pg:
            return int(self.db.execute_sql(PG_JOB_INSERT, (name,)).fetchone()[0])
        return int(self.db.execute_sql(JOB_INSERT, (name,)).lastrowid)

    def write(self, n: int) -> None:
        with self.db.atomic():
            job_id = self._job(f"library-{n}")
            self.repo.create_in_transaction(
                event_type="job.created", aggregate_type="ai_job", aggregate_id=str(job_id),
                payload={**PAYLOAD, "job_id": n}, dedupe_key=f"job-{job_id}-created")

    def close(self) -> None:
        self.db.close()


class Packed(Library):
    """The library on a connection allowing multiple statements (the URL option
    ``multi_statements=true``): at REPEATABLE READ its keyed write is one packet."""

    name = "packed"

    def __init__(self, url: DatabaseUrl, init: dict[str, Any]) -> None:
        options = tuple(sorted({**dict(url.options), "multi_statements": True}.items()))
        super().__init__(dataclasses.replace(url, options=options), init)


class PeeweeOnly(Library):
    name = "peewee"

    def write(self, n: int) -> None:
        with self.db.atomic():
            job_id = self._job(f"peewee-{n}")
            if self.pg:
                self.db.execute_sql(raw_pg.INSERT_UNLESS_TAKEN, _pg_values(job_id, n))
            else:
                self.db.execute_sql(EVENT_INSERT, _row(job_id, n))


def measure(url: DatabaseUrl, level: str, writes: int, block: int) -> dict[str, Any]:
    """Transactions per second of each client and the median of the blocks' library/raw
    ratios, ``writes`` transactions each."""
    init = _session_options(url, level)
    clients = [Library(url, init), Raw(url, init), PeeweeOnly(url, init)]
    if not _is_pg(url):  # PostgreSQL's write is one statement on any connection
        clients.append(Packed(url, init))
    cpu: dict[str, list[float]] = {client.name: [] for client in clients}

    @contextlib.contextmanager
    def cpu_of(client: Any) -> Iterator[None]:
        started = time.thread_time()  # this thread's CPU: the client's Python and driver
        yield
        cpu[client.name].append(time.thread_time() - started)

    spent, per_block = take_turns(clients, writes, block, around=cpu_of)
    for client in clients:
        client.close()
    rates = {name: writes / seconds for name, seconds in spent.items()}
    # each client's first block is take_turns' warm-up (its connection's questions): left out
    cpu_us = {name: sum(blocks[1:]) / writes * 1e6 for name, blocks in cpu.items()}

    def ratio(name: str) -> float | None:
        if name not in per_block:
            return None
        return statistics.median(a / b for a, b in zip(per_block[name], per_block["raw"]))

    return {**rates, "ratio": ratio("library"), "peewee_ratio": ratio("peewee"),
            "packed_ratio": ratio("packed"), "cpu_us": cpu_us}


def _server_name(url: DatabaseUrl) -> str:
    return server_name(url, where=False, short=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_write_<pid>", repeat=True,
                        default="MariaDB :3306 and MySQL :3308")
    parser.add_argument("--writes", type=int, default=600,
                        help="transactions per client, direct link (default 600)")
    parser.add_argument("--delayed-writes", type=int, default=150,
                        help="transactions per client, delayed link (default 150)")
    parser.add_argument("--block", type=int, default=25, help="turn size (default 25)")
    parser.add_argument("--delay-ms", type=float, default=1.0,
                        help="delay each way on the delayed link (default 1 ms)")
    parser.add_argument("--levels", nargs="+", default=["REPEATABLE READ", "READ COMMITTED"],
                        help="session isolation levels (default both)")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    rows = []
    for text in args.database_url or MARIADB_AND_MYSQL:
        base = DatabaseUrl.parse(text)
        name = _server_name(base)
        with scratch_database(base, f"bench_write_{os.getpid()}", job_table(base)) as url:
            proxy = DelayProxy((url.host, url.port), args.delay_ms / 1000)
            delayed = dataclasses.replace(url, host="127.0.0.1", port=proxy.port)
            try:
                for level in args.levels:
                    for link, target, writes in (("direct", url, args.writes),
                                                 (f"+{args.delay_ms:g} ms each way", delayed,
                                                  args.delayed_writes)):
                        rows.append((name, level, link, measure(target, level, writes,
                                                                 args.block)))
            finally:
                proxy.close()
    load_after = os.getloadavg()

    print("write with a dedupe_key: business INSERT + event, one transaction; txn/s per"
          " client, library/raw = median of the blocks' ratios")
    print(f"{'server':<14} {'level':<16} {'link':<18} {'library':>8} {'raw':>8} {'peewee':>8}"
          f" {'packed':>8} {'lib/raw':>8} {'peewee/raw':>10} {'packed/raw':>10}  target 0.90")
    for name, level, link, r in rows:
        best = max(x for x in (r["ratio"], r["packed_ratio"]) if x is not None)
        verdict = "met" if best >= 0.90 else "MISSED"
        packed = "-" if r["packed_ratio"] is None else f"{r['packed']:.0f}"
        packed_ratio = "-" if r["packed_ratio"] is None else f"{r['packed_ratio']:.3f}"
        print(f"{name:<14} {level:<16} {link:<18} {r['library']:>8.0f} {r['raw']:>8.0f}"
              f" {r['peewee']:>8.0f} {packed:>8} {r['ratio']:>8.3f} {r['peewee_ratio']:>10.3f}"
              f" {packed_ratio:>10}  {verdict}")
    print("the client's own CPU a write (its thread's, µs: Python and driver, not the delay"
          " proxy's; the rest of a write's time is the server's and the wire's)")
    print(f"{'server':<14} {'level':<16} {'link':<18} {'library':>8} {'raw':>8} {'peewee':>8}"
          f" {'packed':>8}")
    for name, level, link, r in rows:
        cpu = r["cpu_us"]
        packed = f"{cpu['packed']:.0f}" if "packed" in cpu else "-"
        print(f"{name:<14} {level:<16} {link:<18} {cpu['library']:>8.0f} {cpu['raw']:>8.0f}"
              f" {cpu['peewee']:>8.0f} {packed:>8}")
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after"
          f" {' '.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} cores, shared)")
    return 0
