"""The benchmarks, one module a subcommand of ``scripts/bench.py``; each module's ``main(argv)``
takes that subcommand's options. This file imports none of them (and nothing of outbox_lite):
the relay's fresh twin processes start through it as fast as their drivers let them."""

from __future__ import annotations

import importlib
import sys

#: subcommand -> (module, what it measures).
SUBCOMMANDS = {
    "protocol": ("protocol", "claim, write, latency and commit measures: library vs raw driver"),
    "write": ("write", "the keyed write, library vs raw, direct and through a 1 ms link"),
    "relay": ("relay", "the relay's drain to BullMQ vs a raw twin, and COMMIT-to-broker latency"),
    "instructions": ("instructions", "CPU instructions and statements per event, library vs raw"),
    "claim-cpu": ("claim_cpu", "client CPU per claim of 50, step by step"),
    "brokers": ("brokers", "the relay to RabbitMQ and NATS JetStream beside BullMQ"),
    "celery": ("celery", "the relay to Celery on Redis beside BullMQ"),
    "fairness": ("fairness", "one relay process for two databases: a backlog's delay on the other"),
    "peers": ("peers", "writes and drains beside procrastinate on the same PostgreSQL"),
    "bullmq": ("bullmq_publisher", "the BullMQ publisher against addBulk alone"),
    "inbox": ("inbox", "the inbox's cost per message"),
    "metrics": ("metrics", "what Prometheus metrics cost a relay"),
    "migration": ("migration", "migration 006 on a large table under writes"),
    "clock": ("clock", "the server clock's cost"),
    "write-locks": ("write_locks", "what each one-round-trip keyed write locks at REPEATABLE READ"),
    "trace-write": ("trace_write", "the write with tracing on and off"),
    "trace-wake": ("trace_wake", "one wake-up's steps, COMMIT to BullMQ, beside the raw floor"),
    "pg": ("presets", "preset: protocol's PostgreSQL measures (issue 22)"),
    "drain": ("presets", "preset: relay's drain on MariaDB, MySQL and PostgreSQL"),
    "listen": ("presets", "preset: relay's latency on PostgreSQL, LISTEN vs polling"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    return ("usage: python scripts/bench.py SUBCOMMAND [options]  (SUBCOMMAND --help for its"
            " options)\n\nsubcommands:\n" + "\n".join(
                f"  {name:<{width}}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()))


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand named first in ``argv`` (default: the command line)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in SUBCOMMANDS:
        print(usage(), file=sys.stderr if args and args[0] not in ("-h", "--help") else
              sys.stdout)
        return 0 if args and args[0] in ("-h", "--help") else 2
    name, rest = args[0], args[1:]
    sys.argv[0] = f"bench.py {name}"  # argparse's usage line names the subcommand
    module = importlib.import_module(f"{__name__}.{SUBCOMMANDS[name][0]}")
    if module.__name__.endswith(".presets"):
        return int(module.main(name, rest))
    return int(module.main(rest))
