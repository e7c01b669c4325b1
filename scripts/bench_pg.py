#!/usr/bin/env python3
"""Issue 22's PostgreSQL figures for the library against raw psycopg 3, in one run (about
1.5 minutes on the project's 2 cores):

    python scripts/bench_pg.py [--database-url postgresql://postgres@127.0.0.1:5432/outbox_lite_test]
                               [any option of scripts/bench.py, e.g. --rounds 9]

* claim + publish: 4 worker processes, claim_batch (50) then mark_published each, against
  the same protocol in psycopg 3 (scripts/bench_raw_pg.py: keyset pages of ids, then
  ``SELECT … WHERE id = ANY(…) … FOR UPDATE SKIP LOCKED``, one UPDATE); target >= 0.90;
* write: a business INSERT + create_in_transaction in one transaction against psycopg 3's
  BEGIN, the same INSERT … RETURNING id, the library's event INSERT (… RETURNING id,
  pg_notify(…)), COMMIT; target >= 0.90;
* claim latency with 200,000 published events of history in the table: the library's
  claim_batch against the raw claim on the same table, claim by claim; target raw/library
  >= 0.90;
* for reference, the server's durable commits per second on one connection.

Each is scripts/bench.py's measure of that name (``--only commit claim write latency-raw``),
which prints the load average beside every figure; the ratio is the median of the rounds'
own ratios. Give ``--database-url`` more than once to put servers side by side (a MariaDB
or MySQL URL runs the same measures against raw PyMySQL).
"""

from __future__ import annotations

import sys

import bench  # beside this script
import bench_preset

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/outbox_lite_test"
MEASURES = ("commit", "claim", "write", "latency-raw")
DEFAULTS = ["--rounds", "3", "--events", "4000", "--writes", "1000",
            "--loaded-rows", "200000"]


def main(argv: list[str] | None = None) -> int:
    return bench_preset.run(bench.main, __doc__.split("\n\n")[0], [DEFAULT_URL], DEFAULTS, argv,
                            only=MEASURES)


if __name__ == "__main__":
    sys.exit(main())
