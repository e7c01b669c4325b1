"""Several hosts in one URL (SPEC §12), on the test server of every family: the database a
URL listing ``host1:port1,host2:port2`` makes connects to the first host that answers and can
take writes; a host that answers but cannot take writes is the wrong host, which the relay
survives (moving on to the next host, or, with one host, waiting and saying so).

The server that refuses writes is a private one this module starts (tests/_servers.py) on a
free port and stops by its pid: MySQL and MariaDB with ``SET GLOBAL read_only = ON`` (the
server's own setting, never set on the shared servers), PostgreSQL with ``ALTER SYSTEM SET
default_transaction_read_only = on`` (libpq's ``target_session_attrs=read-write`` refuses it
as it refuses a standby in recovery; the real standby is the cluster suite's,
tests/cluster/test_postgres_failover.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import threading
import time
from typing import Any, Iterator, Mapping, Sequence

import pytest

from outbox_lite import OutboxRepository
from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.errors import WrongHostError
from outbox_lite.relay import Relay

from _docs import block
from _helpers import FAMILY, as_admin, login_name, new_event, seed
from _servers import own_server


def _dead_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listing(url: DatabaseUrl, *hosts: tuple[str, int], **options: Any) -> DatabaseUrl:
    """``url`` (its user, database and options) over ``hosts`` in that order."""
    merged = {**dict(url.options), **options}
    return dataclasses.replace(url, host=hosts[0][0], port=hosts[0][1], hosts=tuple(hosts),
                               options=tuple(sorted(merged.items())))


def _ids(fetch: Any, status: str) -> list[int]:
    return [row["id"] for row in fetch("SELECT id FROM outbox_event WHERE status = %s"
                                       " ORDER BY id", status)]


class _Collector:
    """A publisher that takes every event and keeps its id; ``on_first`` runs at the first
    publish, before it returns."""

    def __init__(self, on_first: Any = None) -> None:
        self.ids: list[int] = []
        self.on_first = on_first

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        if not self.ids and self.on_first is not None:
            self.on_first()
        self.ids.extend(event.id for event in events)
        return {}

    def close(self) -> None:
        pass


def test_multi_host_url_round_trips() -> None:
    url = DatabaseUrl.parse(f"{FAMILY.name}://u:p%40ss@h1:1001,[::1]:1002,h3/db")
    assert url.hosts == (("h1", 1001), ("::1", 1002), ("h3", url.default_port))
    assert (url.host, url.port) == ("h1", 1001)
    assert str(url) == f"{url.scheme}://u:***@h1:1001,[::1]:1002,h3:{url.default_port}/db"
    assert DatabaseUrl.parse(url.secret_text()) == url
    assert DatabaseUrl.parse(f"{FAMILY.name}://u@h1:1001/db").hosts == ()


def test_the_clusters_page_urls() -> None:
    """docs/servers/clusters.md's URLs read as several hosts each, in their order."""
    text = block("docs/servers/clusters.md", "node1:3306", lang="text")
    mysql_url, pg_url = (DatabaseUrl.parse(line) for line in text.split())
    assert mysql_url.hosts == (("node1", 3306), ("node2", 3306), ("node3", 3306))
    assert pg_url.hosts == (("primary", 5432), ("standby", 5432))
    assert dict(pg_url._params())["target_session_attrs"] == "read-write"
    assert (pg_url._params()["host"], pg_url._params()["port"]) == ("primary,standby",
                                                                    "5432,5432")


def _write_through(db_url: DatabaseUrl, first: tuple[str, int], fetch: Any) -> None:
    """Write an event through a URL listing ``first``, then the test server: it lands on the
    test server."""
    database = _listing(db_url, first, (db_url.host, db_url.port)).database()
    try:
        event = new_event(OutboxRepository(database), 1)
    finally:
        database.close()
    assert _ids(fetch, "pending") == [event.id]


def test_unreachable_first_host_is_passed_over(db_url: DatabaseUrl, fetch: Any) -> None:
    _write_through(db_url, ("127.0.0.1", _dead_port()), fetch)


# ---------------------------------------------------------------------------
# A server that answers but cannot take writes
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def read_only_server() -> Iterator[DatabaseUrl]:
    """A private server of the test server's kind that refuses writes (a server-wide setting
    made as the server runs: ALTER SYSTEM's, which a start's ``-c`` would override)."""
    with own_server() as url:
        _set_writable(url, False)
        yield url


