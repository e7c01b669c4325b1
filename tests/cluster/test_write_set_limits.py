"""A cluster's write-set limit (SPEC §12), set small with SET GLOBAL on the test's own cluster:
Galera's ``wsrep_max_ws_size`` and Group Replication's ``group_replication_transaction_size_limit``.

* A service's transaction over it: the cluster refuses its COMMIT (Galera 1105 "Maximum
  writeset size exceeded", Group Replication 3100 from the ``before_commit`` hook); nothing of it
  is written, on any node, and ``is_retryable`` is false for it (a retry loop does not spin).
* A relay whose batch is over it: the claim's transaction is refused
  (``WriteSetTooLargeError``); the relay halves its batch until the claims fit and drains
  everything, each event published once; it never dies.

And Galera's ``wsrep_sync_wait`` (causal reads) on the relay's node: the relay drains as usual.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping, Sequence

import peewee
import pytest

from outbox_lite import OutboxRepository, is_retryable
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.relay import Relay

from _cluster import running, seed_outbox

DATABASE = "outbox_write_set"
EVENTS = 200
LIMIT = 8000  # bytes: about 20 claimed rows of these events


class Counting:
    """A publisher that never fails and counts every publish of every event."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        for event in events:
            self.counts[event.id] = self.counts.get(event.id, 0) + 1
        return {}

    def close(self) -> None:
        pass


@pytest.fixture(params=["galera", "group_replication"])
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, DatabaseUrl, list[DatabaseUrl]]]:
    """(the limit's setting, the URL the service and relay use, every member's URL)."""
    if request.param == "galera":
        nodes = [DatabaseUrl.parse(u).with_name(DATABASE)
                 for u in request.getfixturevalue("galera_urls")]
        yield "wsrep_max_ws_size", nodes[0], nodes
    else:
        members = [DatabaseUrl.parse(u).with_name(DATABASE)
                   for u in request.getfixturevalue("group_replication_urls")]
        admin = members[0].with_name("mysql").database()
        primary = admin.execute_sql(  # whichever mode an earlier test left: a primary
            "SELECT MEMBER_PORT FROM performance_schema.replication_group_members"
            " WHERE MEMBER_ROLE = 'PRIMARY' ORDER BY MEMBER_PORT").fetchone()[0]
        admin.close()
        yield ("group_replication_transaction_size_limit",
               next(m for m in members if m.port == int(primary)), members)


def _seed(url: DatabaseUrl) -> peewee.Database:
    return seed_outbox(url, EVENTS, per_commit=20, payload={"text": "x" * 200})


def _drain(relay: Relay, db: peewee.Database, seconds: float = 60) -> list[BaseException]:
    deadline = time.monotonic() + seconds
    with running([relay]) as (threads, failures):
        while time.monotonic() < deadline and threads[0].is_alive():
            published = db.execute_sql(
                "SELECT COUNT(*) FROM outbox_event WHERE status = 'published'").fetchone()[0]
            if published == EVENTS:
                break
            time.sleep(0.1)
    return failures


def test_over_the_write_set_limit(cluster: tuple[str, DatabaseUrl, list[DatabaseUrl]]) -> None:
    setting, url, members = cluster
    db = _seed(url)
    repo = OutboxRepository(db)
    # SET GLOBAL on the member this URL writes to (the limit is checked where a transaction
    # starts); new sessions see it.
    old = db.execute_sql(f"SELECT @@GLOBAL.{setting}").fetchone()[0]
    db.execute_sql(f"SET GLOBAL {setting} = {LIMIT}")
    try:
        db.close()
        with pytest.raises(peewee.OperationalError) as refused:
            with db.atomic():
                for n in range(5):
                    repo.create_in_transaction(event_type="job.big", aggregate_type="job",
                                               aggregate_id="big", payload={"text": "y" * 3000})
        assert refused.value.args[0] in (1105, 3100), refused.value
        assert not is_retryable(refused.value)
        db.close()
        for member in members:  # nothing of it anywhere
            check = member.database()
            assert check.execute_sql("SELECT COUNT(*) FROM outbox_event WHERE event_type ="
                                     " 'job.big'").fetchone()[0] == 0, member.port
            check.close()

        publisher = Counting()
        relay = Relay(OutboxRepository(url.database()), publisher, batch_size=100,
                      progress_every=0, idle_pause=0.05)
        failures = _drain(relay, db)
        relay.repository.database.close()
    finally:
        db.execute_sql(f"SET GLOBAL {setting} = {old}")
        db.close()
    assert failures == []
    assert relay.claim_limit < 100  # halved until the claims fit
    assert len(publisher.counts) == EVENTS and set(publisher.counts.values()) == {1}
    for member in members:
        check = member.database()
        rows = dict(check.execute_sql(
            "SELECT status, COUNT(*) FROM outbox_event GROUP BY status").fetchall())
        check.close()
        assert rows == {"published": EVENTS}, (member.port, rows)
    print({"setting": setting, "limit bytes": LIMIT, "claim limit reached": relay.claim_limit,
           "refused COMMIT": refused.value.args})


def test_galera_sync_wait_on_the_relays_node(galera_urls: list[str]) -> None:
    url = DatabaseUrl.parse(galera_urls[0]).with_name(DATABASE)
    db = _seed(url)
    db.execute_sql("SET GLOBAL wsrep_sync_wait = 15")  # causal reads for every statement
    try:
        publisher = Counting()
        relay = Relay(OutboxRepository(url.database()), publisher, batch_size=50,
                      progress_every=0, idle_pause=0.05)
        assert relay.repository.database.execute_sql(
            "SELECT @@SESSION.wsrep_sync_wait").fetchone()[0] == 15
        failures = _drain(relay, db)
        relay.repository.database.close()
    finally:
        db.execute_sql("SET GLOBAL wsrep_sync_wait = 0")
        db.close()
    assert failures == []
    assert len(publisher.counts) == EVENTS and set(publisher.counts.values()) == {1}
