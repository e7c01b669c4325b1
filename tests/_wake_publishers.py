"""A publisher factory for ``outbox-lite relay --publisher _wake_publishers:accept_all`` in the
wake-up tests: the broker is not what they test, the database's ``published_at`` is."""

from __future__ import annotations

from typing import Any, Mapping, Sequence


class _AcceptAll:
    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        return {}

    def close(self) -> None:
        pass


def accept_all() -> _AcceptAll:
    return _AcceptAll()