def _writable_session(url: DatabaseUrl) -> Any:
    """A database on ``url`` whose sessions may write (the administrator's: MySQL's root is
    not held by read_only; PostgreSQL's session overrides default_transaction_read_only)."""
    if FAMILY.name == "postgresql":
        return url.database(options="-c default_transaction_read_only=off")
    return url.database()


def _set_writable(url: DatabaseUrl, writable: bool) -> None:
    database = _writable_session(url.with_name("postgres" if FAMILY.name == "postgresql"
                                               else "mysql"))
    try:
        if FAMILY.name == "postgresql":
            database.execute_sql("ALTER SYSTEM SET default_transaction_read_only = "
                                 + ("off" if writable else "on"))
            database.execute_sql("SELECT pg_reload_conf()")
        else:
            database.execute_sql(f"SET GLOBAL read_only = {'OFF' if writable else 'ON'}")
    finally:
        database.close()


def _private_database(server: DatabaseUrl, name: str) -> DatabaseUrl:
    """Database ``name`` on the private server, migrated (by a session that may write)."""
    url = server.with_name(name)
    if FAMILY.name == "postgresql":
        admin = _writable_session(server.with_name("postgres"))
        try:
            admin.execute_sql(url.DROP_SQL.format(name=name))
            admin.execute_sql(url.CREATE_SQL.format(name=name))
        finally:
            admin.close()
    else:
        url.drop_database()
        url.create_database()
    database = _writable_session(url)
    try:
        schema.migrate(database)
    finally:
        database.close()
    return url


def test_read_only_first_host_is_passed_over(read_only_server: DatabaseUrl, db_url: DatabaseUrl,
                                             fetch: Any) -> None:
    private = _private_database(read_only_server, db_url.name)
    _write_through(db_url, (private.host, private.port), fetch)
    check = _writable_session(private)
    try:
        assert check.execute_sql("SELECT COUNT(*) FROM outbox_event").fetchone()[0] == 0
    finally:
        check.close()


_APP, _APP_PASSWORD = "outbox_mover", "Mover-pass-7"


def _app_url(server: DatabaseUrl, name: str) -> DatabaseUrl:
    """``server``'s database ``name`` as an account that read_only holds (MySQL's and
    MariaDB's root is not held by it; on PostgreSQL the setting holds every session): made on
    ``server`` with every privilege on that database (dropped with the server, or by
    :func:`_drop_app` on the shared test server)."""
    if FAMILY.name == "postgresql":
        return server.with_name(name)
    as_admin(server, f"DROP USER IF EXISTS {login_name(_APP)}")
    as_admin(server, f"CREATE USER {login_name(_APP)} IDENTIFIED BY %s", _APP_PASSWORD)
    as_admin(server, f"GRANT ALL ON `{name}`.* TO {login_name(_APP)}")
    return dataclasses.replace(server.with_name(name), user=_APP, password=_APP_PASSWORD)


def _drop_app() -> None:
    if FAMILY.name == "mysql":
        as_admin(None, f"DROP USER IF EXISTS {login_name(_APP)}")


@contextlib.contextmanager
def _running(database: Any, publisher: _Collector, worker_id: str,
             **options: Any) -> Iterator[tuple[Relay, list[BaseException]]]:
    """A relay on ``database`` running in a thread (quick reconnects); (the relay, what its
    ``run`` raised), then it is stopped, joined and its database closed."""
    relay = Relay(OutboxRepository(database), publisher, worker_id=worker_id,
                  progress_every=0, reconnect_pause=0.05, max_reconnect_pause=0.2, **options)
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            relay.run(stop)
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield relay, failures
    finally:
        stop.set()
        thread.join(30)
        database.close()
        if thread.is_alive():
            failures.append(RuntimeError("the relay did not stop"))


