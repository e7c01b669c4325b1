"""Test fixtures. The server is read from one place: ``OUTBOX_TEST_DATABASE_URL``.

Every test gets a database of its own, created and migrated for it and dropped after it.
Without a reachable server the run stops with an error: a skipped suite proves nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import os
import re
import threading
import uuid
from typing import Any, Callable, Iterator

import pymysql
import pytest
import redis
from playhouse.pool import PooledMySQLDatabase

from outbox_lite import Backoff, OutboxRepository
from outbox_lite import migrate as schema
from outbox_lite._compat import MySQLDatabase as QuietMySQLDatabase
from outbox_lite._db import DatabaseUrl
from outbox_lite._server import Server, server_of

from _brokers import Exchange, NATSServer, RabbitMQNode, Stream, new_exchange, new_stream
from _redis import SHARED_REDIS, RedisServer, delete_queue

TEST_URL = DatabaseUrl.parse(
    os.environ.get("OUTBOX_TEST_DATABASE_URL", "mysql://root@127.0.0.1:3306/outbox_lite_test"))
_counter = itertools.count()
T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        TEST_URL.server_connection().close()
    except pymysql.MySQLError as exc:
        pytest.exit(f"the test server {TEST_URL} is unreachable: {exc}", returncode=3)


@pytest.fixture(scope="session")
def server() -> Server:
    """The test server, as ``SELECT VERSION()`` describes it: a test that must know whether it
    talks to MariaDB or MySQL asks this (and outbox_lite._server says what differs)."""
    conn = TEST_URL.server_connection()
    try:
        with conn.cursor() as cur:
            return server_of(lambda sql: (cur.execute(sql), cur.fetchall())[1])
    finally:
        conn.close()


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: dt.datetime = T0) -> None:
        self.now = now
        self._lock = threading.Lock()

    def __call__(self) -> dt.datetime:
        with self._lock:
            return self.now

    def advance(self, **delta: float) -> dt.datetime:
        with self._lock:
            self.now += dt.timedelta(**delta)
            return self.now


# ---------------------------------------------------------------------------
# A migrated database per test, from a pool of this process's own
# ---------------------------------------------------------------------------
#
# Creating, migrating and dropping a database costs about 0.2 s on MySQL (every DDL statement
# is a durable commit), most of the suite's time. So a test's database comes back to the pool
# when the test left its schema exactly as the migrations made it: its tables are emptied
# (TRUNCATE, which also resets AUTO_INCREMENT) and the next test gets it as fresh. Anything else
# (a table added or dropped, a migration rolled back, an index changed, a cleanup that cannot
# take its locks) drops the database instead. What is left in the pool is dropped at the end.

_POOL: list[DatabaseUrl] = []
_MIGRATED: dict[str, str] = {}  # table -> SHOW CREATE TABLE of a fresh migration
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
    """Each table's SHOW CREATE TABLE, without its AUTO_INCREMENT counter."""
    conn = url.server_connection()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION lock_wait_timeout = 10")
            cur.execute("SELECT table_name FROM information_schema.tables"
                        " WHERE table_schema = %s", (url.name,))
            tables = sorted(str(name) for (name,) in cur.fetchall())
            shown = {}
            for table in tables:
                cur.execute(f"SHOW CREATE TABLE `{url.name}`.`{table}`")
                shown[table] = re.sub(r" AUTO_INCREMENT=\d+", "", cur.fetchone()[1])
            return shown
    finally:
        conn.close()


def _reusable(url: DatabaseUrl) -> bool:
    """Empty ``url``'s tables for the next test, if its schema is as migrated (and ``job``)."""
    try:
        shown = _schema_of(url)
        shown.pop("job", None)
        if shown != _MIGRATED:
            return False
        conn = url.server_connection()
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION lock_wait_timeout = 10")
                cur.execute(f"SELECT name FROM `{url.name}`.`{schema.HISTORY_TABLE}`"
                            " ORDER BY id")
                if [name for (name,) in cur.fetchall()] != _HISTORY:
                    return False
                for table in _MIGRATED:
                    if table != schema.HISTORY_TABLE:
                        cur.execute(f"TRUNCATE TABLE `{url.name}`.`{table}`")
                cur.execute(f"DROP TABLE IF EXISTS `{url.name}`.job")
        finally:
            conn.close()
    except pymysql.MySQLError:
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
    database.execute_sql(
        "CREATE TABLE job (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(64) NOT NULL)")
    yield database
    if not database.is_closed():
        database.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def repo(db: Any, clock: FakeClock) -> OutboxRepository:
    return OutboxRepository(db, clock=clock, backoff=Backoff(base=10, cap=600, jitter=0))


