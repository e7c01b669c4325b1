"""What metrics cost a relay: the same relay with and without a RelayMetrics, in one run.

Each round seeds ``--events`` events and drains them with one in-process relay (batches of
``--batch``, a publisher that publishes nowhere, so the relay's own work is all there is to
measure: claim, record, and the metrics calls), the two sides taking turns. Per relay round
(one claim + publish + record): the wall time and the CPU time of this process, medians over
the drains, and with/without as the median of each back-to-back pair's ratio. Then the
pieces, alone: the metrics calls of one round of ``--batch`` events (against the round's CPU
without them), one scrape (collect and the text format), and one ``stats()`` reading, which a
relay with metrics takes every ``stats_every`` seconds (15 by default): its cost spread over
that time.

Usage: python scripts/bench.py metrics [--database-url URL] [--rounds 9] [--events 10000]
       [--batch 100] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


from prometheus_client import CollectorRegistry, generate_latest

from outbox_lite import OutboxRepository
from outbox_lite.metrics import RelayMetrics
from outbox_lite.relay import Relay, RoundResult

from ._setup import add_database_option, scratch_database

PAYLOAD = {"job_id": 0, "model": "small", "prompt": "resize the picture to 512x512"}


class _Nowhere:
    def publish(self, events: Any) -> dict[int, BaseException]:
        return {}

    def close(self) -> None:
        pass


def _seed(repo: OutboxRepository, count: int) -> None:
    database = repo.database
    for start in range(0, count, 1000):
        with database.atomic():
            for n in range(start, min(count, start + 1000)):
                repo.create_in_transaction(event_type="job.created", aggregate_type="job",
                                           aggregate_id=str(n), payload={**PAYLOAD, "job_id": n})


def _drain(repo: OutboxRepository, batch: int, metrics: RelayMetrics | None,
           ) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, rounds that claimed) of one relay draining the outbox."""
    relay = Relay(repo, _Nowhere(), batch_size=batch, progress_every=0, metrics=metrics)
    wall, cpu = time.perf_counter(), time.process_time()
    relay.run(until_empty=True)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, relay.stats.rounds


def measure(url: Any, *, rounds: int, events: int, batch: int) -> dict[str, Any]:
    database = url.database()
    repo = OutboxRepository(database)
    sides: dict[str, list[tuple[float, float]]] = {"without": [], "with": []}
    for n in range(rounds):
        for side in (("without", "with") if n % 2 == 0 else ("with", "without")):
            database.execute_sql("TRUNCATE TABLE outbox_event")
            _seed(repo, events)
            metrics = (RelayMetrics(CollectorRegistry(), stats_every=15.0) if side == "with"
                       else None)
            wall, cpu, relay_rounds = _drain(repo, batch, metrics)
            sides[side].append((wall / relay_rounds, cpu / relay_rounds))
    report: dict[str, Any] = {"server": database.execute_sql("SELECT VERSION()").fetchone()[0],
                              "rounds": rounds, "events": events, "batch": batch}
    for side, values in sides.items():
        report[side] = {"wall_ms": statistics.median(w for w, _ in values) * 1000,
                        "cpu_ms": statistics.median(c for _, c in values) * 1000}
    pairs = list(zip(sides["with"], sides["without"]))  # each pair ran back to back
    report["ratio_wall"] = statistics.median(w / o for (w, _), (o, _) in pairs)
    report["ratio_cpu"] = statistics.median(w / o for (_, w), (_, o) in pairs)

    # The pieces alone.
    database.execute_sql("TRUNCATE TABLE outbox_event")
    _seed(repo, batch)
    with database.atomic():
        claimed = repo.claim_batch("bench", limit=batch)
    metrics = RelayMetrics(CollectorRegistry())
    counts = RoundResult(claimed=batch, published=batch)
    at = repo.clock()
    repeat = 2000
    started = time.perf_counter()
    for _ in range(repeat):
        metrics.counted(RoundResult(), (), None)  # the claim's record (nothing carried)
        metrics.counted(counts, claimed, at)
        metrics.round_finished(0.001)
    report["calls_us_per_round"] = (time.perf_counter() - started) / repeat * 1e6
    report["calls_share_of_round_cpu"] = (report["calls_us_per_round"] / 1000
                                          / report["without"]["cpu_ms"])
    metrics.outbox_stats(repo.stats())
    started = time.perf_counter()
    for _ in range(200):
        generate_latest(metrics.registry)
    report["scrape_ms"] = (time.perf_counter() - started) / 200 * 1000
    database.execute_sql("TRUNCATE TABLE outbox_event")
    _seed(repo, events)
    started = time.perf_counter()
    for _ in range(20):
        repo.stats()
    report["stats_ms"] = (time.perf_counter() - started) / 20 * 1000
    report["stats_share_at_15s"] = (report["stats_ms"] / 1000) / 15.0  # of a busy relay's time
    database.close()
    return report


def format_report(r: dict[str, Any]) -> str:
    return "\n".join([
        f"relay rounds of {r['batch']} events, a publisher that publishes nowhere, on"
        f" {r['server']} (median of {r['rounds']} drains of {r['events']:,} events per side,"
        " taking turns):",
        f"  without metrics: {r['without']['wall_ms']:.3f} ms per round,"
        f" {r['without']['cpu_ms']:.3f} ms CPU",
        f"  with metrics:    {r['with']['wall_ms']:.3f} ms per round,"
        f" {r['with']['cpu_ms']:.3f} ms CPU",
        f"  with / without:  {r['ratio_wall']:.3f} (wall), {r['ratio_cpu']:.3f} (CPU)"
        " (medians of the back-to-back pairs' ratios)",
        f"  the metrics calls of one round alone: {r['calls_us_per_round']:.1f} us, that is"
        f" {1 + r['calls_share_of_round_cpu']:.3f} x the round's CPU;"
        f" one scrape: {r['scrape_ms']:.2f} ms; one stats() reading on {r['events']:,} events:"
        f" {r['stats_ms']:.2f} ms, every 15 s: {r['stats_share_at_15s'] * 100:.3f} % of a"
        " relay's time"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_metrics")
    parser.add_argument("--rounds", type=int, default=9, help="drains per side (default 9)")
    parser.add_argument("--events", type=int, default=10_000, help="events (default 10000)")
    parser.add_argument("--batch", type=int, default=100, help="batch size (default 100)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    with scratch_database(args.database_url, "bench_metrics") as url:
        report = measure(url, rounds=args.rounds, events=args.events, batch=args.batch)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
