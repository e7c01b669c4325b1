"""BullMQ publisher: one BullMQ job per outbox event, added in bulk (the ``[bullmq]`` extra).

The mapping is a contract, because consumers and re-publications rely on it:

* job **name** = ``event.event_type``;
* job **data** = ``event.payload``, the JSON object or array as stored;
* job **id** = :func:`outbox_lite.publishers.message_id` of the event, the message id every
  publisher uses: ``"outbox-"`` followed by the dedupe key percent-encoded as UTF-8, e.g.
  ``order 42:paid`` → ``outbox-order%2042%3Apaid``;
* the event's **headers** (SPEC §11) in the job's options, since the data is the payload alone:
  all of them as ``opts.outboxHeaders`` (an object of strings, absent when there are none), and
  its trace context where BullMQ's own OpenTelemetry support looks for it, ``opts.tm``: the
  JSON text ``{"traceparent": …, "tracestate": …}`` that BullMQ for Node (with
  ``telemetry: new BullMQOtel(…)``, from ``bullmq-otel``) stores there and reads back as
  ``job.opts.telemetry.metadata`` to make the worker's ``process`` span a child of it.
  A Python worker reads both with :func:`job_headers`.

Why that id suits BullMQ. BullMQ stores job ``X`` of queue ``Q`` at the Redis key ``bull:Q:X``,
next to the queue's own keys (``bull:Q:wait``, ``bull:Q:meta``, ``bull:Q:id``, ``bull:Q:de:…``)
and the job's (``bull:Q:X:lock``, ``bull:Q:X:logs``), and numbers jobs without a custom id
``1, 2, 3…`` from a counter. So a custom id must not contain ``:`` and must not be an integer:
BullMQ for Node refuses both ("Custom Id cannot contain :", "Custom Ids cannot be integers"); the
Python package checks neither and would silently mix the keys up. The ``outbox-`` prefix keeps
every id off the counter's numbers and off the queue's own key names; percent-encoding removes
``:`` (and white space, braces, non-ASCII) and is injective: two different dedupe keys never
share a job id, and :func:`dedupe_key_of` gives the key back.

Duplicates. BullMQ ignores an add whose job id exists already. Publishing an event twice (a
relay that died after adding but before recording, or a publish that timed out after Redis
took it) therefore adds **one** job, as long as BullMQ still keeps the first one.

Job retention bounds that window. A job waiting or being processed is always kept; a finished
job is kept as ``removeOnComplete`` / ``removeOnFail`` say. For "one job per event", keep
finished jobs longer than the longest time between an event's first add and its last possible
re-publication: the relay's ``lock_timeout`` (a dead relay's claim is released after it) plus
the repository's longest retry backoff (``Backoff.cap``), plus any outage of all relays you want
covered. With the defaults (300 s + 3,600 s, about 65 minutes) the defaults here keep completed
jobs for a day (``{"age": 86400}``) and failed ones for a week (``{"age": 604800}``). Never
remove by ``count`` or at once (``True``): under load that removes jobs within seconds. The cost
is Redis memory: about (jobs per second) × 86,400 × (job size) for the completed ones.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from typing import Any, Awaitable, Callable, Mapping, Sequence

from .. import _checks
from ..errors import InvalidEventError
from ..models import OutboxEvent
from . import (MESSAGE_ID_PREFIX, BrokerUnavailableError, PublishError, message_id,
               message_id_of_key)
from . import dedupe_key_of as dedupe_key_of  # re-exported: bullmq.dedupe_key_of
from ._binding import Binding, Flag
from ._loop import CallTimeout, LoopThread, timeout_option
from ._url import mask_url, password_of, scrub

logger = logging.getLogger(__name__)

JOB_ID_PREFIX = MESSAGE_ID_PREFIX
#: Job options every job gets unless ``job_options`` overrides them (see the module docstring).
DEFAULT_JOB_OPTIONS: Mapping[str, Any] = {
    "removeOnComplete": {"age": 86_400},
    "removeOnFail": {"age": 604_800},
}
DEFAULT_TIMEOUT = 10.0
#: Redis refuses a single argument longer than ``proto-max-bulk-len`` (512 MiB by default).
REDIS_DEFAULT_MAX_BULK_BYTES = 512 * 1024 * 1024
#: Options the publisher owns, or that would merge different events into one job.
_RESERVED_JOB_OPTIONS = ("jobId", "parent", "repeat", "deduplication", "debounce",
                         "outboxHeaders", "tm", "omc", "telemetry")
#: The job options that carry the event's headers, and its trace context (BullMQ's own).
HEADERS_OPTION = "outboxHeaders"
TRACE_OPTION = "tm"
_TRACE_HEADERS = ("traceparent", "tracestate")
_INSTALL_HINT = "pip install 'outbox-lite[bullmq]'"


def job_id(dedupe_key: str) -> str:
    """The BullMQ job id of the event with ``dedupe_key``: its message id (one definition,
    :func:`outbox_lite.publishers.message_id_of_key`)."""
    return message_id_of_key(dedupe_key)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

class BullMQPublishError(PublishError):
    """Publishing to BullMQ failed; ``error_code`` and ``retryable`` say what the relay records."""

    code = "bullmq_error"


class BullMQUnavailableError(BullMQPublishError, BrokerUnavailableError):
    """Redis was unreachable or did not answer in time: the whole batch failed (retryable)."""


class BullMQJobError(BullMQPublishError):
    """BullMQ did not take one job; ``retryable`` is False when it never can (data too large)."""


# ---------------------------------------------------------------------------
# The publisher
# ---------------------------------------------------------------------------

class BullMQPublisher:
    """Publishes outbox events as BullMQ jobs on ``queue`` of the Redis at ``redis_url``.

    ``publish(events)`` adds one job per event in one bulk add and returns the failures by
    event id (empty: all added); it raises :class:`BullMQUnavailableError` when Redis is
    unreachable or the batch takes longer than ``timeout`` seconds (the whole batch failed,
    retryable). ``job_options`` are BullMQ job options merged over
    :data:`DEFAULT_JOB_OPTIONS` (e.g. ``{"attempts": 3}``). ``max_data_bytes`` is the largest
    job data Redis takes (its ``proto-max-bulk-len``); ``None`` asks the server when needed.

    The asyncio client runs on one event loop, in a daemon thread the publisher owns; no call
    makes a loop of its own. ``publish`` and ``close`` hold a lock, so calls from several
    threads go one batch at a time: give each relay thread a publisher of its own. Use it as
    a context manager, or call :meth:`close`.
    """

    messaging_system = "bullmq"  # OpenTelemetry's name (outbox_lite.tracing)

    def __init__(self, redis_url: str, queue: str, *, prefix: str = "bull",
                 job_options: Mapping[str, Any] | None = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 max_data_bytes: int | None = None) -> None:
        self.queue_name = _queue_name(queue)
        self.destination = self.queue_name
        self.prefix = _checks.name("prefix", prefix)
        self.timeout = timeout_option(timeout)
        self.job_options = _job_options(job_options)
        self._max_data_bytes = (None if max_data_bytes is None
                                else _checks.positive_int("max_data_bytes", max_data_bytes))
        if not isinstance(redis_url, str):
            raise InvalidEventError(f"redis_url must be a str, not {type(redis_url).__name__}")
        self._url = redis_url
        self._password = password_of(redis_url)
        self.redis_url = mask_url(redis_url, "Redis")  # safe to show: the password is masked
        self._bullmq, self._redis = _import_clients()
        # The queue in use, in a list the finalizer shares (it must not hold self).
        self._current = [self._open()]  # parses the URL (a bad one raises here); connects lazily
        self._lock = threading.Lock()
        self._closed = False
        self._runner = LoopThread(f"outbox-bullmq-{self.queue_name}")
        self._loop, self._thread = self._runner.loop, self._runner.thread
        current = self._current
        # close() calls it; so does the garbage collector (or exit) if close() never came.
        self._stop = weakref.finalize(self, self._runner.stop, lambda: _close_queue(current[0]),
                                      self.timeout)

    def __repr__(self) -> str:
        return f"<BullMQPublisher queue={self.queue_name!r} redis={self.redis_url!r}>"

    def __enter__(self) -> BullMQPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the Publisher protocol ---------------------------------------------

    def publish(self, events: Sequence[OutboxEvent]) -> Mapping[int, BaseException]:
        """Add one job per event, in bulk; return the failures by event id (empty: all added).

        Raises :class:`BullMQUnavailableError` (retryable) when Redis is unreachable or does
        not answer within ``timeout``, :class:`BullMQPublishError` for other Redis errors.
        """
        if not events:
            return {}
        jobs = [{"name": e.event_type, "data": e.payload, "opts": _job_opts(e)} for e in events]
        failures: Mapping[int, BaseException] = self._run(
            lambda queue: self._add(queue, events, jobs))
        return failures

    def ping(self) -> None:
        """Connect to Redis if needed and ping it: raises as :meth:`publish` does when it can't.

        Useful at start-up, to fail fast on a wrong URL or password.
        """
        self._run(lambda queue: queue.client.ping())

    def close(self) -> None:
        """Close the Redis connection and stop the event loop and its thread; idempotent."""
        with self._lock:
            self._closed = True
            self._stop()

    def _run(self, call: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run ``call(queue)`` on the loop; wait at most ``timeout``; map Redis errors."""
        with self._lock:
            if self._closed:
                raise BullMQUnavailableError("the BullMQ publisher is closed",
                                             error_code="bullmq_closed")
            queue = self._current[0]
            try:
                return self._runner.call(call(queue), self.timeout)
            except self._redis.exceptions.RedisError as exc:
                raise self._error(exc) from exc
            except CallTimeout:
                # redis-py drops a connection whose command is cancelled; start afresh
                # anyway: nothing of a cancelled call must linger.
                self._current[0] = self._open()
                self._runner.spawn(_close_queue(queue))
                raise BullMQUnavailableError(
                    f"{self._where()}: no answer within {self.timeout:g} s",
                    error_code="bullmq_timeout") from None

    # -- inside the event loop ------------------------------------------------

    async def _add(self, queue: Any, events: Sequence[OutboxEvent],
                   jobs: list[dict[str, Any]]) -> dict[int, BaseException]:
        redis_exc = self._redis.exceptions
        try:
            await queue.addBulk(jobs)
            return {}
        except redis_exc.ResponseError:
            # Redis ran the bulk add as one MULTI/EXEC: the jobs before and after the one that
            # failed were added. Adding one by one finds the failures (added ones are no-ops).
            return await self._add_each(queue, events, jobs)
        except (redis_exc.ConnectionError, redis_exc.TimeoutError):
            # Data longer than Redis takes in one argument makes Redis drop the connection
            # (nothing of the transaction is applied): that event can never be published.
            limit = await self._data_limit(queue)
            too_large = {i for i, job in enumerate(jobs) if _data_bytes(job["data"]) > limit}
            if not too_large:
                raise
            failures: dict[int, BaseException] = {
                events[i].id: self._too_large(limit) for i in too_large}
            rest = [i for i in range(len(jobs)) if i not in too_large]
            if rest:
                failures.update(await self._add(queue, [events[i] for i in rest],
                                                [jobs[i] for i in rest]))
            return failures

    async def _add_each(self, queue: Any, events: Sequence[OutboxEvent],
                        jobs: list[dict[str, Any]]) -> dict[int, BaseException]:
        redis_exc = self._redis.exceptions
        failures: dict[int, BaseException] = {}
        for event, job in zip(events, jobs):
            try:
                await queue.add(job["name"], job["data"], job["opts"])
            except (redis_exc.ResponseError, TypeError) as exc:
                # TypeError: BullMQ's own refusal of a job (a negative code from its script).
                failures[event.id] = BullMQJobError(
                    f"{self._where()} refused job {job['opts']['jobId']!r}: {self._clean(exc)}",
                    error_code="bullmq_job_refused")
            except (redis_exc.ConnectionError, redis_exc.TimeoutError):
                limit = await self._data_limit(queue)
                if _data_bytes(job["data"]) <= limit:
                    raise
                failures[event.id] = self._too_large(limit)
        return failures

    async def _data_limit(self, queue: Any) -> int:
        """The largest job data Redis takes: ``max_data_bytes``, else the server's setting."""
        if self._max_data_bytes is None:
            try:
                reply = await queue.client.config_get("proto-max-bulk-len")
                self._max_data_bytes = int(reply["proto-max-bulk-len"])
            except (self._redis.exceptions.ResponseError, KeyError, ValueError):
                self._max_data_bytes = REDIS_DEFAULT_MAX_BULK_BYTES  # CONFIG not allowed
        return self._max_data_bytes

    # -- helpers --------------------------------------------------------------

    def _open(self) -> Any:
        """A BullMQ Queue on a client of our own: a bounded connect, one quick reconnect.

        No read timeout per reply (redis-py 8 sets 5 s by default): ``publish`` bounds the
        whole call instead, and a timer per reply (a bulk add reads one per job) costs CPU.
        """
        redis = self._redis
        try:
            client = redis.asyncio.Redis.from_url(
                self._url, decode_responses=True, socket_connect_timeout=self.timeout,
                socket_timeout=None, retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 1))
        except ValueError as exc:
            raise InvalidEventError(
                f"redis_url {self.redis_url!r} is not a Redis URL "
                f"(redis://, rediss:// or unix://): {self._clean(exc)}") from None
        return self._bullmq.Queue(self.queue_name, {
            "connection": client, "prefix": self.prefix,
            "defaultJobOptions": dict(self.job_options)})

    def _where(self) -> str:
        return f"BullMQ queue {self.queue_name!r} at {self.redis_url}"

    def _clean(self, exc: BaseException) -> str:
        return scrub(str(exc), self._password)

    def _too_large(self, limit: int) -> BullMQJobError:
        return BullMQJobError(
            f"{self._where()}: the job data is longer than Redis takes in one argument "
            f"({limit} bytes, its proto-max-bulk-len)",
            error_code="bullmq_data_too_large", retryable=False)

    def _error(self, exc: BaseException) -> BullMQPublishError:
        redis_exc = self._redis.exceptions
        if isinstance(exc, (redis_exc.ConnectionError, redis_exc.TimeoutError)):
            return BullMQUnavailableError(f"{self._where()} is unavailable: {self._clean(exc)}",
                                          error_code="bullmq_unavailable")
        return BullMQPublishError(f"{self._where()}: {type(exc).__name__}: {self._clean(exc)}")