@pytest.fixture
def fetch(db_url: DatabaseUrl) -> Callable[..., list[dict[str, Any]]]:
    """Read committed state on a connection of its own: ``fetch(sql, *params)``."""
    conn = pymysql.connect(database=db_url.name, autocommit=True,
                           cursorclass=pymysql.cursors.DictCursor, **_params(db_url))

    def run(sql: str, *params: Any) -> list[dict[str, Any]]:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    yield run
    conn.close()


def _params(url: DatabaseUrl) -> dict[str, Any]:
    return {"host": url.host, "port": url.port, "user": url.user, "password": url.password}


class _SpyCursor:
    """A driver cursor that reports each statement before running it."""

    def __init__(self, cursor: Any, report: Callable[[str, Any], None]) -> None:
        self._cursor = cursor
        self._report = report

    def execute(self, sql: str, params: Any = None) -> Any:
        self._report(sql, params)
        return self._cursor.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)


@contextlib.contextmanager
def capture_sql(database: Any, before: Callable[[str, Any], None] | None = None,
                ) -> Iterator[list[tuple[str, Any]]]:
    """Yield a list that receives ``(sql, params)`` for every statement run on ``database``.

    Works on Peewee 3 and 4 alike: it wraps the driver cursors ``database.cursor()`` hands
    out, the one path every statement takes (queries, ``execute_sql``, ``BEGIN``, from any
    thread). ``before(sql, params)``, if given, runs just before each statement; what it runs
    itself on ``database`` is neither recorded nor passed to it again.
    """
    statements: list[tuple[str, Any]] = []
    inside = threading.local()

    def report(sql: str, params: Any) -> None:
        if getattr(inside, "active", False):
            return
        statements.append((sql, params))
        if before is not None:
            inside.active = True
            try:
                before(sql, params)
            finally:
                inside.active = False

    shadowed = "cursor" in vars(database)  # an outer spy's, when spies nest
    cursor = database.cursor
    database.cursor = lambda *args, **kwargs: _SpyCursor(cursor(*args, **kwargs), report)
    try:
        yield statements
    finally:
        if shadowed:
            database.cursor = cursor
        else:
            del database.cursor  # back to the class's own method


def new_event(repo: OutboxRepository, n: int = 0, **overrides: Any) -> Any:
    """Create one event in a transaction of its own."""
    fields = dict(event_type="job.created", aggregate_type="ai_job", aggregate_id=str(n),
                  payload={"n": n})
    fields.update(overrides)
    with repo.database.atomic():
        return repo.create_in_transaction(**fields)


def seed(repo: OutboxRepository, count: int, **overrides: Any) -> list[int]:
    """Create ``count`` events in one transaction (the n-th of aggregate ``ai_job:n`` unless
    ``overrides`` say otherwise); returns their ids."""
    with repo.database.atomic():
        return [repo.create_in_transaction(**{
                    "event_type": "job.created", "aggregate_type": "ai_job",
                    "aggregate_id": str(n), "payload": {"n": n}, **overrides}).id
                for n in range(count)]


class QuietPooledMySQLDatabase(PooledMySQLDatabase, QuietMySQLDatabase):
    """PooledMySQLDatabase connecting with PyMySQL's database= keyword, as the library's own
    databases do (outbox_lite/_compat.py): Peewee 3's db= would be a DeprecationWarning, which
    fails the run. How it pools and reconnects is Peewee's, unchanged."""


def claim_all(repo: OutboxRepository, worker: str, count: int) -> list[int]:
    """Seed ``count`` events and claim them all for ``worker``; returns their ids."""
    seed(repo, count)
    with repo.database.atomic():
        return [e.id for e in repo.claim_batch(worker, limit=count)]


def run_threads(count: int, target: Callable[[int], Any], database: Any = None,
                ) -> tuple[list[Any], list[BaseException]]:
    """Start ``count`` threads released together by a Barrier; return results and errors.

    Each thread has its own connection to ``database`` (Peewee's are per thread) and closes
    it at the end.
    """
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []
    lock = threading.Lock()

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - collected for the main thread
            with lock:
                errors.append(exc)
        finally:
            if database is not None and not database.is_closed():
                database.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return results, errors


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
