"""Waking the relay on commit (SPEC §10): a doorbell the relay waits on instead of sleeping.

A repository rings once per event it creates; a relay of the same database claims as soon as
its bell rings and otherwise polls as before. Three ways a ring travels:

* **in-process**, always: a registry of this process's bells keyed by the database's name, so a
  relay in the service's own process wakes with no server at all;
* **Redis pub/sub** (``wake="redis://…"``): ``PUBLISH outbox-lite:wake:<database> ""``;
* **NATS core** (``wake="nats://…"``): a plain publish to ``outbox-lite.wake.<database>``;
* **PostgreSQL's own NOTIFY**, always on PostgreSQL: every event's INSERT notifies
  ``outbox_event``, delivered at the writer's COMMIT, and the relay LISTENs on a connection
  of its own (:func:`native_source`).

A ring carries nothing (an empty message: no id, no payload, no credential) and is a flag, not
a queue: any number of rings before the relay looks are one. Losing one loses no event: the
poll stays, as the safety net. A wake-up server that is down never fails a write or a relay:
the failure is logged once, the relay polls, and both sides reconnect in the background.

When the repository rings: on Peewee 4, after the caller's COMMIT (``Database.after_commit``;
nothing on a rollback); on Peewee 3, which has no commit hook, and inside ``manual_commit()``,
at ``create_in_transaction`` (before the COMMIT). A ring that comes before the COMMIT is what
:class:`IdlePause` retries after, over 1, 2, 4 … ms.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from typing import Any, Callable
from urllib.parse import quote, urlsplit

import peewee as pw

from ._families import family_of
from .errors import InvalidEventError

logger = logging.getLogger(__name__)

__all__ = ["Doorbell", "IdlePause", "WakeSource", "wake_source", "channel_of",
           "DEFAULT_WAKE_MAX_IDLE_PAUSE", "WAKE_RETRY"]

#: The longest poll pause of a relay with a wake-up URL: one empty claim every 2 s (about one
#: query a second, measured), and a lost wake-up or a retry's backoff costs at most that.
DEFAULT_WAKE_MAX_IDLE_PAUSE = 2.0
#: The first pause after a ring whose claim found nothing (its COMMIT may not have happened
#: yet); it doubles on each empty claim after it.
WAKE_RETRY = 0.001
#: Claims in a row that answer a ring and find nothing, after which rings stop cutting the
#: retries' waits short: one is an event already taken, two are a storm (IdlePause).
_DEAF_AFTER_MISSES = 2
_STOP_SLICE = 0.05  # a wait looks at the relay's stop event at least this often
_BACKOFF_FIRST, _BACKOFF_CAP = 0.1, 5.0


# ---------------------------------------------------------------------------
# The doorbell and the relay's idle pause
# ---------------------------------------------------------------------------

class Doorbell:
    """A flag that rings wake: :meth:`ring` from any thread, :meth:`wait` in the relay.

    A wait given the relay's ``stop`` Event waits on that Event's own condition, so setting
    ``stop`` ends it at once, as ``stop.wait`` would; a ring notifies the same condition."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._rung = False
        self._waiting_on: Any = None  # the condition a wait sleeps on now
        self.rings = 0  # rings heard (for tests and figures)

    def ring(self) -> None:
        """Set the flag and wake the waiter; never blocks for long, never raises."""
        with self._cond:
            self.rings += 1
            if self._rung:
                return
            self._rung = True
            self._cond.notify_all()
            waiting_on = self._waiting_on
        if waiting_on is not None:
            with waiting_on:
                waiting_on.notify_all()

    def take(self) -> bool:
        """Whether it rang since the last take (and clear the flag)."""
        with self._cond:
            rung, self._rung = self._rung, False
            return rung

    def wait(self, timeout: float, stop: threading.Event | None = None, *,
             interruptible: bool = True) -> bool:
        """Wait up to ``timeout`` seconds, less if it rings (when ``interruptible``) or
        ``stop`` is set. True when a ring ended the wait (the flag stays set for
        :meth:`take`)."""
        deadline = time.monotonic() + timeout
        # Event's condition (CPython's, for 20 years); without it, slices of _STOP_SLICE.
        cond = getattr(stop, "_cond", None) if stop is not None else None
        if not isinstance(cond, threading.Condition):
            cond, slice_ = self._cond, _STOP_SLICE
        else:
            slice_ = timeout
        with cond:
            if cond is not self._cond:
                with self._cond:
                    self._waiting_on = cond
            try:
                while True:
                    if interruptible and self._rung:
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0 or (stop is not None and stop.is_set()):
                        return False
                    cond.wait(min(left, slice_))
            finally:
                if cond is not self._cond:
                    with self._cond:
                        self._waiting_on = None


