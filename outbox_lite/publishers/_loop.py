"""One asyncio event loop in a daemon thread, owned by a publisher whose client is asyncio
(bullmq, aiormq, nats-py): sync code stays sync, and no call makes a loop of its own.

:class:`ConnectionPublisher` is the frame the RabbitMQ and NATS publishers share around it: one
connection kept in a state list, calls one at a time under a lock, a failed call dropping the
connection so that the next one connects afresh, and a close that always happens (by
:meth:`close`, or by the garbage collector or interpreter exit when it never came)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import weakref
from typing import Any, Awaitable, Callable, ClassVar, Coroutine, TypeVar

from ..errors import InvalidEventError, OutboxError

logger = logging.getLogger(__name__)

_Publisher = TypeVar("_Publisher", bound="ConnectionPublisher")


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


class ConnectionPublisher:
    """The part of a publisher around its asyncio client's connection.

    A subclass names its broker (``broker``, ``code``: ``"RabbitMQ"``, ``"rabbitmq"``), its
    ``unavailable`` error class (retryable, takes ``error_code``), and implements ``_where()``
    (where it publishes, password masked), ``_client_errors()`` (the client's exceptions that
    mean the call failed) and ``_error(exc)`` (one of them as the publisher's error). Its
    ``__init__`` sets ``timeout`` and calls :meth:`_start` with the coroutine function that
    closes a state list's connection.
    """

    broker: ClassVar[str]
    code: ClassVar[str]
    unavailable: ClassVar[Callable[..., OutboxError]]  # the class: (message, error_code=)
    timeout: float

    def _start(self, thread_name: str,
               close_state: Callable[[list[Any]], Coroutine[Any, Any, None]]) -> None:
        # The client's connection (and what goes with it), in a list the finalizer shares: it
        # must not hold self.
        self._state: list[Any] = [None, None]
        self._close_state = close_state
        self._lock = threading.Lock()
        self._closed = False
        self._runner = LoopThread(thread_name)
        state = self._state
        # close() calls it; so does the garbage collector (or exit) if close() never came.
        self._stop = weakref.finalize(self, self._runner.stop, lambda: close_state(state),
                                      self.timeout)

    def __enter__(self: _Publisher) -> _Publisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection and stop the event loop and its thread; idempotent."""
        with self._lock:
            self._closed = True
            self._stop()

    def _run(self, call: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Run ``call()`` on the loop; wait at most ``timeout``; map the client's errors.
        After a failure the connection is dropped: the next call connects afresh."""
        failed: tuple[type[BaseException], ...] = (
            *self._client_errors(), OSError, asyncio.TimeoutError, asyncio.CancelledError)
        with self._lock:
            if self._closed:
                raise self.unavailable(f"the {self.broker} publisher is closed",
                                       error_code=f"{self.code}_closed")
            try:
                return self._runner.call(call(), self.timeout)
            except OutboxError:  # the publisher's own, raised on the loop
                self._drop()
                raise
            except CallTimeout:
                self._drop()
                raise self.unavailable(
                    f"{self._where()}: no answer within {self.timeout:g} s",
                    error_code=f"{self.code}_timeout") from None
            except failed as exc:
                self._drop()
                raise self._error(exc) from None

    def _drop(self) -> None:
        """Forget the connection (closing it in the background): the next call connects."""
        state, self._state[:] = list(self._state), [None, None]
        self._runner.spawn(self._close_state(state))

    def _where(self) -> str:
        raise NotImplementedError

    def _client_errors(self) -> tuple[type[BaseException], ...]:
        raise NotImplementedError

    def _error(self, exc: BaseException) -> OutboxError:
        raise NotImplementedError


def timeout_option(value: Any) -> float:
    """A publisher's ``timeout``: a positive, finite number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidEventError(f"timeout must be a number of seconds, not {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidEventError(f"timeout must be a positive number of seconds, not {value}")
    return float(value)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
