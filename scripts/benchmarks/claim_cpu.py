"""Where the client's CPU goes in one claim_batch(limit=50), the library against raw psycopg 3
(or PyMySQL), in one process, claim by claim in turn (about 1 minute):

    python scripts/bench.py claim-cpu [--database-url postgresql://postgres@127.0.0.1:5432/outbox_lite_test]
                                      [--rounds 6] [--claims 60]

Prints this process's CPU time per claim (``time.process_time``, which the machine's load
does not stretch as it stretches wall time) for:

* ``library``: ``claim_batch`` as it ships;
* ``raw``: the same statements without the library (raw_pg.py or
  raw_mysql.py), each payload decoded (``json.loads``);
* ``library, rows only``: ``claim_batch`` building no events (its ``_events`` replaced by a
  stand-in that returns bare objects): the library's statements, Peewee and its checks;
* ``+ payloads``, ``+ row dicts``, ``+ aware instants``: the events built step by step as
  the library builds them (payload decoded; the row as a dict of field values, the claim's
  changes and the headers; then the six instants made aware UTC), so each step's cost is the
  difference from the one before.

The claimed events' payloads and instants are the seeded ones, as a claim would read them.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


from outbox_lite import repository
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.models import aware

from . import protocol as bench
from ._setup import load, prepare, server_name

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/outbox_lite_test"


def _staged(level: int) -> type:
    """The repository with its event building cut at ``level`` (0: nothing built)."""
    class Staged(repository.OutboxRepository):
        def _events(self, rows: Any, changes: Any, dead_letter: Any, **values: Any) -> Any:
            events = []
            for row in rows:
                event = self.model.__new__(self.model)
                if level == 0:
                    event.__data__ = {"attempt_count": 0}
                elif level == 1:
                    json.loads(row[5])
                    event.__data__ = {"attempt_count": 0}
                else:
                    data = dict(zip(self._names, row))
                    if changes:
                        data.update(changes)
                    if level >= 3:  # as the library does it (models.aware)
                        for name in self._instants:
                            value = data[name]
                            if value is not None and value.tzinfo is None:
                                data[name] = aware(value)
                    data["payload"] = repository._decode_payload(data["payload"])
                    data["headers"] = repository._decode_headers(data["headers"])
                    event.__data__ = data
                events.append(event)
            return events
    return Staged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL,
                        help="server; runs in <database>_bench_cpu, created and dropped")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (default 6)")
    parser.add_argument("--claims", type=int, default=60,
                        help="claims of each side per round (default 60)")
    args = parser.parse_args(argv)
    base = DatabaseUrl.parse(args.database_url)
    url = base.with_name(f"{base.name}_bench_cpu")
    try:
        prepare(url)
        admin = bench.Bench(url, events=0, writes=0, loaded_rows=0, batch=50, workers=1)
        sides: dict[str, Any] = {"library": bench.Library(url), "raw": bench.Raw(url)}
        for level, name in enumerate(("library, rows only", "+ payloads", "+ row dicts",
                                      "+ aware instants")):
            client = bench.Library(url)
            client.repo = _staged(level)(client.db)
            sides[name] = client
        cpu = {name: 0.0 for name in sides}
        order = list(sides)
        for r in range(args.rounds):
            admin.sql("DELETE FROM outbox_event WHERE status = 'processing'")
            admin.seed(50 * args.claims * len(sides))
            admin.sql(admin.analyze)
            for i in range(args.claims):
                for name in order if (r + i) % 2 == 0 else order[::-1]:
                    started = time.process_time()
                    claimed = sides[name].claim("cpu", 50)
                    cpu[name] += time.process_time() - started
                    assert len(claimed) == 50
        for client in sides.values():
            client.close()
        admin.admin.close()
    finally:
        url.drop_database()
    claims = args.rounds * args.claims
    raw = cpu["raw"] / claims * 1000
    print(f"client CPU per claim of 50 events, ms ({server_name(base)};"
          f" {claims} claims each; load average"
          f" {load()})")
    for name, seconds in cpu.items():
        ms = seconds / claims * 1000
        print(f"  {name:<20} {ms:7.3f}   {ms - raw:+7.3f} against raw")
    return 0
