"""A transaction over a cluster's write-set limit (SPEC §12): Galera refuses it with 1105
"Maximum writeset size exceeded" (``wsrep_max_ws_size``), Group Replication's COMMIT with 3100
from its ``before_commit`` hook (``group_replication_transaction_size_limit``). The test proxy
refuses the relay's claim COMMITs with those exact errors (as test_refused_commit does for
conflicts); tests/cluster/test_write_set_limits.py does the same on the real clusters.

What must hold: the claim is ``WriteSetTooLargeError`` (not a conflict retried as it is, not the
relay's death); the relay halves its batch each time and drains everything, each event handed
to the broker once; a service's COMMIT so refused is not ``is_retryable``."""

from __future__ import annotations

import pytest

from outbox_lite import OutboxRepository, WriteSetTooLargeError, is_retryable
from outbox_lite._families import family_of
from outbox_lite.relay import Relay

from _helpers import FAMILY, seed

pytestmark = pytest.mark.skipif(FAMILY.name != "mysql",
                                reason="a write-set limit is a MySQL-family cluster's")

TOO_LARGE = [
    (1105, "HY000", "Maximum writeset size exceeded"),
    (3100, "HY000", "Error on observer while running replication hook 'before_commit'."),
]


class Broker:
    def __init__(self) -> None:
        self.published: list[int] = []

    def publish(self, events):
        self.published += [e.id for e in events]
        return {}

    def close(self):
        pass


@pytest.fixture
def proxied(db_url, proxy):
    database = db_url.database(host="127.0.0.1", port=proxy.port, **FAMILY.PLAIN_TEXT)
    yield database
    database.close()


@pytest.mark.parametrize("error", TOO_LARGE, ids=[str(e[0]) for e in TOO_LARGE])
def test_the_relay_halves_its_batch_until_the_claim_fits(proxied, proxy, repo, fetch, error):
    ids = seed(repo, 30)
    broker = Broker()
    relay = Relay(OutboxRepository(proxied), broker, batch_size=20, lock_timeout=60,
                  progress_every=0)
    proxy.refuse(error, commits=(0, 1))  # the claims of 20 and of 10 events
    relay.run(until_empty=True)
    assert len(proxy.refused) == 2
    assert relay.claim_limit == 5
    assert sorted(broker.published) == ids  # each once
    rows = fetch("SELECT status, attempt_count FROM outbox_event ORDER BY id")
    assert [tuple(r.values()) for r in rows] == [("published", 1)] * 30
    assert relay.stats.lock_conflicts == 0


@pytest.mark.parametrize("error", TOO_LARGE, ids=[str(e[0]) for e in TOO_LARGE])
def test_the_refusal_is_its_own_error_and_not_retryable(db, error):
    import peewee as pw
    import pymysql

    code, _, message = error
    refused = pw.OperationalError(code, message)
    refused.orig = pymysql.err.OperationalError(code, message)
    assert isinstance(family_of(db).write_set_too_large(refused), WriteSetTooLargeError)
    assert not is_retryable(refused)
    other = pymysql.err.OperationalError(1105, "Unknown error")  # 1105 for anything else
    assert family_of(db).write_set_too_large(other) is None
