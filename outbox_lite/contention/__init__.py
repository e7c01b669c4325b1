"""The multi-worker lock contention suite behind ``outbox-lite contention``.

Worker threads, each on its own connection, race over an outbox seeded in a fresh database.
Every scenario ends by checking its invariants against the database itself: the outbox rows,
and a sink table that stands for the broker (one row per publish). Time moves through an
injected clock, never by sleeping until a lock expires.
"""

from __future__ import annotations

from . import scenarios as _scenarios  # noqa: F401 - registers the scenarios, in order
from .suite import REGISTRY, ContentionSuite, Result, SuiteClock, format_table

__all__ = ["SCENARIOS", "ContentionSuite", "Result", "SuiteClock", "format_table"]

SCENARIOS = tuple(REGISTRY)  #: the scenario names, in the order they run
