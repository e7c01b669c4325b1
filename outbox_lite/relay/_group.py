"""One process, many databases: :class:`RelayGroup` runs several relays side by side, each over
its own database, on a thread of its own (SPEC §13)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterable, Mapping

from .._credentials import redact
from ..errors import InvalidEventError
from ._contract import RoundResult
from ._loop import Relay

logger = logging.getLogger(__package__)


def database_name(database: Any) -> str:
    """What a database is called where no name was given: ``host:port/name`` of its
    connection parameters, never a user or a password."""
    params = getattr(database, "connect_params", {}) or {}
    host = params.get("host") or "localhost"
    port = params.get("port")
    return f"{host}:{port}/{database.database}" if port else f"{host}/{database.database}"


class RelayGroup:
    """Runs ``relays`` (a list, or a mapping of name to relay) together, each :meth:`Relay.run`
    on a thread of its own with its own connections, so that a large backlog in one database
    holds back no other, and one that cannot be reached (its relay waits and reconnects, as
    it always does) keeps none of the others from going on.

    ``names`` maps each name (given, else :func:`database_name` of the relay's database) to
    its relay; two relays of one database, or one relay twice, are an InvalidEventError.
    ``errors`` maps the name of each relay that ended with an error (logged at once) to it.
    While the group runs, :meth:`add` starts one more relay and :meth:`remove` stops one.
    """

    def __init__(self, relays: Iterable[Relay] | Mapping[str, Relay]) -> None:
        pairs = (list(relays.items()) if isinstance(relays, Mapping)
                 else [(None, relay) for relay in relays])
        if not pairs:
            raise InvalidEventError("a RelayGroup needs at least one relay")
        self.names: dict[str, Relay] = {}
        self.errors: dict[str, BaseException] = {}
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._stop: threading.Event | None = None  # set by start()
        self._until_empty = False
        for name, relay in pairs:
            self._admit(name, relay)

    def _admit(self, name: str | None, relay: Relay) -> str:
        if not isinstance(relay, Relay):
            raise TypeError(f"a RelayGroup runs Relays, not {type(relay).__name__}")
        name = database_name(relay.repository.database) if name is None else name
        if not isinstance(name, str) or not name.strip():
            raise InvalidEventError(f"a relay's name must be a non-empty string: {name!r}")
        if name in self.names:
            raise InvalidEventError(f"two relays of the group are called {name!r}: give"
                                    " each database one relay and its own name")
        if any(relay is other for other in self.names.values()):
            raise InvalidEventError(f"the relay {name!r} is in the group twice")
        self.names[name] = relay
        return name

    def run(self, stop: threading.Event | None = None, *, until_empty: bool = False) -> None:
        """Run every relay until ``stop`` is set (with ``until_empty``, until each has found
        its outbox empty), each finishing the batch in hand. A relay that ends with an error
        is logged and kept in ``errors``; the others go on. Returns once every relay has
        returned."""
        stop = self.start(stop, until_empty=until_empty)
        try:
            while self.wait(0.2):  # a KeyboardInterrupt reaches the caller's thread
                pass
        except BaseException:
            stop.set()  # the relays finish their batches; the caller's interrupt goes on
            self.wait(0)
            raise

    def start(self, stop: threading.Event | None = None, *,
              until_empty: bool = False) -> threading.Event:
        """Start every relay's thread and return the group's stop Event (``stop``, or a new
        one): set it, then :meth:`wait` until the relays have returned."""
        if self._stop is not None:
            raise InvalidEventError("this RelayGroup has been started already")
        self._stop = stop or threading.Event()
        self._until_empty = until_empty
        for name, relay in list(self.names.items()):
            self._start(name, relay)
        return self._stop

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until they have all returned) for the
        relays; True while one of them still runs. Once the group's stop Event is set, it
        stops each relay (they may take a while to finish their batches)."""
        if self._stop is None:
            raise InvalidEventError("start the RelayGroup before waiting for it")
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread, own in list(self._threads.values()):
            if self._stop.is_set():
                own.set()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
        if self._stop.is_set():
            for _, own in self._threads.values():
                own.set()
        return any(thread.is_alive() for thread, _ in self._threads.values())

    def add(self, relay: Relay, name: str | None = None) -> str:
        """Add ``relay`` under ``name`` (default: :func:`database_name` of its database),
        checked as the constructor checks them; started at once when the group runs.
        Returns its name."""
        name = self._admit(name, relay)
        if self._stop is not None and not self._stop.is_set():
            self._start(name, relay)
        return name

    def remove(self, name: str, timeout: float | None = None) -> Relay:
        """Stop the relay called ``name`` (it finishes and records the batch in hand) and
        take it out of the group; returns it, its publisher and database still open (the
        caller's). Waits up to ``timeout`` seconds (None: as long as it takes) for it to
        return. A KeyError when no relay has that name."""
        relay = self.names.pop(name)
        self.errors.pop(name, None)
        running = self._threads.pop(name, None)
        if running is not None:
            thread, own = running
            own.set()
            thread.join(timeout)
        return relay

    def _start(self, name: str, relay: Relay) -> None:
        own = threading.Event()
        thread = threading.Thread(target=self._run_one, args=(name, relay, own),
                                  name=f"outbox-relay-{name}", daemon=True)
        self._threads[name] = (thread, own)
        logger.info("relay %s runs for database %s", relay.worker_id, name)
        thread.start()

    def _run_one(self, name: str, relay: Relay, stop: threading.Event) -> None:
        try:
            relay.run(stop, until_empty=self._until_empty)
        except Exception as exc:  # noqa: BLE001 - one database's relay; the others go on
            self.errors[name] = exc
            logger.error("relay %s for database %s ended: %s", relay.worker_id, name,
                         redact(str(exc) or type(exc).__name__))
        finally:
            try:  # the connection this thread opened: no other thread can close it
                relay.repository.database.close()
            except Exception as exc:  # noqa: BLE001 - the relay's outcome is told already
                logger.debug("relay %s: closing its connection: %s", relay.worker_id,
                             redact(str(exc) or type(exc).__name__))

    def run_once(self) -> dict[str, RoundResult]:
        """One round of each relay in turn, in the calling thread; their counts by name. A
        relay whose round raises (its database unreachable, a lock conflict) is logged and
        kept in ``errors``, and the others' rounds run."""
        results: dict[str, RoundResult] = {}
        for name, relay in self.names.items():
            try:
                results[name] = relay.run_once()
            except Exception as exc:  # noqa: BLE001 - one database's round; the others run
                self.errors[name] = exc
                logger.warning("relay %s for database %s: its round failed: %s",
                               relay.worker_id, name, redact(str(exc) or type(exc).__name__))
        return results
