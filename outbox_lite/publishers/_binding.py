"""What a shipped publisher declares for ``outbox-lite relay``: its flags, the variable that
stands for its URL flag, and how the parsed flags make it.

Each publisher module of this package (``bullmq``, ``rabbitmq``, ``nats``, ``celery``) holds
its own :class:`Binding` as ``CLI``; the command reads them all with :func:`bindings`, so a
new broker is a new module here and no edit to ``cli/relay.py``. A module is imported for its
binding only: its broker's client is imported when the publisher is made, never before.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, NamedTuple


class Flag(NamedTuple):
    """One command-line flag: ``--celery-task``, its metavar and its help."""

    flag: str
    metavar: str
    help: str

    @property
    def dest(self) -> str:
        """Its attribute on the parsed arguments (``celery_task``)."""
        return self.flag.lstrip("-").replace("-", "_")


class Binding(NamedTuple):
    """A shipped publisher as the relay's flags name it."""

    name: str  # as messages name the broker: "Celery"
    url: Flag  # --celery-url
    env: str  # the variable that stands for it: OUTBOX_CELERY_URL
    targets: tuple[Flag, ...]  # required first, then optional: (--celery-task, --celery-queue)
    make: Callable[[str, Any], Any]  # (url, parsed arguments) -> publisher
    rank: int  # its place in --help and in messages, lowest first
    cloudevents: bool = False  # whether it takes --cloudevents

    @property
    def flags(self) -> tuple[Flag, ...]:
        """Its URL flag, then its targets."""
        return (self.url, *self.targets)


def bindings() -> list[Binding]:
    """The binding of every publisher module of this package, by ``rank``."""
    found = []
    package = importlib.import_module(__package__ or "outbox_lite.publishers")
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            binding = getattr(importlib.import_module(f"{package.__name__}.{module.name}"),
                              "CLI", None)
            if isinstance(binding, Binding):
                found.append(binding)
    return sorted(found, key=lambda binding: binding.rank)
