#!/usr/bin/env python3
"""Commit-to-broker latency on PostgreSQL at 5 events/s, the relay's LISTEN against polling
alone, same run, and the queries a second an idle relay sends (issue 22; about 1.5 minutes):

    python scripts/bench_listen.py [--database-url postgresql://postgres@127.0.0.1:5432/outbox_lite_test]
                                   [any option of bench_relay.py, e.g. --seconds 60]

scripts/bench_relay.py's latency measure (``--only latency --wake all``): a writer commits 5
business transactions a second for 20 s, each with one event through the repository (its
INSERT notifies ``outbox_event``); one relay publishes them to BullMQ; each event's delay is
from its COMMIT to its job's ``added`` entry in Redis (Redis's clock), p50, p99 and max. Two
relays in turn: ``listen``, the relay as it ships on PostgreSQL (LISTEN, polling every 2 s at
most), and ``none``, the same relay with its LISTEN turned off (polling, 50 ms at most).
Then each relay alone on the empty outbox for 10 s: its queries a second, counted by a proxy
in front of the server (PostgreSQL's Query and Execute messages, the relay's only), and, as a
cross-check, its database's transactions a second from pg_stat_database (coarser: a backend
reports its counts at most once a second, and up to 10 s late when it goes idle).
Targets with LISTEN: p50 <= 2 ms, p99 <= 10 ms. At 5 events/s a run is 100 events, so its
p99 is its second-slowest event.
"""

from __future__ import annotations

import sys

import bench_relay  # beside this script
import bench_preset

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/outbox_lite_test"
DEFAULTS = ["--only", "latency", "--wake", "all", "--rate", "5", "--seconds", "20",
            "--idle-seconds", "10"]


def main(argv: list[str] | None = None) -> int:
    return bench_preset.run(bench_relay.main, __doc__.split("\n\n")[0], [DEFAULT_URL], DEFAULTS,
                            argv)


if __name__ == "__main__":
    sys.exit(main())