class IdlePause:
    """How long a relay waits after a claim that found nothing.

    Without a bell: ``first`` doubling up to ``longest`` (the plain poll). With one, also:
    a ring cuts the wait short; a claim that answered a ring and found nothing (the ring's
    COMMIT may still be on its way) is retried after 1, 2, 4 … ms instead of the poll pause.
    One such miss is no storm: its event was most likely taken by a claim that ran between
    the COMMIT and its ring (a poll, the round after a batch), so the next ring still cuts
    the retry's wait short, and that second miss is retried after 2 ms, whatever the pause
    had grown to (a ring late in a long wait may be early for its COMMIT too: Peewee 3 rings
    at create). From the second miss in a row, rings do not cut its waits short (they stay
    in the flag for the next claim) and its pauses double on. So a storm of rings
    that find nothing (or that another relay was quicker to answer) costs about
    log2(longest / 1 ms) claims, then one per ``longest``, whatever their number; a claim
    that found work, or a whole ``longest`` without a ring, ends it.
    """

    def __init__(self, first: float, longest: float, bell: Doorbell | None) -> None:
        self.first, self.longest, self.bell = first, longest, bell
        self.pause = 0.0
        self._answering = False  # the coming claim answers a ring
        # claims in a row that answered a ring and found nothing: retrying while above 0
        self._misses = 0

    def before_claim(self) -> None:
        """Call just before each claim: the rings until now are answered by it."""
        self._answering = self.bell is not None and self.bell.take()

    def found_work(self) -> None:
        self.pause, self._misses = 0.0, 0

    def next_pause(self) -> float:
        """After an empty claim: the pause to wait now."""
        if self._answering:
            if self._misses >= _DEAF_AFTER_MISSES:  # a storm's: keep doubling
                self.pause = min(self.longest, self.pause * 2)
            else:  # not from self.pause: it may be a long wait's, not a retry's
                self.pause = min(self.longest, WAKE_RETRY * 2 ** self._misses)
            self._misses += 1
        else:
            if self._misses and self.pause >= self.longest:
                self._misses = 0  # a whole poll pause without a ring: start over
            self.pause = min(self.longest, self.pause * 2 or self.first)
        return self.pause

    def wait(self, stop: threading.Event) -> None:
        """Wait :attr:`pause` (from :meth:`next_pause`), or until a ring or ``stop``."""
        if self.bell is None:
            stop.wait(self.pause)
        else:
            self.bell.wait(self.pause, stop, interruptible=self._misses < _DEAF_AFTER_MISSES)


# ---------------------------------------------------------------------------
# In-process: the bells of this process's relays, by database name
# ---------------------------------------------------------------------------

_LOCAL: dict[str, weakref.WeakSet[Doorbell]] = {}
_LOCAL_LOCK = threading.Lock()


def database_key(database: pw.Database) -> str:
    """What names ``database`` for wake-ups: its database name (the same from every host)."""
    return str(database.database or "")


def listen_locally(key: str, bell: Doorbell) -> None:
    with _LOCAL_LOCK:
        _LOCAL.setdefault(key, weakref.WeakSet()).add(bell)


def stop_listening_locally(key: str, bell: Doorbell) -> None:
    with _LOCAL_LOCK:
        _LOCAL.get(key, weakref.WeakSet()).discard(bell)


def ring_locally(key: str) -> None:
    with _LOCAL_LOCK:
        bells = list(_LOCAL.get(key, ()))
    for bell in bells:
        bell.ring()


# ---------------------------------------------------------------------------
# Through a server: Redis pub/sub, NATS core
# ---------------------------------------------------------------------------

def channel_of(url: str, key: str) -> str:
    """The Redis channel or NATS subject of ``key``'s wake-ups on the server of ``url``."""
    if urlsplit(url).scheme in ("redis", "rediss", "unix"):
        return f"outbox-lite:wake:{key}"
    return "outbox-lite.wake." + (quote(key, safe="-_") or "_")