# ---------------------------------------------------------------------------
# Module helpers
# ---------------------------------------------------------------------------

def _import_clients() -> tuple[Any, Any]:
    try:
        import bullmq  # type: ignore[import-untyped,import-not-found,unused-ignore]
        import redis
        import redis.asyncio
        import redis.asyncio.retry
        import redis.backoff
    except ImportError as exc:
        raise ImportError(
            f"BullMQPublisher needs the bullmq package ({exc}); install it with {_INSTALL_HINT}"
        ) from exc
    return bullmq, redis


async def _close_queue(queue: Any) -> None:
    try:
        await queue.close()
    except Exception as exc:  # noqa: BLE001 - closing must not fail on a dead Redis
        logger.debug("closing a BullMQ queue failed: %s", type(exc).__name__)


def _data_bytes(data: Any) -> int:
    # The text BullMQ sends (json.dumps with its defaults: ASCII, so characters are bytes).
    return len(json.dumps(data, separators=(",", ":"), allow_nan=False))


def _job_opts(event: OutboxEvent) -> dict[str, Any]:
    """A job's own options: its id, and the event's headers (see the module docstring)."""
    opts: dict[str, Any] = {"jobId": message_id(event)}
    headers = event.headers
    if headers:
        opts[HEADERS_OPTION] = dict(headers)
        trace = {name: headers[name] for name in _TRACE_HEADERS if name in headers}
        if "traceparent" in trace:
            opts[TRACE_OPTION] = json.dumps(trace, separators=(",", ":"))
    return opts


