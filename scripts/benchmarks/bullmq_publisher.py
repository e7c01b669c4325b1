"""BullMQPublisher.publish against BullMQ's own Queue.addBulk, side by side in one run.

Each round starts ``--workers`` fresh processes three times, on a fresh queue each time, with
the same jobs (name, data, job id, and the publisher's default job options: retention) in the
same batches of ``--batch``:

* ``Queue.addBulk`` on BullMQ's own client: BullMQ's own limit on this machine;
* ``Queue.addBulk`` on a client without redis-py's read timeout per reply, which is how the
  publisher sets its client up (it bounds the whole call itself): BullMQ's limit there;
* ``BullMQPublisher.publish``.

No database: the publisher's events are ``OutboxEvent`` instances built in memory, as a claim
returns them. The clock runs from the moment every process is ready (client connected, jobs
or events built) until the last one is done. Prints, per side, the median jobs/s and client
CPU time per job (the processes' own CPU, both threads of the publisher's included: a figure
other load on the machine disturbs less than wall time) over alternating rounds, and the
medians of the rounds' own ratios. Every queue is checked (one waiting job per event) and
deleted.

Usage: python scripts/bench.py bullmq [--redis-url URL] [--jobs 20000] [--batch 100]
       [--workers 4] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
import uuid
from typing import Any, Callable


import redis

from outbox_lite import OutboxEvent
from outbox_lite.publishers.bullmq import DEFAULT_JOB_OPTIONS, BullMQPublisher, job_id

from ._setup import PAYLOAD as JOB_DATA
from ._setup import add_sizes
from .relay import DEFAULT_REDIS_URL, delete_queue


def _events(first: int, count: int, run: str) -> list[OutboxEvent]:
    """In-memory events as ``claim_batch`` returns them (no database involved)."""
    return [OutboxEvent(id=n, event_type="job.created", aggregate_type="ai_job",
                        aggregate_id=str(n), dedupe_key=f"{run}-{n}",
                        payload={**JOB_DATA, "job_id": n}, status="processing",
                        attempt_count=1)
            for n in range(first, first + count)]


def _add_bulk_worker(redis_url: str, queue: str, first: int, count: int, batch: int, run: str,
                     barrier: Any, results: Any, no_read_timeout: bool = False) -> None:
    """BullMQ alone: Queue.addBulk of prepared job dicts, ``batch`` at a time, on BullMQ's
    own client (``no_read_timeout``: on a client without redis-py's read timeout per reply,
    as the publisher's)."""
    import redis.asyncio
    from bullmq import Queue

    jobs = [{"name": e.event_type, "data": e.payload, "opts": {"jobId": job_id(e.dedupe_key)}}
            for e in _events(first, count, run)]

    async def main() -> tuple[float, float, float]:
        connection: Any = redis_url
        if no_read_timeout:
            connection = redis.asyncio.Redis.from_url(redis_url, decode_responses=True,
                                                      socket_timeout=None)
        q = Queue(queue, {"connection": connection,
                          "defaultJobOptions": dict(DEFAULT_JOB_OPTIONS)})
        await q.client.ping()
        barrier.wait()
        started, cpu = time.monotonic(), time.process_time()
        for i in range(0, len(jobs), batch):
            await q.addBulk(jobs[i:i + batch])
        ended, cpu = time.monotonic(), time.process_time() - cpu
        await q.close()
        return started, ended, cpu

    try:
        results.put(asyncio.run(main()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(repr(exc))


def _add_bulk_no_read_timeout_worker(*args: Any) -> None:
    _add_bulk_worker(*args, no_read_timeout=True)


def _publisher_worker(redis_url: str, queue: str, first: int, count: int, batch: int,
                      run: str, barrier: Any, results: Any) -> None:
    """The same jobs through BullMQPublisher.publish, one batch of events at a time."""
    events = _events(first, count, run)
    try:
        with BullMQPublisher(redis_url, queue) as publisher:
            publisher.ping()  # connected before the clock starts, as the baseline is
            barrier.wait()
            started, cpu = time.monotonic(), time.process_time()  # both threads' CPU
            for i in range(0, len(events), batch):
                failures = publisher.publish(events[i:i + batch])
                if failures:
                    raise RuntimeError(f"{len(failures)} events failed")
            ended, cpu = time.monotonic(), time.process_time() - cpu
        results.put((started, ended, cpu))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(repr(exc))


def throughput(worker: Callable[..., None], redis_url: str, *, jobs: int, batch: int,
               workers: int) -> tuple[float, float]:
    """Jobs per second of ``workers`` fresh processes running ``worker`` over ``jobs`` jobs
    on a fresh queue, and the client CPU microseconds per job; checks that every job is
    waiting once, then deletes the queue."""
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
        delete_queue(client, queue)
        client.close()
    started = min(o[0] for o in outcomes)
    ended = max(o[1] for o in outcomes)
    return jobs / (ended - started), sum(o[2] for o in outcomes) / jobs * 1e6


def compare(redis_url: str = DEFAULT_REDIS_URL, *, jobs: int = 20_000, batch: int = 100,
            workers: int = 4, rounds: int = 5) -> dict[str, Any]:
    """Alternate the three sides round by round (A B C, C B A, …): addBulk on BullMQ's own
    client, addBulk on a client without a read timeout per reply (as the publisher's), and
    the publisher. Returns per side the median jobs/s and client CPU µs per job, and the
    medians of the rounds' own ratios publisher/side."""
    sides = {"add_bulk": _add_bulk_worker, "add_bulk_no_read_timeout":
             _add_bulk_no_read_timeout_worker, "publisher": _publisher_worker}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for r in range(rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            runs[name].append(throughput(sides[name], redis_url, jobs=jobs, batch=batch,
                                         workers=workers))
    pub = runs["publisher"]
    result: dict[str, Any] = {"jobs": jobs, "batch": batch, "workers": workers,
                              "rounds": rounds}
    for name, measured in runs.items():
        result[name] = {"jobs_per_s": statistics.median(m[0] for m in measured),
                        "cpu_us_per_job": statistics.median(m[1] for m in measured)}
        if name != "publisher":
            result[name].update({
                "publisher_ratio": statistics.median(p[0] / m[0] for p, m in zip(pub, measured)),
                "publisher_ratios": [round(p[0] / m[0], 3) for p, m in zip(pub, measured)],
                "publisher_cpu_ratio": statistics.median(
                    m[1] / p[1] for p, m in zip(pub, measured))})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL,
                        help=f"Redis to use; queues are named per run and deleted after it "
                             f"(default {DEFAULT_REDIS_URL})")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (default 20000)")
    add_sizes(parser, batch=(100, "jobs per add"), workers=4, rounds=(5, "alternating rounds"))
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    result = compare(args.redis_url, jobs=args.jobs, batch=args.batch, workers=args.workers,
                     rounds=args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.jobs} jobs, batches of {args.batch}, {args.workers} processes, "
          f"{args.rounds} alternating rounds")
    print(f"{'':<44}{'jobs/s':>9}{'CPU us/job':>12}{'publisher':>11}{'CPU':>7}")
    labels = {"add_bulk": "Queue.addBulk, BullMQ's own client",
              "add_bulk_no_read_timeout": "Queue.addBulk, no read timeout per reply",
              "publisher": "BullMQPublisher.publish"}
    for name, label in labels.items():
        side = result[name]
        ratios = "" if name == "publisher" else (
            f"{side['publisher_ratio']:>11.3f}{side['publisher_cpu_ratio']:>7.3f}")
        print(f"  {label:<42}{side['jobs_per_s']:>9,.0f}{side['cpu_us_per_job']:>12.1f}{ratios}")
    main_ratio = result["add_bulk"]["publisher_ratio"]
    print(f"publisher/addBulk (BullMQ's own client): {main_ratio:.3f}, target >= 0.95 "
          f"{'met' if main_ratio >= 0.95 else 'MISSED'}; rounds: "
          f"{', '.join(map(str, result['add_bulk']['publisher_ratios']))}")
    print("ratios: medians of the rounds' own ratios, jobs/s publisher/side and CPU per job "
          "side/publisher (CPU: the client processes' own, less disturbed by other load)")
    return 0
