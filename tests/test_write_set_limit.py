"""A transaction over a cluster's write-set limit (SPEC §12): Galera refuses it with 1105
"Maximum writeset size exceeded" (``wsrep_max_ws_size``), Group Replication's COMMIT with 3100
from its ``before_commit`` hook (``group_replication_transaction_size_limit``). The test proxy
refuses the relay's claim COMMITs with those exact errors (as test_refused_commit does for
conflicts); tests/cluster/test_write_set_limits.py does the same on the real clusters.

What must hold: the claim is ``WriteSetTooLargeError`` (not a conflict retried as it is, not the
relay's death); the relay halves its batch each time and drains everything, each event handed
to the broker once; a service's COMMIT so refused is not ``is_retryable``. PostgreSQL has no
write set: the same tests state that it reads none into any error and never halves."""

from __future__ import annotations

import pytest

from outbox_lite import OutboxRepository, WriteSetTooLargeError, is_retryable
from outbox_lite._families import family_of
from outbox_lite.relay import Relay

from _helpers import FAMILY, seed

#: What each family's server answers for a transaction over a size limit. MySQL family: the
#: clusters' write-set refusals. PostgreSQL has no write-set limit (one server certifies
#: nothing at COMMIT); its nearest refusal is a statement's program_limit_exceeded (54000),
#: which must not be read as a write set: the relay does not halve for it.
TOO_LARGE = {
    "mysql": [
        (1105, "HY000", "Maximum writeset size exceeded"),
        (3100, "HY000", "Error on observer while running replication hook 'before_commit'."),
    ],
    "postgresql": [
        ("54000", "54000", "array size exceeds the maximum allowed (134217727)"),
    ],
}[FAMILY.name]
#: A statement the server itself refuses for a size, and the error it must raise.
PROGRAM_LIMIT = "SELECT array_fill(1, ARRAY[200000000])"


class Broker:
    def __init__(self) -> None:
        self.published: list[int] = []

    def publish(self, events):
        self.published += [e.id for e in events]
        return {}

    def close(self):
        pass


@pytest.mark.parametrize("error", TOO_LARGE, ids=[str(e[0]) for e in TOO_LARGE])
def test_the_relay_halves_its_batch_until_the_claim_fits(proxied, proxy, repo, fetch, error):
    if FAMILY.name == "postgresql":
        return _the_relay_does_not_halve_for_another_refusal(proxied, proxy, repo, fetch, error)
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


def _the_relay_does_not_halve_for_another_refusal(proxied, proxy, repo, fetch, error):
    """PostgreSQL: a claim COMMIT refused for another reason than a conflict ends the run with
    that error (as any error that is neither a conflict nor a lost connection does); its batch
    stays whole, nothing reached the broker, and the rolled-back claim left the events
    pending and unlocked for the next relay."""
    import peewee as pw

    ids = seed(repo, 30)
    broker = Broker()
    relay = Relay(OutboxRepository(proxied), broker, batch_size=20, lock_timeout=60,
                  progress_every=0)
    proxy.refuse(error, commits=(0,))
    with pytest.raises(pw.DatabaseError) as raised:
        relay.run(until_empty=True)
    assert "array size exceeds" in str(raised.value)
    assert not isinstance(raised.value, WriteSetTooLargeError)
    assert len(proxy.refused) == 1 and relay.claim_limit == 20
    assert broker.published == []
    rows = fetch("SELECT id, status, locked_by FROM outbox_event ORDER BY id")
    assert [(r["id"], r["status"], r["locked_by"]) for r in rows] == [
        (i, "pending", None) for i in ids]


def test_a_refusal_for_size_is_typed_only_where_it_is_a_write_set(db):
    """MariaDB and MySQL: each cluster refusal above is WriteSetTooLargeError and not
    retryable, and 1105 for anything else is not one. Every server: a statement refused for a
    size of its own (PostgreSQL: an array over its limit, 54000; MariaDB and MySQL: a DECIMAL's
    precision over 65, 1426) is the server's error, not WriteSetTooLargeError, and not
    retryable (it would be refused again)."""
    import peewee as pw

    if FAMILY.name == "mysql":
        import pymysql

        for code, _, message in TOO_LARGE:
            refused = pw.OperationalError(code, message)
            refused.orig = pymysql.err.OperationalError(code, message)
            assert isinstance(family_of(db).write_set_too_large(refused), WriteSetTooLargeError)
            assert not is_retryable(refused)
        other = pymysql.err.OperationalError(1105, "Unknown error")  # 1105 for anything else
        assert family_of(db).write_set_too_large(other) is None
    statement, code = {"postgresql": (PROGRAM_LIMIT, "54000"),
                       "mysql": ("SELECT CAST(1 AS DECIMAL(70, 0))", 1426)}[FAMILY.name]
    with pytest.raises(pw.DatabaseError) as raised:
        db.execute_sql(statement)
    if FAMILY.name == "postgresql":
        db.rollback()  # the failed statement's transaction
    assert FAMILY.error_code(raised.value) == code
    assert family_of(db).write_set_too_large(raised.value) is None
    assert not is_retryable(raised.value)