def job_headers(job: Any) -> dict[str, str]:
    """The headers of the event a job was added for (``{}`` for none), read from the job's
    options by a Python worker: ``job.opts`` of a ``bullmq.Job``, or the options themselves.
    A Node worker reads ``job.opts.outboxHeaders`` (and BullMQ's telemetry reads ``tm``)."""
    opts = getattr(job, "opts", job)
    headers = opts.get(HEADERS_OPTION) if isinstance(opts, Mapping) else None
    return {str(k): str(v) for k, v in headers.items()} if isinstance(headers, Mapping) else {}


def _queue_name(queue: Any) -> str:
    _checks.name("queue", queue)
    if ":" in queue:
        raise InvalidEventError("queue must not contain ':' (BullMQ's key separator)")
    return str(queue)


def _job_options(options: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if options is None:
        return dict(DEFAULT_JOB_OPTIONS)
    if not isinstance(options, Mapping):
        raise InvalidEventError(f"job_options must be a mapping, not {type(options).__name__}")
    reserved = sorted(set(options) & set(_RESERVED_JOB_OPTIONS))
    if reserved:
        raise InvalidEventError(
            f"job_options must not set {', '.join(reserved)}: the publisher sets them (the job "
            "id from the dedupe key, the headers and trace context from the event)")
    try:
        json.dumps(options, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidEventError(f"job_options must be plain JSON values: {exc}") from None
    merged = {**DEFAULT_JOB_OPTIONS, **options}
    for key in ("removeOnComplete", "removeOnFail"):
        keep = merged[key]
        if keep is True or isinstance(keep, int) and not isinstance(keep, bool) or (
                isinstance(keep, Mapping) and "count" in keep):
            logger.warning(
                "job_options %s=%r removes finished jobs at once or by count: an event "
                "published again after its job was removed adds a second job; keep them "
                "by age (see outbox_lite.publishers.bullmq)", key, keep)
    return merged


# ---------------------------------------------------------------------------
# Its flags on `outbox-lite relay` (outbox_lite.publishers._binding)
# ---------------------------------------------------------------------------

def _from_flags(url: str, args: Any) -> BullMQPublisher:
    return BullMQPublisher(url, args.queue)


CLI = Binding(
    "BullMQ",
    Flag("--bullmq-url", "REDIS_URL",
         "publish to BullMQ on this Redis, redis://[:password@]host:port/db "
         "(default: $OUTBOX_BULLMQ_URL, which keeps a password out of ps); "
         "needs outbox-lite[bullmq] and --queue"),
    "OUTBOX_BULLMQ_URL",
    (Flag("--queue", "NAME", "the BullMQ queue to add jobs to"),),
    _from_flags, rank=10)
