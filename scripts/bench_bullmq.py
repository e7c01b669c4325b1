#!/usr/bin/env python3
"""BullMQPublisher.publish against BullMQ's own Queue.addBulk, side by side in one run.

Each round starts ``--workers`` fresh processes twice: once adding the jobs straight through
``Queue.addBulk`` (BullMQ's own limit on this machine), once through
``BullMQPublisher.publish`` — the same jobs (name, data, job id), the same batches of
``--batch``, a fresh queue each time. No database: the publisher's events are
``OutboxEvent`` instances built in memory, as a claim returns them. The clock runs from the
moment every process is ready (connected client, jobs or events built) until the last one is
done. Prints jobs/s for both (medians over alternating rounds) and the median of the rounds'
own ratios publisher/addBulk. Every queue is checked (one waiting job per event) and deleted.

Usage: python scripts/bench_bullmq.py [--redis-url URL] [--jobs 20000] [--batch 100]
       [--workers 4] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout too

import redis  # noqa: E402

from outbox_lite import OutboxEvent  # noqa: E402
from outbox_lite.publishers.bullmq import BullMQPublisher, job_id  # noqa: E402

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: The same shape as scripts/bench.py's event payload.
JOB_DATA = {"job_id": 0, "model": "small", "prompt": "resize the picture to 512x512",
            "priority": 3, "tags": ["image", "resize"]}


def _events(first: int, count: int, run: str) -> list[OutboxEvent]:
    """In-memory events as ``claim_batch`` returns them (no database involved)."""
    return [OutboxEvent(id=n, event_type="job.created", aggregate_type="ai_job",
                        aggregate_id=str(n), dedupe_key=f"{run}-{n}",
                        payload={**JOB_DATA, "job_id": n}, status="processing",
                        attempt_count=1)
            for n in range(first, first + count)]


def _add_bulk_worker(redis_url: str, queue: str, first: int, count: int, batch: int, run: str,
                     barrier: Any, results: Any) -> None:
    """BullMQ alone: Queue.addBulk of prepared job dicts, ``batch`` at a time."""
    from bullmq import Queue

    jobs = [{"name": e.event_type, "data": e.payload, "opts": {"jobId": job_id(e.dedupe_key)}}
            for e in _events(first, count, run)]

    async def main() -> tuple[float, float]:
        q = Queue(queue, {"connection": redis_url})
        await q.client.ping()
        barrier.wait()
        started = time.monotonic()
        for i in range(0, len(jobs), batch):
            await q.addBulk(jobs[i:i + batch])
        ended = time.monotonic()
        await q.close()
        return started, ended

    try:
        results.put(asyncio.run(main()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(repr(exc))


def _publisher_worker(redis_url: str, queue: str, first: int, count: int, batch: int,
                      run: str, barrier: Any, results: Any) -> None:
    """The same jobs through BullMQPublisher.publish, one batch of events at a time."""
    events = _events(first, count, run)
    try:
        with BullMQPublisher(redis_url, queue) as publisher:
            publisher.ping()  # connected before the clock starts, as the baseline is
            barrier.wait()
            started = time.monotonic()
            for i in range(0, len(events), batch):
                failures = publisher.publish(events[i:i + batch])
                if failures:
                    raise RuntimeError(f"{len(failures)} events failed")
            ended = time.monotonic()
        results.put((started, ended))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(repr(exc))


def throughput(worker: Callable[..., None], redis_url: str, *, jobs: int, batch: int,
               workers: int) -> float:
    """Jobs per second of ``workers`` fresh processes running ``worker`` over ``jobs`` jobs
    on a fresh queue; checks that every job is waiting once, then deletes the queue."""
    ctx = multiprocessing.get_context("spawn")
    queue = f"bench-bullmq-{uuid.uuid4().hex}"
    run = uuid.uuid4().hex[:12]
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    share = -(-jobs // workers)
    procs = [ctx.Process(target=worker, args=(redis_url, queue, i * share,
                                              min(share, jobs - i * share), batch, run,
                                              barrier, results))
             for i in range(workers)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    client = redis.Redis.from_url(redis_url)
    try:
        failures = [o for o in outcomes if isinstance(o, str)]
        if failures:
            raise RuntimeError(f"{worker.__name__} failed: {failures[0]}")
        waiting = client.llen(f"bull:{queue}:wait")
        if waiting != jobs:
            raise AssertionError(f"{worker.__name__}: {waiting} jobs waiting, not {jobs}")
    finally:
        keys = list(client.scan_iter(match=f"bull:{queue}:*", count=1000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i:i + 1000])
        client.close()
    started = min(o[0] for o in outcomes)
    ended = max(o[1] for o in outcomes)
    return jobs / (ended - started)


def compare(redis_url: str = DEFAULT_REDIS_URL, *, jobs: int = 20_000, batch: int = 100,
            workers: int = 4, rounds: int = 5) -> dict[str, Any]:
    """Alternate addBulk and publisher rounds (A B B A …); the medians and the median ratio."""
    bulk: list[float] = []
    pub: list[float] = []
    for r in range(rounds):
        order = ((_add_bulk_worker, bulk), (_publisher_worker, pub))
        for worker, sink in (order if r % 2 == 0 else order[::-1]):
            sink.append(throughput(worker, redis_url, jobs=jobs, batch=batch, workers=workers))
    return {"jobs": jobs, "batch": batch, "workers": workers, "rounds": rounds,
            "add_bulk_jobs_per_s": statistics.median(bulk),
            "publisher_jobs_per_s": statistics.median(pub),
            "ratio": statistics.median(p / b for p, b in zip(pub, bulk)),
            "ratios": [round(p / b, 3) for p, b in zip(pub, bulk)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL,
                        help=f"Redis to use; queues are named per run and deleted after it "
                             f"(default {DEFAULT_REDIS_URL})")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (default 20000)")
    parser.add_argument("--batch", type=int, default=100, help="jobs per add (default 100)")
    parser.add_argument("--workers", type=int, default=4, help="processes (default 4)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    result = compare(args.redis_url, jobs=args.jobs, batch=args.batch, workers=args.workers,
                     rounds=args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.jobs} jobs, batches of {args.batch}, {args.workers} processes, "
          f"{args.rounds} alternating rounds")
    print(f"  Queue.addBulk (BullMQ alone)   {result['add_bulk_jobs_per_s']:>10,.0f} jobs/s")
    print(f"  BullMQPublisher.publish        {result['publisher_jobs_per_s']:>10,.0f} jobs/s")
    verdict = "met" if result["ratio"] >= 0.95 else "MISSED"
    print(f"  ratio publisher/addBulk        {result['ratio']:>10.3f}  "
          f"(rounds: {', '.join(map(str, result['ratios']))}; target >= 0.95 {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
