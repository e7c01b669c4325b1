"""Redis for the tests: the shared server (queues named per test, their keys deleted after)
and servers of a test's own on free ports, stopped by their pid, never the shared one; and a
real BullMQ consumer (the bullmq package's Worker)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from typing import Any

import redis
from bullmq import Worker

SHARED_REDIS = "redis://127.0.0.1:6379/0"


def delete_queue(client: redis.Redis, name: str) -> None:
    keys = list(client.scan_iter(match=f"bull:{name}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server of the test's own on a free port, without persistence."""

    def __init__(self, *options: str) -> None:
        self.port = free_port()
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", *self.options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=1, **self._auth())
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} did not start")
                time.sleep(0.02)
            finally:
                client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # this server only, by its pid
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, **self._auth())

    def _auth(self) -> dict[str, str]:
        opts = dict(zip(self.options[::2], self.options[1::2]))
        return {"password": opts["--requirepass"]} if "--requirepass" in opts else {}


async def consume(queue: str, expected: int, connection: str = SHARED_REDIS,
                  concurrency: int = 1) -> list[tuple[str, str, Any]]:
    seen: list[tuple[str, str, Any]] = []
    all_seen = asyncio.Event()

    async def process(job: Any, token: str) -> None:
        seen.append((job.id, job.name, job.data))
        if len(seen) >= expected:
            all_seen.set()

    worker = Worker(queue, process, {"connection": connection, "drainDelay": 1,
                                     "concurrency": concurrency})
    try:
        await asyncio.wait_for(all_seen.wait(), timeout=60)
    finally:
        await worker.close()
    return seen


