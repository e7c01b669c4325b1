"""Benchmark presets: another subcommand's ``main`` with default servers and options.

Each preset's ``--database-url`` (repeatable) replaces its default servers, and any other
option is handed on after the defaults, so it wins (``--rounds 9``, ``--seconds 60``):

* ``pg``: issue 22's PostgreSQL figures for the library against raw psycopg 3, in one run
  (about 1.5 minutes on the project's 2 cores): ``protocol --only commit --only claim --only
  write --only latency-raw`` on PostgreSQL 5432; claim + publish (4 worker processes,
  claim_batch (50) then mark_published each, against raw_pg.py's keyset pages of ids, then
  ``SELECT … WHERE id = ANY(…) … FOR UPDATE SKIP LOCKED``, one UPDATE; target >= 0.90), the
  write (business INSERT + create_in_transaction against psycopg 3's BEGIN, the same INSERT …
  RETURNING id, the library's event INSERT … RETURNING id, pg_notify(…), COMMIT; target >=
  0.90), claim latency with 200,000 published events of history (raw/library >= 0.90), and
  for reference the server's durable commits per second on one connection;
* ``drain``: the relay's drain rate on PostgreSQL beside MariaDB and MySQL, same sizes, same
  run (about 2 minutes): ``relay --only relay``, 4 fresh ``outbox-lite relay --until-empty``
  processes draining 15,000 events into BullMQ in batches of 100, start-up counted, taking
  turns with 4 processes of the raw twin and 4 that ``addBulk`` the same jobs with no
  database; each server's figures, then the drains side by side with the load average;
* ``listen``: COMMIT-to-broker latency on PostgreSQL at 5 events/s, the relay's LISTEN
  against polling alone, and the queries a second an idle relay sends (about 1.5 minutes):
  ``relay --only latency --wake all --rate 5``; targets with LISTEN: p50 <= 2 ms, p99 <= 10
  ms (at 5 events/s a run is 100 events, so its p99 is its second-slowest event).
"""

from __future__ import annotations

import argparse
from typing import Callable, Sequence

MARIADB = "mysql://root@127.0.0.1:3306/outbox_lite_test"
MYSQL = "mysql://root@127.0.0.1:3308/outbox_lite_test"
POSTGRESQL = "postgresql://postgres@127.0.0.1:5432/outbox_lite_test"

#: preset -> (subcommand module, default servers, default options, default measures)
PRESETS = {
    "pg": ("protocol", [POSTGRESQL],
           ["--rounds", "3", "--events", "4000", "--writes", "1000", "--loaded-rows", "200000"],
           ("commit", "claim", "write", "latency-raw")),
    "drain": ("relay", [MARIADB, MYSQL, POSTGRESQL],
              ["--only", "relay", "--events", "15000", "--rounds", "2", "--workers", "4",
               "--batch", "100"], ()),
    "listen": ("relay", [POSTGRESQL],
               ["--only", "latency", "--wake", "all", "--rate", "5", "--seconds", "20",
                "--idle-seconds", "10"], ()),
}


def run(target: Callable[[list[str]], int], description: str, default_urls: Sequence[str],
        defaults: Sequence[str], argv: list[str] | None = None,
        only: Sequence[str] = ()) -> int:
    """``target``'s exit status for the preset's servers and options; ``only`` (measures)
    is given as ``--only`` options unless the caller names measures of its own."""
    parser = argparse.ArgumentParser(description=description, add_help=False)
    parser.add_argument("--database-url", action="append")
    ours, rest = parser.parse_known_args(argv)
    urls = [arg for url in ours.database_url or default_urls
            for arg in ("--database-url", url)]
    chosen = [] if "--only" in rest else [arg for m in only for arg in ("--only", m)]
    return target([*urls, *chosen, *defaults, *rest])  # later options win


def main(name: str, argv: list[str]) -> int:
    """Run preset ``name`` with the options ``argv``."""
    import importlib

    module, urls, defaults, only = PRESETS[name]
    target = importlib.import_module(f"{__package__}.{module}").main
    return run(target, f"preset {name}: see scripts/benchmarks/presets.py", urls, defaults,
               argv, only=only)
