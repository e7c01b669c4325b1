"""One process, many databases: :class:`RelayGroup` runs several relays side by side, each over
its own database, on a thread of its own (SPEC §13)."""

from __future__ import annotations

import logging
import threading
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
    """

    def __init__(self, relays: Iterable[Relay] | Mapping[str, Relay]) -> None:
        pairs = (list(relays.items()) if isinstance(relays, Mapping)
                 else [(None, relay) for relay in relays])
        if not pairs:
            raise InvalidEventError("a RelayGroup needs at least one relay")
        self.names: dict[str, Relay] = {}
        for name, relay in pairs:
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
        self.errors: dict[str, BaseException] = {}

    def run(self, stop: threading.Event | None = None, *, until_empty: bool = False) -> None:
        """Run every relay until ``stop`` is set (with ``until_empty``, until each has found
        its outbox empty), each finishing the batch in hand. A relay that ends with an error
        is logged and kept in ``errors``; the others go on. Returns once every relay has
        returned."""
        stop = stop or threading.Event()
        threads = [threading.Thread(target=self._run_one, args=(name, relay, stop, until_empty),
                                    name=f"outbox-relay-{name}", daemon=True)
                   for name, relay in self.names.items()]
        for name, relay in self.names.items():
            logger.info("relay %s runs for database %s", relay.worker_id, name)
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)  # a KeyboardInterrupt reaches the caller's thread
        except BaseException:
            stop.set()  # the relays finish their batches; the caller's interrupt goes on
            raise

    def _run_one(self, name: str, relay: Relay, stop: threading.Event,
                 until_empty: bool) -> None:
        try:
            relay.run(stop, until_empty=until_empty)
        except Exception as exc:  # noqa: BLE001 - one database's relay; the others go on
            self.errors[name] = exc
            logger.error("relay %s for database %s ended: %s", relay.worker_id, name,
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
