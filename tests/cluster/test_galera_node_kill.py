"""A Galera node SIGKILLed mid-drain (SPEC §12, issue 32): a relay on every node, each on a URL
listing every node with its own first (``mysql://root@n2,n1,n3/db`` for node 2's), a publisher
that counts every publish of every event in a Redis hash (scripts/galera_publisher.py, the
deduping store's view); ``scripts/galera.sh kill 2`` once a third of the outbox is published,
``restart 2`` after the drain.

What must hold: no relay dies; the relay of node 2 reconnects to the next node of its URL and
records there the outcomes its node took down with it; every event is published exactly once
and recorded published (nothing lost, nothing twice); nothing stays claimed past the lock
timeout (the drain ends within it after the kill); node 2 rejoins and holds the same outbox.
Measured and printed: kill → first event published by the other relays, kill → drained, the
node's rejoin.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from outbox_lite import OutboxRepository
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.relay import Relay

CHECKOUT = Path(__file__).resolve().parents[2]
GALERA = CHECKOUT / "scripts" / "galera.sh"
sys.path.insert(0, str(CHECKOUT / "scripts"))
from galera_publisher import Recorder  # noqa: E402 - the harness's publisher, from scripts/

from _cluster import running, seed_outbox  # noqa: E402

EVENTS = 6000
LOCK_TIMEOUT = 20.0
DATABASE = "outbox_galera_kill"


class TimedRecorder(Recorder):
    """The harness's Redis counter, and the time of each of this relay's publishes."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(url, key)
        self.times: list[float] = []
        #: (when published, time.monotonic; when the batch was claimed, the server's UTC).
        self.batches: list[tuple[float, Any]] = []

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        failed = super().publish(events)
        self.times.append(time.monotonic())
        self.batches.append((self.times[-1], max(event.locked_at for event in events)))
        return failed


def _naive_utc(instant: dt.datetime) -> dt.datetime:
    if instant.tzinfo is not None:
        instant = instant.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return instant


def _galera(*args: str) -> float:
    began = time.monotonic()
    subprocess.run([str(GALERA), *args], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - began


def test_a_node_killed_mid_drain_loses_and_doubles_nothing(galera_urls: list[str]) -> None:
    import redis

    nodes = [DatabaseUrl.parse(url) for url in galera_urls]
    addresses = [(node.host, node.port) for node in nodes]
    first = nodes[0].with_name(DATABASE)
    seed_outbox(first, EVENTS).close()

    key = f"outbox_galera:kill-{uuid.uuid4().hex[:8]}"
    store = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    urls = [DatabaseUrl.parse(f"mysql://root@{','.join(f'{h}:{p}' for h, p in order)}/{DATABASE}")
            for order in ([addresses[i]] + addresses[:i] + addresses[i + 1:]
                          for i in range(3))]
    publishers = [TimedRecorder("redis://127.0.0.1:6379/0", key) for _ in urls]
    relays = [Relay(OutboxRepository(url.database()), publisher, worker_id=f"node{i + 1}",
                    batch_size=50, lock_timeout=LOCK_TIMEOUT, reconnect_pause=0.1,
                    max_reconnect_pause=1.0, progress_every=0)
              for i, (url, publisher) in enumerate(zip(urls, publishers))]
    killed = rejoin = 0.0
    try:
        with running(relays) as (threads, failures):
            deadline = time.monotonic() + 300
            while store.hlen(key) < EVENTS // 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            killed, killed_utc = time.monotonic(), _naive_utc(dt.datetime.now(dt.timezone.utc))
            _galera("kill", "2")
            while store.hlen(key) < EVENTS and time.monotonic() < deadline:
                time.sleep(0.05)
            drained = time.monotonic()
            rejoin = _galera("restart", "2")
    finally:
        for relay in relays:
            relay.repository.database.close()

    counts = {int(k): int(v) for k, v in store.hgetall(key).items()}
    store.delete(key)
    # The other relays' first publish of a batch they claimed after the kill (what they had
    # claimed before goes on being published meanwhile), and their longest silence after it.
    others = [t for publisher in (publishers[0], publishers[2])
              for t, claimed in publisher.batches if _naive_utc(claimed) > killed_utc]
    after = sorted(t for publisher in (publishers[0], publishers[2]) for t in publisher.times
                   if t > killed)
    silence = max((b - a for a, b in zip([killed, *after], after)), default=None)
    per_node = {}
    for node in nodes:
        check = node.with_name(DATABASE).database()
        per_node[node.port] = dict(check.execute_sql(
            "SELECT status, COUNT(*) FROM outbox_event GROUP BY status").fetchall())
        check.close()
    figures = {
        "kill -> first publish by the others of a batch claimed after it s":
            round(min(others) - killed, 2) if others else None,
        "the others' longest silence after the kill s":
            round(silence, 2) if silence is not None else None,
        "kill -> drained s": round(drained - killed, 1),
        "node 2 rejoined (restart -> Synced) s": round(rejoin, 1),
        "published": len(counts), "published twice": sum(n > 1 for n in counts.values()),
        "conflicts survived": sum(relay.stats.lock_conflicts for relay in relays),
        "reconnects": [relay.stats.reconnects for relay in relays],
        "outbox per node": per_node,
    }
    print(figures)
    assert failures == [] and not any(thread.is_alive() for thread in threads), figures
    assert len(counts) == EVENTS, figures  # nothing lost
    assert [i for i, n in counts.items() if n > 1] == [], figures  # nothing twice
    assert drained - killed < LOCK_TIMEOUT + 30, figures  # nothing stuck past the lock timeout
    assert relays[1].stats.reconnects >= 1, figures  # node 2's relay moved to another node
    assert all(rows == {"published": EVENTS} for rows in per_node.values()), figures
