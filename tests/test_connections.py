"""Broken connections on the real server: what reaches the caller, reconnect(), and the
README's worker loop and commit-retry pattern, run exactly as the README prints them.

Connections are killed from a second connection (MySQL's KILL CONNECTION, PostgreSQL's
pg_terminate_backend); each test waits until the server no longer lists the killed connection
(its state, not a timer).
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from playhouse.shortcuts import ReconnectMixin

from outbox_lite import (
    CONNECTION_ERRORS,
    ConnectionLostError,
    OutboxError,
    OutboxRepository,
    reconnect,
)

from _helpers import FAMILY, FakeClock, seed

from _docs import block as docs_block


def readme_block(page: str, *containing: str) -> str:
    """The Python block of the docs page that holds ``containing``."""
    return docs_block(page, *containing, lang="python")


def kill(fetch, connection_id: int) -> None:
    fetch(FAMILY.kill_sql(connection_id))
    for _ in range(1000):  # until the server has let it go
        if not fetch(FAMILY.SESSION_ALIVE, connection_id):
            return
        time.sleep(0.005)
    raise AssertionError(f"connection {connection_id} outlived its KILL")


class _Killable:
    """A database that kills its own connection, from the test's admin connection, just
    before running the first statement that contains ``kill_before``."""

    fetch: Any = None
    kill_before: str | None = None
    kills = 0

    def connection_id(self) -> int:
        return FAMILY.session_id(super())

    def kill_now(self) -> None:
        kill(self.fetch, self.connection_id())
        self.kills += 1

    def execute_sql(self, sql, params=None, *args, **kwargs):
        if self.kill_before and self.kill_before in sql:
            self.kill_before = None
            self.kill_now()
        return super().execute_sql(sql, params, *args, **kwargs)  # type: ignore[misc]


# Peewee's classes as a service uses them (FAMILY.database_class: on MySQL connecting with
# database=, so that Peewee 3's deprecated db= does not fail the run): reconnecting is
# Peewee's, unchanged.
class Plain(_Killable, FAMILY.database_class()):  # type: ignore[misc]
    pass


class Pooled(_Killable, FAMILY.pooled_class()):  # type: ignore[misc]
    pass


class Reconnecting(_Killable, ReconnectMixin, FAMILY.database_class()):  # type: ignore[misc]
    pass


KINDS = {
    "autoconnect": (Plain, {}),
    "autoconnect=False": (Plain, {"autoconnect": False}),
    "pooled": (Pooled, {"max_connections": 4}),
    "pooled, autoconnect=False": (Pooled, {"max_connections": 4, "autoconnect": False}),
    "ReconnectMixin": (Reconnecting, {}),
}


def make(kind: str, db_url, fetch) -> Any:
    cls, options = KINDS[kind]
    database = db_url.database(cls, **options)
    database.fetch = fetch
    if not database.autoconnect:
        database.connect()  # what a user of autoconnect=False does first
    return database


class Until:
    """``stopping.is_set()``: true once no event is pending or processing, or after
    ``rounds`` checks (so that a broken loop fails the test instead of hanging it)."""

    def __init__(self, fetch, rounds: int = 200) -> None:
        self.fetch, self.rounds, self.checks = fetch, rounds, 0

    def is_set(self) -> bool:
        self.checks += 1
        left = self.fetch("SELECT COUNT(*) AS n FROM outbox_event"
                          " WHERE status IN ('pending', 'processing')")[0]["n"]
        return left == 0 or self.checks > self.rounds


# ---------------------------------------------------------------------------
# The README's worker loop, as printed
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["inside the claim transaction", "between publishes"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_readme_worker_loop_survives_a_killed_connection(db_url, fetch, kind, where):
    database = make(kind, db_url, fetch)
    clock = FakeClock()
    outbox = OutboxRepository(database, clock=clock)
    ids = seed(outbox, 30)
    before = database.connection_id()
    published: list[int] = []

    def publish(event_type, payload):
        published.append(payload["n"])
        if where == "between publishes" and len(published) == 3:
            database.kill_now()  # the 3rd event's mark_published meets a dead connection
            clock.advance(seconds=301)  # and the batch's claims expire: release takes them

    if where == "inside the claim transaction":
        database.kill_before = "FOR UPDATE SKIP LOCKED"
    stopping = Until(fetch)
    page = "docs/guides/worker-loop.md"
    namespace: dict = {}
    exec(compile(readme_block(page, "def run_worker("), page, "exec"), namespace)
    namespace["run_worker"](database, outbox, "worker-1", publish, stopping)

    assert stopping.checks <= stopping.rounds, "the loop never finished the outbox"
    assert database.kills == 1
    assert fetch("SELECT id, status FROM outbox_event ORDER BY id") == [
        {"id": i, "status": "published"} for i in ids]
    assert sorted(set(published)) == list(range(30))
    assert database.connection_id() != before  # a new connection did the rest
    database.close()


# ---------------------------------------------------------------------------
# What reaches the caller, and what its message promises
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_connection_lost_inside_atomic_reaches_the_caller_as_documented(
        db_url, fetch, kind):
    database = make(kind, db_url, fetch)
    outbox = OutboxRepository(database)
    [event_id] = seed(outbox, 1)
    database.kill_before = "FOR UPDATE SKIP LOCKED"
    with pytest.raises(CONNECTION_ERRORS) as info:
        with database.atomic():
            outbox.claim_batch("w")
    # Peewee's ROLLBACK on the dead connection raises as the block ends; ours is its context.
    assert isinstance(info.value, FAMILY.rollback_error_on_a_dead_connection(database))
    chain = []
    exc: BaseException | None = info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__context__
    [lost] = [e for e in chain if isinstance(e, ConnectionLostError)]
    assert "inside a transaction" in str(lost) and "reconnect(database)" in str(lost)
    assert not database.in_transaction()
    assert reconnect(database) is True
    with database.atomic():
        assert [e.id for e in outbox.claim_batch("w")] == [event_id]
    assert fetch("SELECT status FROM outbox_event") == [{"status": "processing"}]
    database.close()


def test_autoconnect_false_before_connect_says_to_call_connect(db_url, fetch):
    database = db_url.database(autoconnect=False)
    outbox = OutboxRepository(database)
    with pytest.raises(ConnectionLostError, match=r"call database\.connect\(\)") as info:
        outbox.find_dispatchable()
    assert "lost" not in str(info.value)  # it was never opened
    database.connect()
    assert outbox.find_dispatchable() == []
    database.close()


@pytest.mark.parametrize("autoconnect", [True, False])
def test_a_connection_lost_outside_a_transaction_says_what_reconnects(
        db_url, fetch, autoconnect):
    database = db_url.database(Plain, autoconnect=autoconnect)
    database.fetch = fetch
    database.connect()
    outbox = OutboxRepository(database)
    [event_id] = seed(outbox, 1)
    database.kill_now()
    with pytest.raises(ConnectionLostError) as info:
        outbox.mark_processing(event_id, "w")
    if autoconnect:
        assert "the next call opens a new one" in str(info.value)
        assert outbox.mark_processing(event_id, "w") is True  # as promised
    else:
        assert "call database.connect()" in str(info.value)
        with pytest.raises(ConnectionLostError, match=r"call database\.connect\(\)"):
            outbox.mark_processing(event_id, "w")  # nothing reconnects by itself: as said
        assert reconnect(database) is True
        assert outbox.mark_processing(event_id, "w") is True
    assert fetch("SELECT status, attempt_count FROM outbox_event") == [
        {"status": "processing", "attempt_count": 1}]
    database.close()


def test_reconnect_refuses_inside_a_transaction_and_changes_nothing(db_url, fetch):
    database = db_url.database()
    outbox = OutboxRepository(database)
    with database.atomic():
        database.execute_sql("CREATE TEMPORARY TABLE t (id INT)")
        connection = database.connection()
        with pytest.raises(OutboxError, match="outside a transaction"):
            reconnect(database)
        assert database.connection() is connection
        outbox.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="1",
                                     payload={})
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 1}]
    database.close()


def test_an_unreachable_server_is_a_connection_error_and_reconnect_says_false(db_url):
    database = db_url.with_name(db_url.name).database(port=1, connect_timeout=2)
    outbox = OutboxRepository(database)
    with pytest.raises(ConnectionLostError, match="cannot reach the server"):
        outbox.find_dispatchable()
    assert reconnect(database) is False
    assert database.is_closed()


# ---------------------------------------------------------------------------
# A COMMIT that fails may have committed: the README's pattern
# ---------------------------------------------------------------------------

class CommitReplyLost(FAMILY.database_class()):  # type: ignore[misc]
    """The server commits, and the client never hears so: the first COMMIT "fails"."""

    lose_next_reply = True

    def commit(self):
        super().commit()
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise FAMILY.lost_connection_error()


@pytest.mark.parametrize("deterministic_key", [True, False])
def test_the_readme_retry_after_a_failed_commit_writes_once(db, db_url, fetch,
                                                             deterministic_key):
    database = db_url.database(CommitReplyLost)
    outbox = OutboxRepository(database)
    page = "docs/guides/producing.md"
    code = readme_block(page, "def place_order_retrying(")
    if not deterministic_key:  # what the README warns about: a random (default) key
        code, n = re.subn(r",\s*dedupe_key=[^)]*\)", ")", code)
        assert n == 1
    namespace: dict = {}
    exec(compile(code, page, "exec"), namespace)
    namespace["place_order_retrying"](database, outbox, 42)
    copies = 1 if deterministic_key else 2
    assert fetch("SELECT name FROM job") == [{"name": "order-42"}] * copies
    assert fetch("SELECT aggregate_id FROM outbox_event") == [{"aggregate_id": "42"}] * copies
    database.close()