class WakeSource:
    """A wake-up server (Redis or NATS) for one database: :meth:`signal` publishes a ring
    from a sender thread of its own (so a write never waits on it), :meth:`listen` rings a
    bell for each one heard, from a listener thread. Both reconnect in the background."""

    def __init__(self, url: str, key: str, transport: Any = None) -> None:
        self.url, self.key = url, key
        self.channel = channel_of(url, key) if transport is None else transport.channel
        self._transport = _transport(url) if transport is None else transport
        self._outbox = Doorbell()  # rings to send, coalesced
        self._sender: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.sent = 0  # rings published

    def __repr__(self) -> str:
        return f"WakeSource({self._transport.where}, {self.channel!r})"

    # -- the writer's side --------------------------------------------------------------
    def signal(self) -> None:
        """Ring (coalesced with rings not sent yet); never blocks, never raises."""
        if self._sender is None:
            with self._lock:
                if self._sender is None and not self._closing.is_set():
                    self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                                    name=f"outbox-wake-sender-{self.key}")
                    self._sender.start()
        self._outbox.ring()

    def _send_loop(self) -> None:
        down = _Outage(f"wake-up sender to {self._transport.where}")
        while not self._closing.is_set():
            if not self._outbox.wait(1.0, self._closing):
                continue
            self._outbox.take()
            try:
                self._transport.publish(self.channel)
                self.sent += 1
                down.over()
            except Exception as exc:  # noqa: BLE001 - a wake-up never fails anything
                self._transport.drop()
                self._outbox.ring()  # sent once it is back: the relays claim then
                self._closing.wait(down.failed(exc))
        self._transport.drop()

    # -- the relay's side ---------------------------------------------------------------
    def listen(self, bell: Doorbell, stop: threading.Event) -> threading.Thread:
        """Ring ``bell`` for every ring heard until ``stop`` is set (a thread of its own;
        after a reconnect it rings once, for what it may have missed)."""
        thread = threading.Thread(target=self._listen_loop, args=(bell, stop), daemon=True,
                                  name=f"outbox-wake-listener-{self.key}")
        thread.start()
        return thread

    def _listen_loop(self, bell: Doorbell, stop: threading.Event) -> None:
        down = _Outage(f"wake-up listener on {self._transport.where}")
        first = True
        while not stop.is_set():
            try:
                self._transport.listen(self.channel, bell, stop,
                                       ready=functools.partial(self._ready, down, bell,
                                                               not first))
                first = False
                down.over()
            except Exception as exc:  # noqa: BLE001 - the relay polls meanwhile
                first = False
                stop.wait(down.failed(exc))

    @staticmethod
    def _ready(down: "_Outage", bell: Doorbell, missed: bool) -> None:
        """The listener is subscribed: the outage (if any) is over, and after a reconnect a
        ring may have been missed, so ring once."""
        down.over()
        if missed:
            bell.ring()

    def close(self) -> None:
        self._closing.set()
        self._outbox.ring()
        thread = self._sender
        if thread is not None:
            thread.join(5)