def test_relay_on_one_read_only_host_waits_says_so_and_goes_on(
        read_only_server: DatabaseUrl, db_url: DatabaseUrl,
        caplog: pytest.LogCaptureFixture) -> None:
    private = _private_database(read_only_server, db_url.name)
    writer = _writable_session(private)
    try:
        event = new_event(OutboxRepository(writer), 1)
    finally:
        writer.close()
    publisher = _Collector()
    caplog.set_level(logging.WARNING, logger="outbox_lite")
    try:
        with _running(_app_url(read_only_server, db_url.name).database(), publisher,
                      "relay-ro") as (relay, failures):
            deadline = time.monotonic() + 30
            while "cannot take writes" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "the URL names this one host only: wait" in caplog.text
            assert publisher.ids == [] and failures == []
            _set_writable(read_only_server, True)
            while relay.stats.published < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        _set_writable(read_only_server, False)
    assert failures == []
    assert publisher.ids == [event.id]
    check = _writable_session(private)
    try:
        assert list(check.execute_sql("SELECT status FROM outbox_event").fetchall()) == [
            ("published",)]
    finally:
        check.close()


def test_write_to_one_read_only_host_is_the_wrong_host(read_only_server: DatabaseUrl,
                                                       db_url: DatabaseUrl) -> None:
    _private_database(read_only_server, db_url.name)
    database = _app_url(read_only_server, db_url.name).database()
    try:
        with pytest.raises(WrongHostError, match="cannot take writes"):
            new_event(OutboxRepository(database), 1)
    finally:
        database.close()


# ---------------------------------------------------------------------------
# The relay's host lost: it goes on on the next one
# ---------------------------------------------------------------------------

def test_relay_goes_on_on_the_next_host_when_its_host_is_lost(
        db_url: DatabaseUrl, proxy: Any, fetch: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Host 1 is a proxy to the test server that is closed (listener and every connection)
    during the relay's first publish; host 2 is the server itself. The relay's record meets
    the dead connection, reconnects to host 2 and records there; nothing is published twice."""
    url = _listing(db_url, ("127.0.0.1", proxy.port), (db_url.host, db_url.port),
                   **FAMILY.PLAIN_TEXT)
    writer = db_url.database()
    try:
        ids = seed(OutboxRepository(writer), 250)
    finally:
        writer.close()
    database = url.database()
    publisher = _Collector(on_first=proxy.close)
    relay = Relay(OutboxRepository(database), publisher, worker_id="relay-multi",
                  batch_size=50, progress_every=0, reconnect_pause=0.05)
    caplog.set_level(logging.WARNING, logger="outbox_lite")
    try:
        relay.run(until_empty=True)
    finally:
        database.close()
    assert sorted(publisher.ids) == ids  # each once
    assert _ids(fetch, "published") == ids
    assert relay.stats.reconnects >= 1
    assert "lost the database connection" in caplog.text


def test_relay_moves_on_when_its_host_stops_taking_writes(
        read_only_server: DatabaseUrl, db_url: DatabaseUrl, fetch: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """The relay runs on host 1 (the private server, writable, its outbox empty) until host 1
    turns read-only and receives the events as a replica would (written by a session read_only
    does not hold): the relay's claim there is refused (MySQL's UPDATE 1290; PostgreSQL's
    SELECT … FOR UPDATE 25006), and the relay reconnects, passes host 1 over and drains host
    2's outbox, the same events. (An idle relay on MySQL notices only at its next write: a
    locking read with nothing to claim is allowed on a read-only server.)"""
    private = _private_database(read_only_server, db_url.name)
    first = _app_url(read_only_server, db_url.name)
    second = _app_url(db_url, db_url.name)
    url = _listing(second, (private.host, private.port), (db_url.host, db_url.port))
    writer = db_url.database()
    try:
        ids = seed(OutboxRepository(writer), 30)
    finally:
        writer.close()
    _set_writable(read_only_server, True)
    publisher = _Collector()
    caplog.set_level(logging.WARNING, logger="outbox_lite")
    try:
        with _running(url.database(), publisher, "relay-mover", batch_size=10) as (
                relay, failures):
            deadline = time.monotonic() + 30
            while relay.stats.rounds < 5 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert publisher.ids == [] and first.user == second.user  # host 1: nothing there
            _set_writable(read_only_server, False)
            replica = _writable_session(private)
            try:
                assert seed(OutboxRepository(replica), 30) == ids
            finally:
                replica.close()
            while sorted(publisher.ids) != ids and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        _set_writable(read_only_server, False)
        _drop_app()
    assert failures == []
    assert sorted(publisher.ids) == ids  # each once, from host 2
    assert _ids(fetch, "published") == ids
    assert "cannot take writes" in caplog.text
    assert "the next connection goes to the first host of the URL that can" in caplog.text
