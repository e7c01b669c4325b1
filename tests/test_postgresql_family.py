"""PostgreSQL phenomena the MySQL family has no counterpart of (SPEC §9), against a real
PostgreSQL server: ``OUTBOX_TEST_POSTGRESQL_URL`` (default: the PostgreSQL 15 of this machine).

What each test asserts is PostgreSQL's answer; the same behaviour on MySQL and MariaDB is the
rest of the suite's. Each test gets a database of its own, migrated, dropped after it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import os
import threading
import time

import pytest

from outbox_lite import (ConnectionLostError, DuplicateEventError, Inbox, LockConflictError,
                         OutboxRepository)
from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl, DatabaseUrlError
from outbox_lite.cli import main as cli_main

PG_URL = DatabaseUrl.parse(os.environ.get(
    "OUTBOX_TEST_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/outbox_lite_test"))
_names = itertools.count()


@pytest.fixture(params=["psycopg2", "psycopg"])
def pg(request):
    """(url, database) of a fresh migrated database, through psycopg2 or psycopg 3 (the URL's
    ``driver=``)."""
    url = _with_driver(PG_URL.with_name(f"{PG_URL.name}_pg_{os.getpid()}_{next(_names)}"),
                       request.param)
    url.drop_database()
    url.create_database()
    database = url.database()
    schema.migrate(database)
    assert type(database.connection()).__module__.split(".")[0] == request.param
    yield url, database
    database.close()
    url.drop_database()


def _with_driver(url, driver: str):
    return dataclasses.replace(url, options=tuple(sorted(
        {**dict(url.options), "driver": driver}.items())))


def test_the_url_names_the_driver_and_without_it_psycopg_3_is_chosen():
    """``driver=`` picks the driver of the database, of the server connections and of the
    relay's LISTEN; without it psycopg 3 (the [postgresql] extra's) is chosen when installed.
    Both are installed here (the [test] extra)."""
    bare = dataclasses.replace(PG_URL, options=(), name="postgres")  # the maintenance db
    for url, expected in ((bare, "psycopg"), (_with_driver(bare, "psycopg"), "psycopg"),
                          (_with_driver(bare, "psycopg2"), "psycopg2")):
        assert DatabaseUrl.parse(url.secret_text()) == url
        database = url.database()
        try:
            assert type(database.connection()).__module__.split(".")[0] == expected
        finally:
            database.close()
        conn = url.server_connection()
        try:
            assert type(conn).__module__.split(".")[0] == expected
        finally:
            conn.close()
    with pytest.raises(DatabaseUrlError, match="driver must be one of psycopg, psycopg2"):
        DatabaseUrl.parse(f"{bare.secret_text()}?driver=pg8000")


def test_a_services_own_postgresqldatabase_takes_psycopg2_when_both_are_installed():
    """What the README and docs/servers/postgresql.md tell a newcomer (issue 37): with both
    drivers installed, the commands' URL takes psycopg 3, but Peewee's own
    ``PostgresqlDatabase``, as a service makes it, takes psycopg2 (Peewee 4 prefers it;
    Peewee 3's knows no other), unless ``prefer_psycopg3=True`` (Peewee 4)."""
    import peewee

    bare = dataclasses.replace(PG_URL, options=(), name="postgres")
    made = {"service": peewee.PostgresqlDatabase("postgres", host=bare.host, port=bare.port,
                                                 user=bare.user, password=bare.password or None),
            "command": bare.database()}
    if int(peewee.__version__.split(".")[0]) >= 4:
        made["service, prefer_psycopg3=True"] = peewee.PostgresqlDatabase(
            "postgres", host=bare.host, port=bare.port, user=bare.user,
            password=bare.password or None, prefer_psycopg3=True)
    drivers = {}
    for name, database in made.items():
        try:
            drivers[name] = type(database.connection()).__module__.split(".")[0]
        finally:
            database.close()
    assert drivers == {"service": "psycopg2", "command": "psycopg",
                       **({"service, prefer_psycopg3=True": "psycopg"}
                          if len(made) == 3 else {})}


def _event(repo, key=None, n=0, **extra):
    return repo.create_in_transaction(event_type="t", aggregate_type="a", aggregate_id=str(n),
                                      payload={"n": n}, dedupe_key=key, **extra)


def _rows(database, sql, *params):
    return database.execute_sql(sql, params).fetchall()


def _until(condition, what, timeout=30.0, gone=lambda: False):
    """Poll ``condition`` until it holds; fail after ``timeout`` s, or once ``gone()`` says
    what it waits on is gone (a thread that ended)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert not gone(), f"{what}: what it waited on is gone"
        assert time.monotonic() < deadline, f"waited in vain for {what}"
        time.sleep(0.01)


# ---------------------------------------------------------------------------
# The duplicate: never an error on the server
# ---------------------------------------------------------------------------

def test_a_duplicate_leaves_the_callers_transaction_usable(pg):
    url, db = pg
    repo = OutboxRepository(db)
    db.execute_sql("CREATE TABLE job (name TEXT)")
    with db.atomic():
        _event(repo, "k1")
    with db.atomic():
        db.execute_sql("INSERT INTO job VALUES ('before')")
        with pytest.raises(DuplicateEventError):
            _event(repo, "k1", 1)
        db.execute_sql("INSERT INTO job VALUES ('after')")  # 25P02 if the INSERT had failed
        _event(repo, "k2", 2)
    assert _rows(db, "SELECT name FROM job ORDER BY name") == [("after",), ("before",)]
    assert _rows(db, "SELECT dedupe_key FROM outbox_event ORDER BY id") == [("k1",), ("k2",)]


@pytest.mark.parametrize("first_commits", [True, False])
def test_racing_uncommitted_duplicates_at_read_committed(pg, first_commits):
    """The second writer waits for the first: DuplicateEventError once it commits (its own
    transaction still usable), its event written once the first rolls back."""
    url, _db = pg
    for _ in range(3):
        first, second = url.database(), url.database()
        key = f"race-{first_commits}-{next(_names)}"
        inserted, outcome = threading.Event(), {}

        def late():
            try:
                with second.atomic():
                    try:
                        _event(OutboxRepository(second), key, 2)
                        outcome["second"] = "written"
                    except DuplicateEventError:
                        outcome["second"] = "duplicate"
                    _event(OutboxRepository(second), None, 3)  # the transaction goes on
            except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
                outcome["error"] = exc

        class Undo(Exception):
            pass

        try:
            with first.atomic():
                _event(OutboxRepository(first), key, 1)
                [(holder,)] = _rows(first, "SELECT pg_backend_pid()")
                thread = threading.Thread(target=late)
                thread.start()
                # the second INSERT waits on the first's row: a session blocked by the first
                _until(lambda: _rows(_db, "SELECT count(*) FROM pg_stat_activity"
                                          " WHERE %s = ANY(pg_blocking_pids(pid))",
                                     holder) == [(1,)],
                       "the second INSERT to wait on the first",
                       gone=lambda: not thread.is_alive())
                if not first_commits:
                    raise Undo
        except Undo:
            pass
        thread.join(10)
        first.close()
        second.close()
        assert "error" not in outcome, outcome
        assert outcome["second"] == ("duplicate" if first_commits else "written")
        n = _rows(_db, "SELECT aggregate_id FROM outbox_event WHERE dedupe_key = %s", key)
        assert n == [("1",)] if first_commits else [("2",)]


def test_a_racing_duplicate_at_repeatable_read_is_a_lock_conflict(pg):
    """Committed after the caller's snapshot, the duplicate is a serialization failure
    (40001): LockConflictError, and the retry sees it (DuplicateEventError)."""
    url, db = pg
    repo = OutboxRepository(db)
    other = url.database()
    with pytest.raises(LockConflictError) as conflict:
        with db.atomic(isolation_level="REPEATABLE READ"):
            db.execute_sql("SELECT 1 FROM outbox_event").fetchall()  # the snapshot
            with other.atomic():
                _event(OutboxRepository(other), "k")
            _event(repo, "k", 2)
    assert conflict.value.errno == "40001" and conflict.value.retryable
    with db.atomic(isolation_level="REPEATABLE READ"), pytest.raises(DuplicateEventError):
        _event(repo, "k", 3)
    other.close()


# ---------------------------------------------------------------------------
# What is stored reads back as given
# ---------------------------------------------------------------------------

def test_the_payload_reads_back_exactly_and_the_column_keeps_its_text(pg):
    url, db = pg
    repo = OutboxRepository(db)
    payload = {"z": 1, "a": [1.5, -0.0, 10 ** 18, "nul\u0000", "é😀"], "m": {"b": None}}
    with db.atomic():
        event = repo.create_in_transaction(event_type="t", aggregate_type="a",
                                           aggregate_id="1", payload=payload)
    with db.atomic():
        [claimed] = repo.claim_batch("w", 10)
    assert claimed.payload == payload and claimed.id == event.id
    assert json.dumps(claimed.payload) == json.dumps(payload)  # key order too
    [(text,)] = _rows(db, "SELECT payload::text FROM outbox_event")
    assert json.loads(text) == payload and text.index('"z"') < text.index('"a"')


def test_instants_are_utc_with_microseconds_whatever_the_session_time_zone(pg):
    url, db = pg
    db.execute_sql("SET TIME ZONE 'Asia/Kolkata'")
    repo = OutboxRepository(db)
    at = dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    with db.atomic():
        event = _event(repo, "k", available_at=at)
    [(server_utc, created)] = _rows(
        db, "SELECT clock_timestamp() AT TIME ZONE 'UTC', created_at FROM outbox_event")
    assert abs(server_utc - created) < dt.timedelta(seconds=5)  # UTC, not +05:30
    assert created == event.created_at.replace(tzinfo=None)
    [(available,)] = _rows(db, "SELECT available_at FROM outbox_event")
    assert available == at.replace(tzinfo=None)  # microseconds kept
    assert repo.clock().tzinfo == dt.timezone.utc
    assert abs(repo.clock() - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(seconds=30)


# ---------------------------------------------------------------------------
# NOTIFY at commit, LISTEN in the relay
# ---------------------------------------------------------------------------

def test_an_event_notifies_outbox_event_at_commit_only_once_per_transaction(pg):
    url, db = pg
    listener = url.database()
    listener.execute_sql("LISTEN outbox_event")
    repo = OutboxRepository(db)

    def heard() -> int:
        conn = listener.connection()
        listener.execute_sql("SELECT 1")  # a round trip collects what arrived
        if hasattr(conn, "notifies") and callable(conn.notifies):
            return sum(1 for _ in conn.notifies(timeout=0.2, stop_after=10))
        found = len(conn.notifies)
        conn.notifies.clear()
        return found

    with db.atomic():
        _event(repo, "a", 1)
        _event(repo, "b", 2)
        assert heard() == 0  # not before the commit
    assert heard() == 1  # once for the transaction
    with db.atomic() as txn:
        _event(repo, "c", 3)
        txn.rollback()
    assert heard() == 0  # never for a rollback
    with db.atomic():
        with pytest.raises(DuplicateEventError):
            _event(repo, "a", 4)
    assert heard() == 0  # a refused duplicate notifies nothing
    listener.close()


def test_the_relay_listens_on_postgresql_without_a_wake_url(pg):
    from outbox_lite.relay import Relay

    url, db = pg
    assert Relay(OutboxRepository(db), _Collect()).native_wake is not None
    published: dict[int, float] = {}
    # Its first empty claim is followed by a pause of 30 s: what is published before that
    # was woken.
    relay = Relay(OutboxRepository(db), _Collect(published), idle_pause=30.0,
                  max_idle_pause=30.0)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,))
    thread.start()
    try:
        # its LISTEN is up (a session of this database ran it and waits, idle) and its first
        # claim found nothing: the next poll is 30 s away
        _until(lambda: _rows(db, "SELECT count(*) FROM pg_stat_activity"
                                 " WHERE datname = current_database() AND state = 'idle'"
                                 " AND query = 'LISTEN outbox_event'") == [(1,)],
               "the relay's LISTEN", gone=lambda: not thread.is_alive())
        _until(lambda: relay.stats.rounds >= 1, "the relay's first claim",
               gone=lambda: not thread.is_alive())
        writer = url.database()
        repo = OutboxRepository(writer)
        import outbox_lite.wake as wake
        wake.stop_listening_locally(wake.database_key(db), relay._bell)  # LISTEN only
        with writer.atomic():
            event = _event(repo, "k")
        _until(lambda: event.id in published, "the event's publish, well before the poll",
               timeout=10.0, gone=lambda: not thread.is_alive())
        writer.close()
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert relay._bell.rings >= 1 and relay.stats.published == 1  # the LISTEN rang it


class _Collect:
    def __init__(self, into=None):
        self.into = {} if into is None else into

    def publish(self, events):
        for event in events:
            self.into[event.id] = time.monotonic()
        return {}

    def close(self):
        pass


# ---------------------------------------------------------------------------
# Lock conflicts and lost connections
# ---------------------------------------------------------------------------

def test_lock_not_available_is_a_lock_conflict_and_the_next_try_works(pg):
    url, db = pg
    repo = OutboxRepository(db)
    with db.atomic():
        event = _event(repo, "k")
    assert repo.mark_processing(event.id, "w")
    holder = url.database()
    with holder.atomic():
        holder.execute_sql("SELECT 1 FROM outbox_event WHERE id = %s FOR UPDATE", (event.id,))
        db.execute_sql("SET lock_timeout = '200ms'")
        with pytest.raises(LockConflictError) as conflict:
            repo.mark_published(event.id, "w")
    assert conflict.value.errno == "55P03"
    assert repo.mark_published(event.id, "w")
    holder.close()


def test_a_deadlock_is_a_lock_conflict(pg):
    url, db = pg
    repo = OutboxRepository(db)
    with db.atomic():
        a, b = _event(repo, "a", 1), _event(repo, "b", 2)
    for event in (a, b):
        assert repo.mark_processing(event.id, "w")
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker(first, second):
        database = url.database()
        try:
            with database.atomic():
                worker_repo = OutboxRepository(database)
                worker_repo.extend_locks([first.id], "w")
                barrier.wait(5)
                worker_repo.extend_locks([second.id], "w")
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            errors.append(exc)
        finally:
            database.close()

    threads = [threading.Thread(target=worker, args=pair) for pair in ((a, b), (b, a))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(errors) == 1 and isinstance(errors[0], LockConflictError), errors
    assert errors[0].errno == "40P01"


def test_a_killed_connection_is_lost_and_the_next_call_reconnects(pg):
    url, db = pg
    repo = OutboxRepository(db)
    with db.atomic():
        _event(repo, "k")
    killer = url.database()
    pid = _rows(db, "SELECT pg_backend_pid()")[0][0]
    killer.execute_sql("SELECT pg_terminate_backend(%s)", (pid,))
    killer.close()
    with pytest.raises(ConnectionLostError, match="next call opens a new one"):
        repo.stats()
    assert repo.stats().counts["pending"] == 1


# ---------------------------------------------------------------------------
# Claims, URLs, the command line
# ---------------------------------------------------------------------------

def test_concurrent_claims_are_disjoint(pg):
    url, db = pg
    repo = OutboxRepository(db)
    with db.atomic():
        for n in range(200):
            _event(repo, f"k{n}", n)
    barrier = threading.Barrier(4)
    claims: list[list[int]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def worker(i):
        database = url.database()
        worker_repo = OutboxRepository(database)
        try:
            barrier.wait(5)
            while True:
                with database.atomic():
                    batch = worker_repo.claim_batch(f"w{i}", 7)
                if not batch:
                    return
                claims[i] += [e.id for e in batch]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            database.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    every = [i for c in claims for i in c]
    assert sorted(every) == sorted(set(every)) and len(every) == 200
    assert _rows(db, "SELECT status, COUNT(*) FROM outbox_event GROUP BY status") == [
        ("processing", 200)]


def test_the_inbox_answers_a_redelivery_without_an_error(pg):
    url, db = pg
    inbox = Inbox(db, "c")
    with db.atomic():
        assert inbox.accept("m1") is True
        assert inbox.accept("m1") is False
        db.execute_sql("SELECT 1")  # the transaction goes on
    assert _rows(db, "SELECT consumer, message_id FROM inbox_message") == [("c", "m1")]


def test_postgresql_urls_mask_the_password_and_refuse_bad_options():
    for scheme in ("postgresql", "postgres", "POSTGRES"):
        url = DatabaseUrl.parse(f"{scheme}://app:s3cr@t@db.example/app?sslmode=require")
        assert (url.host, url.port, url.user, url.password, url.name) == (
            "db.example", 5432, "app", "s3cr@t", "app")
        assert str(url) == "postgresql://app:***@db.example:5432/app?sslmode=require"
        assert DatabaseUrl.parse(url.secret_text()) == url
    with pytest.raises(DatabaseUrlError, match="sslmode must be one of") as bad:
        DatabaseUrl.parse("postgresql://app:hunter2@db/app?sslmode=maybe")
    assert "hunter2" not in str(bad.value)
    with pytest.raises(DatabaseUrlError, match="unknown URL parameter ssl_ca"):
        DatabaseUrl.parse("postgresql://db/app?ssl_ca=/x")


def test_migrate_creates_a_missing_database_and_rolls_back(capsys):
    url = PG_URL.with_name(f"{PG_URL.name}_pg_cli_{os.getpid()}")
    url.drop_database()
    try:
        assert cli_main(["migrate", "--database-url", url.secret_text()]) == 0
        assert f"created database {url.name} ({url.location})" in capsys.readouterr().out
        assert url.exists()
        assert cli_main(["migrate", "--database-url", url.secret_text()]) == 0
        assert "is up to date" in capsys.readouterr().out
        for _ in schema.migrations_dir().glob("[0-9][0-9][0-9]_*.py"):  # every one
            assert cli_main(["migrate", "--rollback", "--database-url", url.secret_text()]) == 0
        database = url.database()
        assert schema.applied(database) == []
        assert _rows(database, "SELECT to_regclass('outbox_event')") == [(None,)]
        database.close()
        assert cli_main(["migrate", "--database-url", url.secret_text()]) == 0
    finally:
        url.drop_database()


def test_a_wrong_password_or_missing_database_is_one_line_without_the_password(capsys):
    missing = PG_URL.with_name("outbox_lite_no_such_database")
    assert cli_main(["stats", "--database-url",
                     missing.secret_text().replace("postgresql://postgres",
                                                   "postgresql://postgres:pa55w0rd")]) == 1
    err = capsys.readouterr().err
    assert err == (f"outbox-lite stats: error: database {missing.name} does not exist (run:"
                   " outbox-lite migrate --database-url"
                   f" 'postgresql://postgres:***@{missing.host}:{missing.port}/{missing.name}')\n")
    refused = "postgresql://postgres:pa55w0rd@127.0.0.1:1/x"
    assert cli_main(["stats", "--database-url", refused]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the PostgreSQL server at 127.0.0.1:1" in err and "pa55w0rd" not in err


# ---------------------------------------------------------------------------
# Isolation levels, text
# ---------------------------------------------------------------------------

def test_claims_on_serializable_sessions_run_at_read_committed(pg):
    """A session whose default is SERIALIZABLE: claim_batch in it is refused before any claim
    (naming READ COMMITTED); the relay's own claims run at READ COMMITTED, and three relays
    racing over 300 events publish each once with no lock conflict."""
    from outbox_lite import IsolationLevelError
    from outbox_lite.relay import Relay

    url, db = pg
    serializable = {"options": "-c default_transaction_isolation=serializable"}
    writer = url.database(**serializable)
    repo = OutboxRepository(writer)
    with writer.atomic():
        for n in range(300):
            _event(repo, f"k{n}", n % 7)
    with pytest.raises(IsolationLevelError, match='isolation_level="READ COMMITTED"'):
        with writer.atomic():
            repo.claim_batch("w", 5)
    assert _rows(db, "SELECT COUNT(*) FROM outbox_event WHERE status = 'pending'") == [(300,)]
    published: list[dict[int, float]] = [{}, {}, {}]
    databases = [url.database(**serializable) for _ in range(3)]
    relays = [Relay(OutboxRepository(d), _Collect(p), batch_size=10)
              for d, p in zip(databases, published)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def run(relay):
        try:
            barrier.wait(10)
            relay.run(until_empty=True)
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(relay,)) for relay in relays]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and not any(thread.is_alive() for thread in threads)
    ids = [event_id for p in published for event_id in p]
    assert len(ids) == len(set(ids)) == 300
    assert sum(relay.stats.lock_conflicts for relay in relays) == 0
    assert _rows(db, "SELECT status, COUNT(*) FROM outbox_event GROUP BY status") == [
        ("published", 300)]
    for database in (writer, *databases):
        database.close()


def test_a_nul_in_an_error_message_is_stored_as_a_replacement_character(pg):
    url, db = pg
    repo = OutboxRepository(db)
    with db.atomic():
        event = _event(repo, "k")
    assert repo.mark_processing(event.id, "w")
    assert repo.mark_failed(event.id, "w", "broker", "bad\x00byte", retryable=False)
    assert _rows(db, "SELECT last_error_message FROM outbox_event") == [("bad\ufffdbyte",)]


def test_an_inbox_key_the_index_cannot_hold_is_refused_before_any_sql(pg):
    """PostgreSQL's btree holds at most 2,704 bytes an entry: 64 + 704 four-byte characters
    that do not compress are refused by the server (54000, which would abort the caller's
    transaction); the inbox refuses them first and the transaction goes on."""
    from outbox_lite import InvalidEventError

    url, db = pg
    inbox = Inbox(db, "c" * 64)
    wide = "".join(chr(0x20000 + (n * 7919) % 42000) for n in range(704))
    with db.atomic():
        with pytest.raises(InvalidEventError, match="at most 2688"):
            inbox.accept(wide)
        assert inbox.accept("a" * 704) is True  # ASCII of the longest length fits
        assert inbox.accept(wide[:655]) is True  # 64 + 2,620 bytes
    assert len(_rows(db, "SELECT message_id FROM inbox_message")) == 2
