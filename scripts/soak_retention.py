#!/usr/bin/env python3
"""Retention's soak (issue 33, part 1; not in CI): storage stays flat under a steady write rate.

    python scripts/soak_retention.py [--database-url URL] [--rate 200] [--minutes 10]
                                     [--retain 60] [--sample-every 15]

Two runs at once on the same server, each in a fresh database of its own
(``<database>_soak_retain_<pid>`` and ``<database>_soak_keep_<pid>``, dropped at the end), so
that both meet the same load: writers commit ``--rate`` events a second (one event per
transaction, ``--writers`` threads each on a fixed schedule of its own share: a late write
does not push the schedule back, and a writer more than 1 s behind skips the slots it missed
rather than bursting to catch up, so the rate never exceeds ``--rate``) while a relay
publishes them to a publisher that takes everything; the first relay retains ``--retain``
seconds (``Relay(retain=...)``, its default ``retain_every``), the second keeps every event.
Every ``--sample-every`` seconds each run reads its table's rows per status and its size on disk
(MySQL and MariaDB: ``ANALYZE TABLE``, then ``information_schema.TABLES`` data_length +
index_length, and the tablespace file's size; PostgreSQL: ``pg_total_relation_size``).
Prints one table per run, the writers' p50/p99 latency (BEGIN to COMMIT) per run, the rate
reached, and the bounds checked: rows at most rate × (retain + 2 × retain_every); the size by
the server's statistics at most 1.5 × that many rows at the keep-everything run's bytes per row
(at its end); the file's size over the second half of the run at most 1.5 × its size at
``retain + 2 min`` (flat, where the keep-everything run's grows all along). On PostgreSQL the
space of deleted rows comes back only through VACUUM: with the server's autovacuum off, give
``--vacuum-every 60`` to VACUUM the table as autovacuum would (the first line says which).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout too

from outbox_lite import OutboxRepository  # noqa: E402
from outbox_lite import migrate as schema  # noqa: E402
from outbox_lite._families.url import DatabaseUrl  # noqa: E402
from outbox_lite.relay import Relay  # noqa: E402
from outbox_lite._named_lock import default_retain_every  # noqa: E402

DEFAULT_URL = "mysql://root@127.0.0.1:3306/outbox_lite_test"
PAYLOAD = {"order": 0, "customer": "c-000000", "lines": [{"sku": "sku-0000", "qty": 1}] * 3,
           "note": "x" * 120}


class TakeAll:
    """A publisher that takes every event (the broker is not what this measures)."""

    def publish(self, events: Sequence[Any]) -> dict[int, BaseException]:
        return {}

    def close(self) -> None:
        pass


def _is_pg(url: DatabaseUrl) -> bool:
    return url.scheme.startswith("postgres")


def _size(database: Any, url: DatabaseUrl) -> tuple[int, int]:
    """(bytes by the server's statistics, bytes of the table's file(s))."""
    if _is_pg(url):
        total = database.execute_sql(
            "SELECT pg_total_relation_size('outbox_event')").fetchone()[0]
        return int(total), int(total)
    database.execute_sql("ANALYZE TABLE outbox_event").fetchall()
    stats = database.execute_sql(
        "SELECT data_length + index_length FROM information_schema.TABLES"
        " WHERE table_schema = DATABASE() AND table_name = 'outbox_event'").fetchone()[0]
    name = f"{url.name}/outbox_event"
    for table in ("INNODB_TABLESPACES", "INNODB_SYS_TABLESPACES"):
        try:
            row = database.execute_sql(
                f"SELECT FILE_SIZE FROM information_schema.{table} WHERE NAME = %s",
                (name,)).fetchone()
        except Exception:  # noqa: BLE001 - the other server's name for it
            continue
        if row is not None:
            return int(stats), int(row[0])
    return int(stats), -1


def run_one(url: DatabaseUrl, retain: float | None, rate: float, seconds: float,
            sample_every: float, writers: int, vacuum_every: float) -> dict[str, Any]:
    """One run in ``url``'s (fresh) database; returns its samples and latencies."""
    url.drop_database()
    url.create_database()
    setup = url.database()
    schema.migrate(setup)
    setup.close()
    stop = threading.Event()
    latencies: list[float] = []
    late = [0]
    skipped = [0]
    errors: list[str] = []

    def write(k: int) -> None:
        database = url.database()
        repo = OutboxRepository(database)
        start = time.monotonic() + k / rate
        n = 0
        share = rate / writers
        while not stop.is_set():
            due = start + n / share
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            elif now - due > 1.0:  # a second behind: skip the slots, never burst to catch up
                skip = int((now - start) * share) - n
                skipped[0] += skip
                n += skip
            elif now - due > 0.05:
                late[0] += 1
            began = time.monotonic()
            try:
                with database.atomic():
                    repo.create_in_transaction(event_type="order.placed",
                                               aggregate_type="order",
                                               aggregate_id=f"{k}-{n}",
                                               payload=PAYLOAD)
            except Exception as exc:  # noqa: BLE001 - counted and shown, the run goes on
                errors.append(repr(exc))
            latencies.append(time.monotonic() - began)
            n += 1
        database.close()

    relay_db = url.database()
    relay = Relay(OutboxRepository(relay_db), TakeAll(), retain=retain, progress_every=0)
    threads = [threading.Thread(target=write, args=(k,), name=f"writer-{k}")
               for k in range(writers)]
    threads.append(threading.Thread(target=relay.run, args=(stop,), name="relay"))
    for thread in threads:
        thread.start()
    sampler = url.database()
    samples = []
    started = time.monotonic()
    vacuumed = started
    try:
        while True:
            elapsed = time.monotonic() - started
            if vacuum_every and time.monotonic() - vacuumed >= vacuum_every:
                sampler.execute_sql("VACUUM outbox_event")  # as autovacuum would
                vacuumed = time.monotonic()
            counts = dict(sampler.execute_sql(
                "SELECT status, COUNT(*) FROM outbox_event GROUP BY status").fetchall())
            stats_bytes, file_bytes = _size(sampler, url)
            window = latencies[-int(rate * sample_every):]
            samples.append({"t": round(elapsed), "rows": sum(counts.values()),
                            "published": counts.get("published", 0),
                            "pending": counts.get("pending", 0),
                            "stats_bytes": stats_bytes, "file_bytes": file_bytes,
                            "p99_ms": _pct(window, 0.99) * 1000,
                            "retained": relay.stats.retained})
            if elapsed >= seconds:
                break
            time.sleep(max(0.0, started + len(samples) * sample_every - time.monotonic()))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sampler.close()
        relay_db.close()
        url.drop_database()
    return {"retain": retain, "samples": samples, "writes": len(latencies),
            "rate": len(latencies) / max(1.0, samples[-1]["t"]),
            "p50_ms": _pct(latencies, 0.50) * 1000, "p99_ms": _pct(latencies, 0.99) * 1000,
            "late": late[0], "skipped": skipped[0], "errors": errors[:5],
            "error_count": len(errors),
            "retained": relay.stats.retained, "published": relay.stats.published}


