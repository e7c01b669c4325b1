"""The publisher of scripts/galera_relays.py's relays: ``outbox-lite relay --publisher
galera_publisher:recorder`` (with scripts/ on PYTHONPATH). It never fails an event: each batch
goes to a Redis hash, event id -> how many times it was published (HINCRBY, one pipeline per
batch), so that an event published twice is counted, as a deduping broker would see it.

Settings from the environment, as a service's factory reads its own: OUTBOX_GALERA_REDIS_KEY
(the hash, one per run), OUTBOX_GALERA_REDIS_URL (default redis://127.0.0.1:6379/0) and
OUTBOX_GALERA_PUBLISH_SECONDS (default 0: how long each publish takes, a slow broker's round
trip, so that a relay killed mid-drain holds claims)."""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence


class Recorder:
    """publish(events): every event counted once more in the hash, nothing ever failed."""

    def __init__(self, url: str, key: str, seconds: float = 0.0) -> None:
        import redis  # installed with outbox-lite[bullmq] and [test]

        self.redis = redis.Redis.from_url(url)
        self.key = key
        self.seconds = seconds

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        if self.seconds:
            time.sleep(self.seconds)  # the broker's round trip
        pipe = self.redis.pipeline(transaction=False)
        for event in events:
            pipe.hincrby(self.key, str(event.id), 1)
        pipe.execute()
        return {}

    def ping(self) -> None:
        self.redis.ping()

    def close(self) -> None:
        self.redis.close()

    def __repr__(self) -> str:
        return f"Recorder({self.key})"


def recorder() -> Recorder:
    return Recorder(os.environ.get("OUTBOX_GALERA_REDIS_URL", "redis://127.0.0.1:6379/0"),
                    os.environ["OUTBOX_GALERA_REDIS_KEY"],
                    float(os.environ.get("OUTBOX_GALERA_PUBLISH_SECONDS", "0")))
