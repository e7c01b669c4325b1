#!/usr/bin/env python3
"""The relay's drain rate on PostgreSQL beside MariaDB and MySQL, same sizes, same run
(issue 22; about 2 minutes on the project's 2 cores):

    python scripts/bench_drain.py [--database-url URL ...] [any option of bench_relay.py]

Default servers: MariaDB mysql://root@127.0.0.1:3306/outbox_lite_test, MySQL
mysql://root@127.0.0.1:3308/outbox_lite_test, PostgreSQL
postgresql://postgres@127.0.0.1:5432/outbox_lite_test. On each in turn,
scripts/bench_relay.py's throughput measure (``--only relay``): 4 fresh ``outbox-lite relay
--until-empty`` processes drain 15,000 events into BullMQ in batches of 100, start-up counted,
taking turns with 4 processes of a raw twin (the same claim in PyMySQL or psycopg 3, the
same bullmq calls, no outbox_lite) and 4 that ``addBulk`` the same jobs with no database.
Prints each server's figures, then the drains side by side with the load average.
"""

from __future__ import annotations

import sys

import bench_relay  # beside this script
import bench_preset

DEFAULT_URLS = ["mysql://root@127.0.0.1:3306/outbox_lite_test",
                "mysql://root@127.0.0.1:3308/outbox_lite_test",
                "postgresql://postgres@127.0.0.1:5432/outbox_lite_test"]
DEFAULTS = ["--only", "relay", "--events", "15000", "--rounds", "2", "--workers", "4",
            "--batch", "100"]


def main(argv: list[str] | None = None) -> int:
    return bench_preset.run(bench_relay.main, __doc__.split("\n\n")[0], DEFAULT_URLS, DEFAULTS,
                            argv)


if __name__ == "__main__":
    sys.exit(main())
