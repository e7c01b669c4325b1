"""One asyncio event loop in a daemon thread, owned by a publisher whose client is asyncio
(bullmq, aiormq, nats-py): sync code stays sync, and no call makes a loop of its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
from typing import Any, Awaitable, Callable

from ..errors import InvalidEventError

logger = logging.getLogger(__name__)


class CallTimeout(Exception):
    """A call on the loop did not finish in time; it has been cancelled."""


class LoopThread:
    """An event loop running in a daemon thread of its own, until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name=name)
        self.thread.start()

    def call(self, awaitable: Awaitable[Any], timeout: float) -> Any:
        """Run ``awaitable`` on the loop and return its result, waiting at most ``timeout``
        seconds: then it is cancelled and :class:`CallTimeout` raised. What it raises, the
        call raises (its own ``TimeoutError`` too)."""
        future = asyncio.run_coroutine_threadsafe(_awaited(awaitable), self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():  # the call's own TimeoutError, not our wait's
                raise
            future.cancel()
            raise CallTimeout from None

    def spawn(self, awaitable: Awaitable[Any]) -> None:
        """Run ``awaitable`` on the loop without waiting for it (closing a dead client)."""
        asyncio.run_coroutine_threadsafe(_awaited(awaitable), self.loop)

    def stop(self, wind_up: Callable[[], Awaitable[Any]] | None, timeout: float) -> None:
        """Cancel what still runs on the loop, await ``wind_up()`` (closing the client), stop
        the loop and join its thread; idempotent."""

        async def cancel_the_rest() -> None:
            for _ in range(5):  # a task cancelled may start another (a client's close)
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                if not tasks:
                    return
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        async def finish() -> None:
            await cancel_the_rest()
            if wind_up is not None:
                await wind_up()
            await cancel_the_rest()  # what closing left behind: none pending at loop close

        if self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(finish(), self.loop).result(timeout)
            except Exception:  # noqa: BLE001 - stopping goes on regardless
                logger.debug("winding up the event loop of %s failed or timed out",
                             self.thread.name)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)
        if not self.thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


def timeout_option(value: Any) -> float:
    """A publisher's ``timeout``: a positive, finite number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidEventError(f"timeout must be a number of seconds, not {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidEventError(f"timeout must be a positive number of seconds, not {value}")
    return float(value)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