class _Outage:
    """Logs a connection failure once (and its end), and paces reconnects."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.pause = 0.0

    def failed(self, exc: BaseException) -> float:
        if not self.pause:
            logger.warning("%s failed (%s): the relay polls meanwhile; reconnecting in the"
                           " background", self.what, _safe(exc))
        self.pause = min(_BACKOFF_CAP, self.pause * 2 or _BACKOFF_FIRST)
        return self.pause

    def over(self) -> None:
        if self.pause:
            logger.warning("%s is back", self.what)
        self.pause = 0.0


def _safe(exc: BaseException) -> str:
    from ._credentials import redact
    return redact(f"{type(exc).__name__}: {exc}")


class _Transport:
    where: str

    def publish(self, channel: str) -> None: ...

    def listen(self, channel: str, bell: Doorbell, stop: threading.Event,
               ready: Callable[[], None]) -> None: ...

    def drop(self) -> None: ...


class _Redis(_Transport):
    def __init__(self, url: str) -> None:
        try:
            import redis
        except ImportError:
            raise ImportError("a redis:// wake-up needs the redis client: pip install "
                              "'outbox-lite[bullmq]'") from None
        self._redis = redis
        self.url = url
        self._client: Any = None
        from .publishers._url import mask_url
        self.where = mask_url(url, "Redis")

    def _connect(self) -> Any:
        return self._redis.Redis.from_url(self.url, socket_connect_timeout=2,
                                          socket_timeout=5, health_check_interval=0)

    def publish(self, channel: str) -> None:
        if self._client is None:
            self._client = self._connect()
        self._client.publish(channel, b"")

    def listen(self, channel: str, bell: Doorbell, stop: threading.Event,
               ready: Callable[[], None]) -> None:
        client = self._connect()
        pubsub = client.pubsub()  # its "subscribe" confirmation is the moment it is ready
        try:
            pubsub.subscribe(channel)
            while not stop.is_set():
                message = pubsub.get_message(timeout=0.25)
                if message is None:
                    continue
                if message.get("type") == "subscribe":
                    ready()
                elif message.get("type") == "message":
                    bell.ring()
        finally:
            pubsub.close()
            client.close()

    def drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass


class _NATS(_Transport):
    def __init__(self, url: str) -> None:
        try:
            import nats
        except ImportError:
            raise ImportError("a nats:// wake-up needs the nats-py client: pip install "
                              "'outbox-lite[nats]'") from None
        from .publishers._loop import LoopThread
        from .publishers._url import mask_url
        self._nats = nats
        self.url = url
        self.where = mask_url(url, "NATS")
        self._runner: Any = None
        self._make_loop = LoopThread
        self._client: Any = None

    async def _connect(self, closed: Any = None) -> Any:
        options: dict[str, Any] = {"closed_cb": _set_event(closed)} if closed else {}
        return await self._nats.connect(self.url, allow_reconnect=False, connect_timeout=2,
                                        max_reconnect_attempts=0, error_cb=_quiet,
                                        name="outbox-lite-wake", **options)

    def _loop(self) -> Any:
        if self._runner is None:
            self._runner = self._make_loop("outbox-wake-nats")
        return self._runner

    def publish(self, channel: str) -> None:
        async def send() -> None:
            if self._client is None or self._client.is_closed:
                self._client = await self._connect()
            await self._client.publish(channel, b"")

        self._loop().call(send(), 5)

    def listen(self, channel: str, bell: Doorbell, stop: threading.Event,
               ready: Callable[[], None]) -> None:
        import asyncio

        async def run() -> None:
            closed = asyncio.Event()
            client = await self._connect(closed)

            async def on_message(_msg: Any) -> None:
                bell.ring()

            try:
                await client.subscribe(channel, cb=on_message)
                await client.flush(2)
                ready()
                while not stop.is_set() and not client.is_closed:
                    try:
                        await asyncio.wait_for(closed.wait(), 0.25)
                    except asyncio.TimeoutError:
                        pass
                if client.is_closed and not stop.is_set():
                    raise ConnectionError("the NATS connection closed")
            finally:
                if not client.is_closed:
                    await client.close()

        runner = self._make_loop("outbox-wake-nats-listener")
        try:
            asyncio.run_coroutine_threadsafe(run(), runner.loop).result()
        finally:
            runner.stop(None, 5)

    def drop(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._runner is not None:
            self._runner.spawn(client.close())


async def _quiet(_exc: BaseException) -> None:
    return None


def _set_event(event: Any) -> Callable[[], Any]:
    async def closed() -> None:
        event.set()
    return closed


def _transport(url: str) -> _Transport:
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss", "unix"):
        return _Redis(url)
    if scheme in ("nats", "tls"):
        return _NATS(url)
    raise InvalidEventError(  # the URL is not shown: it may hold a password
        f"wake must be a redis:// or nats:// URL (or None), not a {scheme or 'schemeless'}"
        " URL")


_SOURCES: dict[tuple[str, str], WakeSource] = {}
_SOURCES_LOCK = threading.Lock()


def wake_source(wake: Any, database: pw.Database) -> WakeSource | None:
    """The process's :class:`WakeSource` for ``wake`` (a URL, or None) on ``database``'s
    wake-ups; one per URL and database, shared by every repository and relay that name it.
    InvalidEventError for anything but None or a redis:// or nats:// URL."""
    if wake is None:
        return None
    if not isinstance(wake, str) or not wake.strip():
        raise InvalidEventError("wake must be a redis:// or nats:// URL, or None")
    key = database_key(database)
    with _SOURCES_LOCK:
        source = _SOURCES.get((wake, key))
        if source is None:
            source = _SOURCES[(wake, key)] = WakeSource(wake, key)
        return source


def native_source(database: pw.Database) -> WakeSource | None:
    """The wake-up ``database``'s server sends by itself, or None: on PostgreSQL the
    ``NOTIFY outbox_event`` of every event's INSERT, heard by ``LISTEN`` on a connection of
    the listener's own (the family's :meth:`listener`); MySQL has none."""
    listener = getattr(family_of(database), "listener", None)
    if listener is None:
        return None
    return NativeSource("", database_key(database), listener(database))


class NativeSource(WakeSource):
    """A database's own notifications as a wake-up source: nothing to signal (the INSERT
    notifies), a listener that reconnects in the background like the others."""

    def signal(self) -> None:  # the database notifies at the writer's commit
        return None


def listen(bell: Doorbell, database: pw.Database, source: WakeSource | None,
           native: WakeSource | None = None) -> Callable[[], None]:
    """Ring ``bell`` for the wake-ups of ``database``: ``source``'s when given, and either the
    database's own (``native``, PostgreSQL's LISTEN) or, without one, this process's. Not
    both: the server's notification of a commit and the in-process ring of the same commit
    would be two rings for one event, and the second, answered by an empty claim, would put
    the relay in its retry pauses, deaf to the next event's ring for up to a second. Returns
    the function that stops listening."""
    key = database_key(database)
    if native is None:
        listen_locally(key, bell)
    stop = threading.Event()
    threads = [s.listen(bell, stop) for s in (source, native) if s is not None]

    def stop_listening() -> None:
        stop.set()
        stop_listening_locally(key, bell)
        for thread in threads:
            thread.join(2)

    return stop_listening
