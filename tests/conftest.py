"""Test fixtures. The server is read from one place: ``OUTBOX_TEST_DATABASE_URL``, whose scheme
picks the family (``mysql://``: MySQL and MariaDB; ``postgresql://`` or ``postgres://``:
PostgreSQL); what the tests ask of each family is in ``_helpers.FAMILY``.

Every test gets a database of its own, created and migrated for it and dropped after it.
Without a reachable server the run stops with an error: a skipped suite proves nothing.
The helpers the tests import live in ``_helpers.py``, never here.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import uuid
from typing import Any, Callable, Iterator

import pytest
import redis

from outbox_lite import Backoff, OutboxRepository
from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.relay import Relay

from _brokers import Exchange, NATSServer, RabbitMQNode, Stream, new_exchange, new_stream
from _helpers import FAMILY, TEST_URL, FakeClock, rows_of
from _proxy import Proxy
from _redis import SHARED_REDIS, RedisServer, delete_queue

_counter = itertools.count()


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        TEST_URL.server_connection().close()
    except Exception as exc:  # noqa: BLE001 - any driver's error: the run cannot start
        pytest.exit(f"the test server {TEST_URL} is unreachable: {exc}", returncode=3)


def pytest_report_header(config: pytest.Config) -> str:
    return f"database: {FAMILY.name} family, {TEST_URL}"


@pytest.fixture(scope="session")
def server() -> Any:
    """The test server, as ``SELECT VERSION()`` describes it: a test that must know whether it
    talks to MariaDB, MySQL or PostgreSQL asks this (outbox_lite._families.mysql_server says
    what differs between MariaDB and MySQL; ``FAMILY.name`` the family)."""
    conn = TEST_URL.server_connection()  # a DB-API connection of the family's driver
    try:
        cur = conn.cursor()
        try:
            return FAMILY.server(lambda sql: (cur.execute(sql), cur.fetchall())[1])
        finally:
            cur.close()
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# A migrated database per test, from a pool of this process's own
# ---------------------------------------------------------------------------
#
# Creating, migrating and dropping a database costs about 0.2 s on MySQL (every DDL statement
# is a durable commit), most of the suite's time. So a test's database comes back to the pool
# when the test left its schema exactly as the migrations made it: its tables are emptied
# (TRUNCATE, which also resets AUTO_INCREMENT; on PostgreSQL TRUNCATE … RESTART IDENTITY) and
# the next test gets it as fresh. Anything else (a table added or dropped, a migration rolled
# back, an index changed, a cleanup that cannot take its locks) drops the database instead.
# What is left in the pool is dropped at the end.

_POOL: list[DatabaseUrl] = []
_MIGRATED: dict[str, str] = {}  # table -> its schema as a fresh migration makes it
_HISTORY: list[str] = []  # the migrations applied to a fresh database


def _new_database() -> DatabaseUrl:
    url = TEST_URL.with_name(f"{TEST_URL.name}_{os.getpid()}_{next(_counter)}")
    url.drop_database()
    url.create_database()
    database = url.database()
    applied = schema.migrate(database)
    database.close()
    if not _MIGRATED:
        _HISTORY.extend(applied)
        _MIGRATED.update(_schema_of(url))
    return url


def _schema_of(url: DatabaseUrl) -> dict[str, str]:
    """Each table's schema as the server's catalog shows it (FAMILY.schema_of)."""
    database = url.database()
    try:
        FAMILY.limit_lock_waits(database, 10, metadata=True)
        return dict(FAMILY.schema_of(database))
    finally:
        database.close()


def _reusable(url: DatabaseUrl) -> bool:
    """Empty ``url``'s tables for the next test, if its schema is as migrated (and ``job``)."""
    try:
        shown = _schema_of(url)
        shown.pop("job", None)
        if shown != _MIGRATED:
            return False
        database = url.database()
        try:
            FAMILY.limit_lock_waits(database, 10, metadata=True)
            history = database.execute_sql(
                f"SELECT name FROM {FAMILY.quote(schema.HISTORY_TABLE)} ORDER BY id").fetchall()
            if [name for (name,) in history] != _HISTORY:
                return False
            FAMILY.truncate(database, [table for table in _MIGRATED
                                       if table != schema.HISTORY_TABLE])
            database.execute_sql("DROP TABLE IF EXISTS job")
        finally:
            database.close()
    except Exception:  # noqa: BLE001 - whatever went wrong, the database is not reused
        return False
    return True


@pytest.fixture
def db_url() -> Any:
    """A database of this test's own, migrated, with no rows (and no ``job`` table)."""
    url = _POOL.pop() if _POOL else _new_database()
    yield url
    if _reusable(url):
        _POOL.append(url)
    else:
        url.drop_database()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    while _POOL:
        _POOL.pop().drop_database()


