"""Ordered claims across Galera nodes (SPEC §4, §12): a relay with ``ordered=True`` on every
node of the cluster, each on its own node, over an outbox of several aggregates with many events
each. Each node's row locks are its own, so two relays may claim the same head at once; the
cluster refuses one of the two COMMITs (a lock conflict, counted), and a claim counts only once
committed. What must hold: every event published once, and the events of each aggregate reach
the broker in ``id`` order (the order in which the service wrote them)."""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping, Sequence

from outbox_lite import OutboxRepository
from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.relay import Relay

from _cluster import running

DATABASE = "outbox_galera_ordered"
AGGREGATES = 20
PER_AGGREGATE = 30


class Broker:
    """Keeps the order in which every event arrived, across the relays."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived: list[tuple[str, int]] = []

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        with self.lock:
            self.arrived += [(event.aggregate_id, event.id) for event in events]
        return {}

    def close(self) -> None:
        pass


def test_ordered_relays_on_every_node_keep_each_aggregates_order(galera_urls: list[str]) -> None:
    nodes = [DatabaseUrl.parse(url).with_name(DATABASE) for url in galera_urls]
    nodes[0].drop_database()
    nodes[0].create_database()
    setup = nodes[0].database()
    schema.migrate(setup)
    repo = OutboxRepository(setup)
    for n in range(PER_AGGREGATE):  # interleaved, as services write them
        with setup.atomic():
            for a in range(AGGREGATES):
                repo.create_in_transaction(event_type="step", aggregate_type="order",
                                           aggregate_id=f"order-{a}", payload={"step": n})
    broker = Broker()
    relays = [Relay(OutboxRepository(node.database()), broker, worker_id=f"node{i + 1}",
                    batch_size=10, ordered=True, lock_timeout=60, progress_every=0,
                    idle_pause=0.02, max_idle_pause=0.1)
              for i, node in enumerate(nodes)]
    started = time.monotonic()
    total = AGGREGATES * PER_AGGREGATE
    with running(relays) as (_, failures):
        while time.monotonic() < started + 120:
            if setup.execute_sql("SELECT COUNT(*) FROM outbox_event WHERE status ="
                                 " 'published'").fetchone()[0] == total:
                break
            time.sleep(0.1)
    seconds = time.monotonic() - started
    ids = [event_id for _, event_id in broker.arrived]
    per_aggregate: dict[str, list[int]] = {}
    for aggregate, event_id in broker.arrived:
        per_aggregate.setdefault(aggregate, []).append(event_id)
    figures = {"events": total, "seconds": round(seconds, 1),
               "published by node": [r.stats.published for r in relays],
               "conflicts survived": [r.stats.lock_conflicts for r in relays]}
    print(figures)
    setup.close()
    for relay in relays:
        relay.repository.database.close()
    assert failures == [], figures
    assert sorted(ids) == sorted(set(ids)) and len(ids) == total, figures  # each once
    out_of_order = {a: got for a, got in per_aggregate.items() if got != sorted(got)}
    assert out_of_order == {}, figures
    assert sum(1 for r in relays if r.stats.published) >= 2, figures  # several nodes worked