def _vacuum_note(url: DatabaseUrl, args: argparse.Namespace) -> str:
    """PostgreSQL: whether the server's autovacuum runs, and this run's own VACUUMs."""
    if not _is_pg(url):
        return ""
    conn = url.server_connection()
    try:
        cur = conn.cursor()
        cur.execute("SHOW autovacuum")
        setting = cur.fetchone()[0]
    finally:
        conn.close()
    own = (f", a VACUUM every {args.vacuum_every:g} s by the soak" if args.vacuum_every
           else "")
    return f"; the server's autovacuum {setting}{own}"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _report(name: str, run: dict[str, Any], rate: float, args: argparse.Namespace,
            keep: dict[str, Any]) -> bool:
    print(f"\n{name}: {run['writes']:,} writes ({run['rate']:.0f}/s),"
          f" {run['published']:,} published,"
          f" {run['retained']:,} deleted by retention; writers p50 {run['p50_ms']:.2f} ms,"
          f" p99 {run['p99_ms']:.2f} ms; {run['late']} writes started >50 ms late,"
          f" {run['skipped']} skipped (over 1 s late),"
          f" {run['error_count']} errors {run['errors']}")
    print(f"{'t (s)':>6} {'rows':>8} {'published':>9} {'pending':>7} {'stats MB':>9}"
          f" {'file MB':>8} {'p99 ms':>7} {'retained':>9}")
    for s in run["samples"]:
        print(f"{s['t']:>6} {s['rows']:>8,} {s['published']:>9,} {s['pending']:>7,}"
              f" {s['stats_bytes'] / 2**20:>9.2f} {s['file_bytes'] / 2**20:>8.2f}"
              f" {s['p99_ms']:>7.2f} {s['retained']:>9,}")
    if run["retain"] is None:
        return True
    every = default_retain_every(dt.timedelta(seconds=args.retain))
    bound = rate * (args.retain + 2 * every)
    rows_max = max(s["rows"] for s in run["samples"])
    ok = rows_max <= bound
    print(f"bound: rows <= rate x (retain + 2 x retain_every) = {rate:g} x ({args.retain:g}"
          f" + 2 x {every:g}) = {bound:,.0f}: max {rows_max:,} {'ok' if ok else 'EXCEEDED'}")
    last = keep["samples"][-1]
    per_row = last["stats_bytes"] / max(1, last["rows"])
    size_bound = 1.5 * bound * per_row
    size_max = max(s["stats_bytes"] for s in run["samples"])
    fits = size_max <= size_bound
    print(f"bound: size by statistics <= 1.5 x {bound:,.0f} rows x {per_row:.0f} B (the keep"
          f" run's bytes per row) = {size_bound / 2**20:.2f} MB: max {size_max / 2**20:.2f} MB"
          f" {'ok' if fits else 'EXCEEDED'}")
    ok = ok and fits
    at = [s for s in run["samples"] if s["t"] >= args.retain + 120]
    half = [s for s in run["samples"] if s["t"] >= run["samples"][-1]["t"] / 2]
    if at and half and at[0]["file_bytes"] > 0:
        first, top = at[0]["file_bytes"], max(s["file_bytes"] for s in half)
        flat = top <= 1.5 * first
        print(f"bound: file size over the second half <= 1.5 x its size at t={at[0]['t']} s"
              f" ({first / 2**20:.2f} MB): max {top / 2**20:.2f} MB"
              f" {'ok' if flat else 'EXCEEDED'}; keep-everything's file at the end:"
              f" {last['file_bytes'] / 2**20:.2f} MB")
        ok = ok and flat
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL, metavar="URL")
    parser.add_argument("--rate", type=float, default=200.0, help="events a second (200)")
    parser.add_argument("--minutes", type=float, default=10.0, help="each run's length (10)")
    parser.add_argument("--retain", type=float, default=60.0, help="seconds retained (60)")
    parser.add_argument("--sample-every", type=float, default=15.0, help="seconds (15)")
    parser.add_argument("--writers", type=int, default=4, help="writer threads (4)")
    parser.add_argument("--vacuum-every", type=float, default=0.0, metavar="SECONDS",
                        help="PostgreSQL: a plain VACUUM of the table every SECONDS in both"
                             " runs, as autovacuum would (for a server where it is off;"
                             " default 0: leave it to the server)")
    parser.add_argument("--mode", choices=["retain", "keep"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    base = DatabaseUrl.parse(args.database_url)
    if args.mode:  # one run, in a process of its own: the parent starts both at once
        url = base.with_name(f"{base.name}_soak_{args.mode}_{os.getppid()}")
        run = run_one(url, args.retain if args.mode == "retain" else None, args.rate,
                      args.minutes * 60, args.sample_every, args.writers, args.vacuum_every)
        print(json.dumps(run))
        return 0
    print(f"soak on {base.scheme}://{base.host}:{base.port}: {args.rate:g} events/s for"
          f" {args.minutes:g} min, retain {args.retain:g} s beside keep-everything;"
          f" load before {os.getloadavg()[0]:.2f}{_vacuum_note(base, args)}", flush=True)
    children = {mode: subprocess.Popen([sys.executable, __file__, *(argv or sys.argv[1:]),
                                        "--mode", mode], stdout=subprocess.PIPE, text=True)
                for mode in ("retain", "keep")}
    runs = {}
    for mode, child in children.items():
        out, _ = child.communicate()
        if child.returncode != 0:
            print(f"{mode} run failed ({child.returncode})")
            return 1
        runs[mode] = json.loads(out.strip().splitlines()[-1])
    ok = _report(f"retain {args.retain:g} s", runs["retain"], args.rate, args, runs["keep"])
    _report("keep everything", runs["keep"], args.rate, args, runs["keep"])
    print(f"\nwriters' p99: {runs['retain']['p99_ms']:.2f} ms with retention,"
          f" {runs['keep']['p99_ms']:.2f} ms without; load after {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
