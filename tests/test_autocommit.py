"""A server whose sessions start with autocommit off: every statement the library runs
outside the caller's transaction still commits (issue 21, item 1).

One private server for the module (server-wide settings never touch the shared one), started
with ``--autocommit=0``. What each server answers is pinned in the first test: MySQL's
handshake says autocommit is on while the session has it off, and PyMySQL trusts the flag, so
nothing the library writes outside a transaction ever commits; MariaDB's handshake tells the
truth, and PyMySQL turns autocommit on itself. The other server-wide way to make it off,
``init_connect = 'SET autocommit = 0'``, runs after the handshake for ordinary accounts and
defeats PyMySQL on both: so the library is used through an ordinary account, as a service
connects, with ``init_connect`` set, and on MariaDB with the global default back on (with both,
MariaDB's handshake says off and PyMySQL's own SET runs after ``init_connect``).

PostgreSQL has no autocommit on the server (``SHOW autocommit`` is 42704, no such setting):
every session commits each statement unless it says BEGIN, and Peewee's connections are
autocommit on the driver's side. What the server can do to a transaction a session leaves open
is end it: the private server there runs with ``idle_in_transaction_session_timeout`` (server-
wide), so a transaction the library left behind would be ended, its writes lost. The tests state
that the server has it, that a library statement outside the caller's transaction leaves the
session ``idle`` (pg_stat_activity, asked from another session, not timed), and that every change
is seen by another session at once, as on MySQL.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterator

import peewee as pw
import pytest

from outbox_lite import OutboxRepository
from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.cli import main
from outbox_lite.relay import Relay

from _servers import own_server
from _helpers import FAMILY, committed, sqlstate_or_errno, transaction_state

#: PostgreSQL's server-wide setting of the private server: a session idle in a transaction this
#: long is ended by the server (never reached by a test: each asks the session's state instead).
IDLE_TIMEOUT = "30s"

PASSWORD = "autocommit-off-pw"
SERVICE = "outbox_service"


class Private:
    """The module's private server: ``root`` (the tests' view) and ``service`` (the URL the
    library is used through)."""

    def __init__(self, root: DatabaseUrl) -> None:
        self.root = root
        #: (handshake flag, session autocommit) for root, raw and through PyMySQL's
        #: autocommit=True, read before init_connect was set.
        self.root_answers = (_answers(root, autocommit=None), _answers(root, autocommit=True)
                             ) if FAMILY.name == "mysql" else None
        self.service = DatabaseUrl.parse(
            f"{FAMILY.SCHEME}://{SERVICE}:{PASSWORD}@{root.host}:{root.port}/{root.name}")

    def look(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Committed state, read on a new root connection in autocommit (set explicitly:
        MySQL's root session would start with it off)."""
        return [tuple(row.values()) for row in committed(self.root, sql, *params)]

    def fetch(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        return committed(self.root, sql, *params)

    def statuses(self) -> dict[int, str]:
        return dict(self.look("SELECT id, status FROM outbox_event"))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def private(server: Any) -> Iterator[Private]:
    if FAMILY.name == "postgresql":
        with own_server(idle_in_transaction_session_timeout=IDLE_TIMEOUT) as root:
            root.create_database()
            setup = root.database()
            schema.migrate(setup)
            # CREATE ROLE takes no parameters: the server quotes the password (format's %L).
            (create_role,) = setup.execute_sql("SELECT format('CREATE ROLE %%I LOGIN PASSWORD"
                                               " %%L', %s::text, %s::text)",
                                               (SERVICE, PASSWORD)).fetchone()
            setup.execute_sql(create_role)
            for kind in ("TABLES", "SEQUENCES"):
                setup.execute_sql(f"GRANT ALL ON ALL {kind} IN SCHEMA public TO {SERVICE}")
            setup.close()
            yield Private(root)
        return
    with own_server(autocommit=0) as root:
        private = Private(root)
        root.create_database()
        setup = root.database(init_command="SET autocommit = 1")  # set-up is not under test
        schema.migrate(setup)
        setup.close()
        conn = root.server_connection()
        try:
            with conn.cursor() as cur:
                cur.execute("SET GLOBAL init_connect = 'SET autocommit = 0'")
                if server.is_mariadb:
                    cur.execute("SET GLOBAL autocommit = 1")  # see the module's docstring
                cur.execute(f"CREATE USER '{SERVICE}'@'%%' IDENTIFIED BY %s", (PASSWORD,))
                cur.execute(f"GRANT ALL ON `{root.name}`.* TO '{SERVICE}'@'%'")
        finally:
            conn.close()
        yield private


@pytest.fixture
def service(private: Private) -> Iterator[Any]:
    """A Peewee database on the service account; the outbox is emptied first."""
    private.look("DELETE FROM outbox_event")
    database = private.service.database()
    yield database
    if not database.is_closed():
        database.close()


def _events(database: Any, repo: OutboxRepository, count: int) -> list[int]:
    with database.atomic():  # BEGIN ... COMMIT: committed whatever autocommit is
        return [repo.create_in_transaction(event_type="job.created", aggregate_type="job",
                                           aggregate_id=str(n), payload={"n": n}).id
                for n in range(count)]


def _answers(url: DatabaseUrl, **connect: Any) -> tuple[bool, int]:
    """(the handshake's autocommit flag, the session's @@autocommit) for a new connection."""
    import pymysql  # MySQL's driver: asked of a MySQL server only

    conn = pymysql.connect(host=url.host, port=url.port, user=url.user,
                           password=url.password, **connect)
    try:
        flag = bool(conn.server_status & pymysql.constants.SERVER_STATUS.SERVER_STATUS_AUTOCOMMIT)
        with conn.cursor() as cur:
            cur.execute("SELECT @@SESSION.autocommit")
            return flag, int(cur.fetchone()[0])
    finally:
        conn.close()


def _idle(private: Private, database: Any) -> str:
    """How the session of ``database`` (this thread's connection) stands, asked by root."""
    return transaction_state(private.fetch, FAMILY.session_id(database))


def test_what_each_server_answers_and_what_the_library_makes_of_it(private, service, server):
    if FAMILY.name == "postgresql":
        # No autocommit on the server; the setting that ends an open transaction is there.
        assert sqlstate_or_errno(lambda: private.look("SHOW autocommit")) == "42704"
        assert private.look("SELECT current_setting('idle_in_transaction_session_timeout')"
                            ) == [(IDLE_TIMEOUT,)]
        assert service.connection().autocommit is True  # Peewee's, on the driver's side
        repo = OutboxRepository(service)
        repo.stats()
        assert _idle(private, service) == "idle"
        with service.atomic():  # what the check sees when a transaction is open
            service.execute_sql("SELECT 1")
            assert _idle(private, service) == "in transaction"
        assert _idle(private, service) == "idle"
        return
    # --autocommit=0, root (init_connect does not run for administrators):
    if server.is_mariadb:  # the handshake says it is off, so PyMySQL turns it on
        assert private.root_answers == ((False, 0), (True, 1))
    else:  # the handshake says it is on, which is untrue, and PyMySQL believes it
        assert private.root_answers == ((True, 0), (True, 0))
    # init_connect runs after the handshake, for ordinary accounts, on both servers.
    assert _answers(private.service, autocommit=True) == (True, 0)

    repo = OutboxRepository(service)
    repo.stats()  # the library's first statement on this connection asks the server
    assert service.execute_sql("SELECT @@SESSION.autocommit").fetchone()[0] == 1


def _session_autocommit(database: Any) -> int:
    """The session's autocommit as the driver left it, read past the library (PostgreSQL:
    the driver's, the only one there is)."""
    if FAMILY.name == "postgresql":
        return int(database.connection().autocommit)
    with database.connection().cursor() as cur:
        cur.execute("SELECT @@SESSION.autocommit")
        return int(cur.fetchone()[0])


def test_single_row_methods_commit_and_say_so_once(private, service, caplog):
    # Peewee 4 leaves the session as init_connect made it (off); Peewee 3's connection on
    # MariaDB came back with it on (measured), and then there is nothing to say.
    started_off = _session_autocommit(service) == 0
    repo = OutboxRepository(service)
    first, second, third = _events(service, repo, 3)
    with caplog.at_level(logging.WARNING, logger="outbox_lite"):
        assert repo.mark_processing(first, "w1")
        assert repo.mark_published(first, "w1") is True
        assert repo.mark_processing(second, "w1")
        assert repo.mark_failed(second, "w1", "boom", "it broke", retryable=False)
        assert repo.requeue_failed([second]) == 1
    assert _idle(private, service) == "idle"  # nothing left open on the service's session
    # Another session sees each change at once, before this connection is closed ...
    assert private.statuses() == {first: "published", second: "pending", third: "pending"}
    service.close()  # ... and after (a session's open transaction would roll back here)
    assert private.statuses() == {first: "published", second: "pending", third: "pending"}
    assert private.look("SELECT published_at IS NOT NULL, locked_by FROM outbox_event"
                        " WHERE id = %s", first) == [(1 if FAMILY.name == "mysql" else True,
                                                       None)]
    warnings = [r.getMessage() for r in caplog.records if "autocommit" in r.getMessage()]
    assert len(warnings) == (1 if started_off else 0), warnings  # once per database
    if started_off:
        assert f"{private.root.host}:{private.root.port}/{private.root.name}" in warnings[0]
    assert PASSWORD not in caplog.text


def test_every_pooled_connection_commits(private, service):
    pool = private.service.database(FAMILY.pooled_class(), max_connections=2)
    repo = OutboxRepository(pool)
    ids = _events(pool, repo, 4)
    pool.close()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def publish(pair: list[int]) -> None:
        try:
            barrier.wait()  # both threads hold a connection of their own at once
            for event_id in pair:
                assert repo.mark_processing(event_id, "w") and repo.mark_published(event_id, "w")
            assert _idle(private, pool) == "idle"
            pool.close()  # back to the pool, and out again on the next round
            for event_id in pair:
                assert repo.mark_published(event_id, "w") is False  # fenced: published
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(ids[n::2],)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    pool.close_all()
    assert errors == []
    assert private.statuses() == {event_id: "published" for event_id in ids}


def test_cli_requeue_and_purge_change_the_rows(private, service, capsys):
    repo = OutboxRepository(service)
    dead, old, young = _events(service, repo, 3)
    private.look("UPDATE outbox_event SET status = 'failed', last_error_code = 'boom'"
                 " WHERE id = %s", dead)
    private.look("UPDATE outbox_event SET status = 'published', published_at = %s"
                 " WHERE id IN (%s, %s)", "2020-01-01 00:00:00", old, young)
    private.look(f"UPDATE outbox_event SET published_at = {FAMILY.UTC_NOW} WHERE id = %s",
                 young)
    url = private.service.secret_text()
    assert main(["dead-letters", "--requeue", "--all", "--database-url", url]) == 0
    assert main(["purge", "--older-than", "30d", "--database-url", url]) == 0
    out = capsys.readouterr().out
    assert "requeued 1 dead letter" in out and "purged 1 published event" in out, out
    assert private.statuses() == {dead: "pending", young: "published"}


class _StopMidBatch:
    """Publishes a batch while asking the relay to stop (the stop comes mid-batch)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def publish(self, events: Any) -> dict[int, BaseException]:
        self.stop.set()
        return {}

    def close(self) -> None:
        pass


def test_a_relay_stopped_mid_batch_leaves_nothing_processing(private, service):
    repo = OutboxRepository(service)
    ids = _events(service, repo, 20)
    stop = threading.Event()
    relay = Relay(repo, _StopMidBatch(stop), batch_size=10, progress_every=0)
    relay.run(stop)
    assert relay.stats.published == 10
    statuses = private.statuses()
    assert sorted(statuses.values()).count("published") == 10, statuses
    assert "processing" not in statuses.values()
    service.close()
    assert private.statuses() == statuses
    assert len(statuses) == len(ids)


class _WaitForRenewal:
    """Holds the publish until the heartbeat has renewed the batch, then checks from another
    session that the renewal left no lock behind."""

    def __init__(self, private: Private) -> None:
        self.private = private
        self.relay: Relay | None = None
        self.locked_after_renewal: list[str] = []

    def publish(self, events: Any) -> dict[int, BaseException]:
        assert self.relay is not None
        deadline = time.monotonic() + 10
        while self.relay.stats.renewals < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # waits for the heartbeat's event, not for time to pass
        database = self.private.root.database()
        try:
            FAMILY.limit_lock_waits(database, 1)
            with database.atomic() as txn:
                try:
                    database.execute_sql("SELECT id FROM outbox_event WHERE id = %s FOR UPDATE",
                                         (events[0].id,))
                except pw.DatabaseError as exc:  # 1205 / 55P03: the heartbeat's session holds it
                    self.locked_after_renewal.append(str(exc))
                txn.rollback()
        finally:
            database.close()
        return {}

    def close(self) -> None:
        pass


def test_the_heartbeat_holds_no_transaction_and_the_record_does_not_wait(private, service):
    repo = OutboxRepository(service)
    ids = _events(service, repo, 5)
    publisher = _WaitForRenewal(private)
    relay = Relay(repo, publisher, batch_size=5, lock_timeout=30, heartbeat=0.05,
                  progress_every=0)
    publisher.relay = relay
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(relay.run_once()), daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(timeout=15)
    relay.close()
    assert relay.stats.renewals >= 1
    assert publisher.locked_after_renewal == []  # the renewal committed: no lock held
    assert done and done[0].published == 5, f"run_once still running after 15 s: {done}"
    assert time.monotonic() - started < 10
    assert private.statuses() == {event_id: "published" for event_id in ids}
