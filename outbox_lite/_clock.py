"""The database server's clock, the one clock every instant the library records or compares
comes from (SPEC §1), so hosts whose own clocks disagree still agree on lock expiry, backoff
and ages.

:class:`ServerClock` reads the server's clock once (its family's ``NOW``; on MySQL
``SELECT UTC_TIMESTAMP(6)``; on a new connection, the session question that
:mod:`outbox_lite._session` asks reads it too, in the same round trip), notes
``time.monotonic()`` around that read, and from then on answers ``server time at the read + monotonic time since``
with no round trip. It reads again every ``refresh`` seconds (10 by default) and whenever the
calling thread's connection is a new one (a reconnect may have reached another server). A
reading is off by at most half the round trip of the read it extrapolates from (well under a
millisecond on a LAN) plus the local monotonic clock's rate error over ``refresh`` seconds
(parts per million); the host's wall clock, and any change to it, plays no part.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import weakref
from typing import Any, NamedTuple

import peewee as pw

from . import _session
from ._db import ask, execute
from ._families import family_of
from .models import aware

REFRESH_SECONDS = 10.0


class _Anchor(NamedTuple):
    server: dt.datetime  # naive UTC, the server's answer
    monotonic: float  # time.monotonic() at the middle of the round trip that read it


class ServerClock:
    """Callable returning the server's current instant as an aware UTC datetime (the
    :data:`outbox_lite.repository.Clock` contract); :meth:`naive` gives it as stored.

    A reading may run ``SELECT UTC_TIMESTAMP(6)`` on the calling thread's connection to
    ``database`` (inside the caller's transaction, if one is open: the read locks nothing),
    and so raises what any statement raises there (e.g. ConnectionLostError). One instance
    per database serves every thread (:func:`server_clock`).
    """

    def __init__(self, database: pw.Database, *, refresh: float = REFRESH_SECONDS) -> None:
        self.database = database
        self.refresh = refresh
        self.reads = 0  # round trips so far (the tests and the benchmark count them)
        self._now = family_of(database).sql.NOW  # the family's SELECT of its clock
        _session.read_clock_too(database)  # a new connection's question reads it too
        self._anchor: _Anchor | None = None
        self._local = threading.local()  # the connection this thread last read on

    def __call__(self) -> dt.datetime:
        return aware(self.naive())

    def __repr__(self) -> str:
        return f"<ServerClock refresh={self.refresh:g}s reads={self.reads}>"

    def naive(self) -> dt.datetime:
        """The server's current instant as naive UTC (the form ``DATETIME(6)`` stores)."""
        anchor = self._anchor
        now = time.monotonic()
        if anchor is None or now - anchor.monotonic > self.refresh or self._new_connection():
            anchor = self._read()
            now = time.monotonic()
        return anchor.server + dt.timedelta(0, now - anchor.monotonic)  # (days, seconds)

    def peek(self) -> dt.datetime | None:
        """The current estimate, aware, without any SQL: None before the first read."""
        anchor = self._anchor
        if anchor is None:
            return None
        return aware(anchor.server + dt.timedelta(seconds=time.monotonic() - anchor.monotonic))

    def _new_connection(self) -> bool:
        """Whether this thread has an open connection that no reading has been made on. A
        closed database is no reason to read: the statement about to run opens one, and the
        next reading sees it."""
        if self.database.is_closed():
            return False
        seen = getattr(self._local, "connection", None)
        return seen is None or seen() is not self.database.connection()

    def _read(self) -> _Anchor:
        # Opening a connection would count in the round trip: open first. A new connection's
        # session question reads the clock too (one round trip for both): take that reading.
        ask(self.database)
        taken = _session.take_clock(self.database)
        if taken is not None and time.monotonic() - taken[1] <= self.refresh:
            server, middle = taken
        else:
            before = time.monotonic()
            (server,) = execute(self.database, self._now, ()).fetchone()
            middle = (before + time.monotonic()) / 2
        if not isinstance(server, dt.datetime):  # a driver that hands back text
            server = dt.datetime.fromisoformat(str(server))
        anchor = _Anchor(server.replace(tzinfo=None), middle)
        self._local.connection = _ref(self.database.connection())
        self._anchor = anchor
        self.reads += 1
        return anchor


def _ref(connection: Any) -> Any:
    try:
        return weakref.ref(connection)
    except TypeError:  # a connection type without weak references: hold it
        return lambda: connection


_CLOCKS: weakref.WeakKeyDictionary[pw.Database, ServerClock] = weakref.WeakKeyDictionary()
_CLOCKS_LOCK = threading.Lock()


def server_clock(database: pw.Database) -> ServerClock:
    """The :class:`ServerClock` of ``database``, shared by every repository and inbox on it."""
    with _CLOCKS_LOCK:
        clock = _CLOCKS.get(database)
        if clock is None:
            clock = _CLOCKS[database] = ServerClock(database)
        return clock