@pytest.fixture
def db(db_url: DatabaseUrl) -> Any:
    database = db_url.database()
    database.execute_sql(FAMILY.JOB_TABLE)
    yield database
    if not database.is_closed():
        database.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def repo(db: Any, clock: FakeClock) -> OutboxRepository:
    return OutboxRepository(db, clock=clock, backoff=Backoff(base=10, cap=600, jitter=0))


@pytest.fixture(params=[True, False], ids=["traced", "untraced"])
def relay_of(request: pytest.FixtureRequest) -> Callable[..., Relay]:
    """``relay_of(repo, publisher, **options)``: a relay (worker ``relay-1``, no progress
    lines unless given), once with tracing and once without. The test extra installs
    OpenTelemetry, so a relay left to its default takes the traced path; a plain install's
    relay (``tracer`` None) publishes without it, and must record the same outcomes."""
    def make(repo: OutboxRepository, publisher: Any, **options: Any) -> Relay:
        options.setdefault("worker_id", "relay-1")
        options.setdefault("progress_every", 0)
        relay = Relay(repo, publisher, tracing=request.param, **options)
        assert (relay.tracer is not None) is request.param
        return relay
    return make


@pytest.fixture
def fetch(db_url: DatabaseUrl) -> Iterator[Callable[..., list[dict[str, Any]]]]:
    """Read committed state on a connection of its own: ``fetch(sql, *params)``, rows as
    dicts (autocommit: each call sees what is committed when it runs), JSON as the server's
    text on every driver."""
    database = db_url.database()
    prepared: set[int] = set()

    def run(sql: str, *params: Any) -> list[dict[str, Any]]:
        conn = database.connection()  # per thread: each one's first use prepares it
        if id(conn) not in prepared:
            FAMILY.json_as_text(conn)
            prepared.add(id(conn))
        return rows_of(database.execute_sql(sql, params))

    yield run
    database.close()


# ---------------------------------------------------------------------------
# Redis (see _redis.py): the shared server, and servers of a test's own
# ---------------------------------------------------------------------------

@pytest.fixture
def rds() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(SHARED_REDIS, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def queue(rds: redis.Redis) -> Iterator[str]:
    """A queue name of this test's own on the shared Redis; its keys are deleted afterwards."""
    name = f"outbox-test-{uuid.uuid4().hex}"
    yield name
    delete_queue(rds, name)


@pytest.fixture
def redis_server() -> Iterator[Callable[..., RedisServer]]:
    servers: list[RedisServer] = []

    def start(*options: str) -> RedisServer:
        server = RedisServer(*options)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


# ---------------------------------------------------------------------------
# RabbitMQ and NATS (see _brokers.py): targets of a test's own on the shared servers, and
# servers of a test's own, always stopped afterwards
# ---------------------------------------------------------------------------

@pytest.fixture
def exchange() -> Iterator[Exchange]:
    """A topic exchange of this test's own on the shared RabbitMQ, one durable queue bound
    to it for every routing key; both deleted afterwards."""
    target = new_exchange()
    try:
        yield target
    finally:
        target.delete()


@pytest.fixture
def stream() -> Iterator[Stream]:
    """A JetStream stream of this test's own on the shared NATS, capturing its ``prefix.>``;
    deleted afterwards."""
    target = new_stream()
    try:
        yield target
    finally:
        target.delete()


@pytest.fixture
def rabbitmq_node(tmp_path: Any) -> Iterator[Callable[[], RabbitMQNode]]:
    nodes: list[RabbitMQNode] = []

    def start() -> RabbitMQNode:
        folder = tmp_path / f"rabbitmq-{len(nodes)}"
        folder.mkdir()
        node = RabbitMQNode(folder)
        nodes.append(node)
        node.start()
        return node

    try:
        yield start
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture
def nats_server(tmp_path: Any) -> Iterator[Callable[..., NATSServer]]:
    servers: list[NATSServer] = []

    def start(*options: str) -> NATSServer:
        folder = tmp_path / f"nats-{len(servers)}"
        folder.mkdir()
        server = NATSServer(folder, *options)
        servers.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def processes() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``start(command, env, cwd=None)`` starts a process (its output piped, as text);
    whatever a test leaves running is killed afterwards, by its pid."""
    started: list[subprocess.Popen[str]] = []

    def start(command: list[str], env: dict[str, str],
              cwd: Any = None) -> subprocess.Popen[str]:
        started.append(subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True))
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.fixture
def proxy(db_url):
    """A :class:`_proxy.Proxy` to the test server: a connection through it (``port=proxy.port``
    and ``FAMILY.PLAIN_TEXT``) can lose a statement's answer or have its COMMIT refused."""
    forwarder = Proxy(db_url.host, db_url.port, FAMILY.name)
    yield forwarder
    forwarder.close()


@pytest.fixture
def proxied(db_url, proxy):
    """A database of the test server reached through ``proxy``."""
    database = db_url.database(host="127.0.0.1", port=proxy.port, **FAMILY.PLAIN_TEXT)
    yield database
    database.close()
