"""The write in one round trip (issue 23): what create_in_transaction sends, and that a refused
duplicate still holds up no other writer.

The common case is a warm connection: the first statement the library runs on a connection
also asks the server about the session (``_session``), reads ``max_allowed_packet``
(``_packet``), reads the server's clock (``_clock``: again every 10 s; the ``repo`` fixture's
clock is injected) and, once per repository, checks the table (``_schema``); after that, each
``create_in_transaction`` sends what is counted here. What each statement locks, measured on
both servers, is in ``outbox_lite/_families/mysql_sql.py`` (``INSERT_UNLESS_TAKEN``). On
PostgreSQL the write is one ``INSERT … ON CONFLICT DO NOTHING`` at every level: a unique index
there waits only for an uncommitted row of the same key, never on a gap, and a refusal is no
error (an error would abort the caller's transaction).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest

from _helpers import FAMILY, capture_sql
from outbox_lite import DuplicateEventError, LockConflictError, OutboxRepository

EVENT = dict(event_type="job.created", aggregate_type="ai_job", aggregate_id="42",
             payload={"job_id": 42})
LEVELS = ["REPEATABLE READ", "READ COMMITTED"]


def _library_statements(statements: list[tuple[str, Any]]) -> list[str]:
    """The first word of each statement the library sent: the transaction's own BEGIN,
    COMMIT and SET TRANSACTION and the test's business INSERT into job left out."""
    return [sql.split()[0] for sql, _ in statements
            if sql.split()[0] not in ("BEGIN", "COMMIT", "SET") and "INTO job" not in sql]


def _expected_write(server, level: str, keyed: bool, packed: bool = False) -> list[str]:
    """What the server needs for one event, the same on both MySQL servers: one INSERT,
    except with a dedupe_key at REPEATABLE READ, where a refused INSERT would hold up other
    writers (MariaDB's the gap before the key, MySQL's every one): a lock-free read first,
    and on a connection that allows multiple statements (``packed``) the read and the INSERT
    go in one packet (one statement sent, beginning with the read). PostgreSQL: one INSERT at
    every level (it has no such switch: ``FAMILY.multi_statements``)."""
    if keyed and level == "REPEATABLE READ" and FAMILY.GAP_LOCKS:
        return ["SELECT"] if packed else ["SELECT", "INSERT"]
    return [FAMILY.WRITE_WORD]


#: The connection the writer uses: as the driver opens it by default, or (MySQL's URL
#: option ``multi_statements=true``) allowing several statements in one packet.
CONNECTIONS = ["plain", "multi-statements"]


@pytest.fixture(params=CONNECTIONS)
def packed(request: pytest.FixtureRequest) -> bool:
    return request.param == "multi-statements"


@pytest.fixture
def writer_url(db_url, packed: bool) -> Any:
    """The test database's URL, with multiple statements allowed when ``packed``."""
    return FAMILY.multi_statements(db_url) if packed else db_url


@pytest.fixture
def wdb(db, writer_url, packed: bool) -> Any:
    """``db`` (its job table made), or a second database object on a connection allowing
    multiple statements."""
    if not packed:
        yield db
        return
    database = writer_url.database()
    yield database
    database.close()


@pytest.fixture
def wrepo(wdb, clock) -> OutboxRepository:
    return OutboxRepository(wdb, clock=clock)


def _one_packet(statements: list[tuple[str, Any]]) -> bool:
    """Whether the keyed write went as the read and the INSERT in one statement sent."""
    return any(sql.startswith("SELECT") and "; INSERT INTO outbox_event" in sql
               for sql, _ in statements)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "dedupe-key"])
def test_what_a_write_on_a_warm_connection_sends(wdb, wrepo, fetch, server, level, keyed,
                                                 packed):
    db, repo = wdb, wrepo
    with db.atomic(isolation_level=level):  # warms the connection: session, packet, schema
        repo.create_in_transaction(**EVENT, dedupe_key="warm" if keyed else None)
    with capture_sql(db) as statements, db.atomic(isolation_level=level):
        db.execute_sql("INSERT INTO job (name) VALUES (%s)", ("job-42",))
        event = repo.create_in_transaction(**EVENT, dedupe_key="job-42" if keyed else None)
    expected = _expected_write(server, level, keyed, packed)
    assert _library_statements(statements) == expected, statements
    assert _one_packet(statements) == (expected == ["SELECT"]), statements
    rows = fetch("SELECT id, dedupe_key FROM outbox_event ORDER BY id")
    assert len(rows) == 2 and rows[1]["id"] == event.id
    assert rows[1]["dedupe_key"] == ("job-42" if keyed else event.dedupe_key)
    assert fetch("SELECT name FROM job") == [{"name": "job-42"}]


def test_the_level_is_looked_up_only_by_a_family_whose_write_depends_on_it(db, repo,
                                                                          monkeypatch):
    """A keyed write asks the level of the caller's transaction on MySQL and MariaDB, where
    the level chooses the statements; PostgreSQL sends the same one at every level and does
    not ask. A write without a key asks nowhere."""
    from outbox_lite import _session

    asked = []
    level_of = _session.transaction_isolation
    monkeypatch.setattr(_session, "transaction_isolation",
                        lambda database: asked.append(database) or level_of(database))
    with db.atomic():
        repo.create_in_transaction(**EVENT, dedupe_key="keyed")
        repo.create_in_transaction(**EVENT)
    assert asked == ([db] if FAMILY.name == "mysql" else [])


@pytest.mark.parametrize("level", LEVELS)
def test_a_duplicate_raises_and_the_transaction_goes_on_at_each_level(wdb, wrepo, fetch,
                                                                      server, level, packed):
    db, repo = wdb, wrepo
    with db.atomic(isolation_level=level):
        repo.create_in_transaction(**EVENT, dedupe_key="committed")
    with capture_sql(db) as statements, db.atomic(isolation_level=level):
        db.execute_sql("INSERT INTO job (name) VALUES (%s)", ("before",))
        with pytest.raises(DuplicateEventError) as committed:
            repo.create_in_transaction(**EVENT, dedupe_key="committed")
        repo.create_in_transaction(**EVENT, dedupe_key="mine")
        with pytest.raises(DuplicateEventError) as own:  # this transaction's own key
            repo.create_in_transaction(**EVENT, dedupe_key="mine")
        db.execute_sql("INSERT INTO job (name) VALUES (%s)", ("after",))
    assert (committed.value.dedupe_key, own.value.dedupe_key) == ("committed", "mine")
    # One round trip per refusal too. At REPEATABLE READ on MySQL and MariaDB: the read finds
    # both keys (a consistent read sees the transaction's own rows) and no refused INSERT is
    # sent; in one packet, the INSERT goes with the read and is refused before it stores
    # anything (status NULL: 1048), the caller seeing DuplicateEventError all the same.
    # PostgreSQL: the INSERT alone, refused without an error.
    reads_first = level == "REPEATABLE READ" and FAMILY.GAP_LOCKS
    assert _library_statements(statements) == (
        ["SELECT"] * 3 if reads_first and packed else
        ["SELECT", "SELECT", "INSERT", "SELECT"] if reads_first else [FAMILY.WRITE_WORD] * 3
    ), statements
    assert sorted(r["dedupe_key"] for r in fetch("SELECT dedupe_key FROM outbox_event")) == [
        "committed", "mine"]
    assert [r["name"] for r in fetch("SELECT name FROM job ORDER BY id")] == ["before", "after"]


def _race_refused_duplicate(db_url, level: str, keys: list[str]) -> dict[str, Any]:
    """One transaction is refused a committed duplicate (k5, between k2 and k8) and stays
    open; meanwhile, released together by a Barrier, one writer per key in ``keys`` writes an
    event (and a job row) in a transaction of its own on its own connection, waiting at most
    1 s for a lock (FAMILY.limit_lock_waits, session level), every connection opened by
    ``db_url`` (multiple statements allowed or not). Returns each key's outcome: True when
    written, else the errno of the LockConflictError."""
    setup = db_url.database()
    setup_repo = OutboxRepository(setup)
    with setup.atomic():
        for key in ("k2", "k5", "k8"):
            setup_repo.create_in_transaction(**EVENT, dedupe_key=key)
    setup.close()
    barrier = threading.Barrier(len(keys) + 1)
    done = threading.Barrier(len(keys) + 1)
    outcomes: dict[str, Any] = {}
    errors: list[BaseException] = []

    def refuser() -> None:
        database = db_url.database()
        try:
            repo = OutboxRepository(database)
            with database.atomic(isolation_level=level):
                try:
                    repo.create_in_transaction(**EVENT, dedupe_key="k5")
                except DuplicateEventError:
                    outcomes["k5"] = "refused"
                barrier.wait(timeout=30)  # the refused transaction is open: writers go
                done.wait(timeout=60)  # and it stays open until every writer is done
                database.execute_sql("INSERT INTO job (name) VALUES (%s)", ("refuser",))
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            errors.append(exc)
            barrier.abort()
            done.abort()
        finally:
            database.close()

    def writer(key: str) -> None:
        database = db_url.database()
        try:
            FAMILY.limit_lock_waits(database, 1)
            repo = OutboxRepository(database)
            with database.atomic(isolation_level=level):  # warm: session, packet, schema
                repo.create_in_transaction(**EVENT, dedupe_key=f"warm-{key}")
            barrier.wait(timeout=30)
            try:
                with database.atomic(isolation_level=level):
                    database.execute_sql("INSERT INTO job (name) VALUES (%s)", (key,))
                    repo.create_in_transaction(**EVENT, dedupe_key=key)
                outcomes[key] = True
            except LockConflictError as exc:
                outcomes[key] = exc.errno
            done.wait(timeout=60)
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            errors.append(exc)
            barrier.abort()
            done.abort()
        finally:
            database.close()

    threads = [threading.Thread(target=refuser)] + [
        threading.Thread(target=writer, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not errors and not any(t.is_alive() for t in threads), errors
    return outcomes


@pytest.mark.parametrize("level", LEVELS)
def test_writers_do_not_wait_on_a_refused_duplicate(db, writer_url, fetch, server, level):
    """Keys before, after and far from the duplicate: no writer waits, on every server, at
    both levels. (On main, MySQL at REPEATABLE READ needed the read for this: a refused
    INSERT there made all of them wait, 1205.)"""
    keys = ["k1", "k9", "zz-last", "0123abcd"]
    outcomes = _race_refused_duplicate(writer_url, level, keys)
    assert outcomes == {"k5": "refused", **dict.fromkeys(keys, True)}
    rows = fetch("SELECT dedupe_key FROM outbox_event WHERE dedupe_key NOT LIKE 'warm-%%'")
    assert sorted(r["dedupe_key"] for r in rows) == sorted(["k2", "k5", "k8", *keys])
    assert sorted(r["name"] for r in fetch("SELECT name FROM job")) == sorted(
        [*keys, "refuser"])


@pytest.mark.parametrize("level", LEVELS)
def test_a_key_in_the_gap_just_before_a_refused_duplicate(db, writer_url, fetch, server,
                                                          level):
    """The one key range a refused duplicate can hold up: keys sorting between the duplicate
    and the key before it (k4, between k2 and k5). At READ COMMITTED the write is an INSERT …
    WHERE NOT EXISTS that locks nothing. At REPEATABLE READ both servers read first and send
    no INSERT for a committed key, or (multiple statements allowed) send it in the read's
    packet, refused before it stores anything: nothing locked. (A plain INSERT's refusal there would keep
    a shared next-key lock on k5's entry on MariaDB, and k4 would wait: 1205 after 1 s,
    measured; on MySQL every key would.) PostgreSQL has no gap locks. No wait on any server
    at either level."""
    outcomes = _race_refused_duplicate(writer_url, level, ["k4", "k3-x"])
    assert outcomes == {"k5": "refused", "k4": True, "k3-x": True}
    written = {r["dedupe_key"] for r in fetch("SELECT dedupe_key FROM outbox_event")}
    assert {"k4", "k3-x"} <= written


def test_a_session_level_of_read_committed_is_one_statement_on_both_servers(db, db_url,
                                                                             fetch):
    """The level may come from the session (here the driver's options: MySQL's
    ``init_command``, libpq's ``options``; a server default alike), read with the session
    question once per connection: plain ``atomic()`` at READ COMMITTED sends one INSERT …
    WHERE NOT EXISTS (PostgreSQL: … ON CONFLICT DO NOTHING), MySQL included, and a duplicate
    is refused by it (0 rows) with the transaction going on."""
    database = db_url.database(**FAMILY.isolation_options("READ COMMITTED"))
    repo = OutboxRepository(database)
    try:
        with database.atomic():
            repo.create_in_transaction(**EVENT, dedupe_key="warm")
        with capture_sql(database) as statements, database.atomic():
            repo.create_in_transaction(**EVENT, dedupe_key="job-42")
            with pytest.raises(DuplicateEventError):
                repo.create_in_transaction(**EVENT, dedupe_key="warm")
            database.execute_sql("INSERT INTO job (name) VALUES (%s)", ("after",))
    finally:
        database.close()
    sent = _library_statements(statements)
    assert sent == [FAMILY.WRITE_WORD] * 2, statements
    refusal = "NOT EXISTS" if FAMILY.name == "mysql" else "ON CONFLICT"
    writes = [sql for sql, _ in statements if "INSERT INTO outbox_event" in sql]
    assert len(writes) == 2 and all(refusal in sql for sql in writes), statements
    assert sorted(r["dedupe_key"] for r in fetch("SELECT dedupe_key FROM outbox_event")) == [
        "job-42", "warm"]
    assert fetch("SELECT name FROM job") == [{"name": "after"}]


# ---------------------------------------------------------------------------
# A new connection: everything it is asked once, in one statement (issue 30)
# ---------------------------------------------------------------------------

def _words(sql: str) -> set[str]:
    return {word for word in (FAMILY.CLOCK_WORD, FAMILY.CATALOG_WORD) if word in sql}


def _server_now(fetch: Any) -> dt.datetime:
    return fetch(f"SELECT {FAMILY.UTC_NOW} AS now")[0]["now"].replace(tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "dedupe-key"])
def test_a_new_connection_is_asked_everything_in_one_statement(db_url, fetch, keyed):
    """The session (autocommit, isolation level), the server's clock, the tables' columns and,
    on MySQL, max_allowed_packet: one statement on a new connection (was four on MySQL and
    MariaDB, three on PostgreSQL), then the write; the next write on it sends the write only.
    The clock and the schema check keep working from that one answer."""
    database = db_url.database()
    repo = OutboxRepository(database)  # the server's clock
    try:
        server_before = _server_now(fetch)
        started = time.monotonic()
        with capture_sql(database) as statements, database.atomic():
            first = repo.create_in_transaction(**EVENT, dedupe_key="new-1" if keyed else None)
        slack = dt.timedelta(seconds=(time.monotonic() - started) / 2)
        server_after = _server_now(fetch)
        with capture_sql(database) as again, database.atomic():
            repo.create_in_transaction(**EVENT, dedupe_key="new-2" if keyed else None)
    finally:
        database.close()
    # The clock's reading came from the question: the server's, give or take half of what
    # the round trip can have been (the whole write's time bounds it).
    assert server_before - slack <= first.created_at <= server_after + slack
    expected = _expected_write(None, "REPEATABLE READ", keyed)
    assert _library_statements(statements) == ["SELECT", *expected], statements
    question = statements[1][0]
    assert _words(question) == {FAMILY.CLOCK_WORD, FAMILY.CATALOG_WORD}, question
    assert not any(_words(sql) for sql, _ in statements[2:]), statements
    assert _library_statements(again) == expected, again
    assert repo.clock.reads == 1
    row = fetch("SELECT created_at FROM outbox_event WHERE id = %s", first.id)[0]
    assert row["created_at"] == first.created_at.replace(tzinfo=None)


def test_a_new_connection_outside_a_transaction_is_one_question_too(db_url, fetch):
    """A repository call that opens the connection itself (a relay's first call): the
    question, then the call's statement (on main: the clock read twice, the session, the
    schema, then the statement). After a reconnect: the question again (the clock, no
    schema: checked once per database object), then the statement."""
    from outbox_lite import reconnect
    database = db_url.database()
    repo = OutboxRepository(database)
    try:
        database.close()
        with capture_sql(database) as statements:
            assert repo.mark_published(1, "nobody") is False
        reconnect(database)
        with capture_sql(database) as after:
            assert repo.mark_published(1, "nobody") is False
    finally:
        database.close()
    assert [sql.split()[0] for sql, _ in statements] == ["SELECT", "UPDATE"], statements
    assert _words(statements[0][0]) == {FAMILY.CLOCK_WORD, FAMILY.CATALOG_WORD}
    assert [sql.split()[0] for sql, _ in after] == ["SELECT", "UPDATE"], after
    assert _words(after[0][0]) == {FAMILY.CLOCK_WORD}, after
    assert repo.clock.reads == 2


def test_the_url_option_multi_statements(db_url, server):
    """``multi_statements=true`` is a MySQL URL option: its connections allow several
    statements in one packet (PyMySQL's ``CLIENT.MULTI_STATEMENTS``, off by default, as
    without the option); a postgresql:// URL refuses it by name (psycopg has no such switch,
    and the write there is one statement at every level already)."""
    from outbox_lite._families.url import DatabaseUrl, DatabaseUrlError
    with_option = db_url.secret_text() + ("&" if "?" in db_url.secret_text() else "?") + (
        "multi_statements=true")
    if FAMILY.name != "mysql":
        with pytest.raises(DatabaseUrlError, match="unknown URL parameter multi_statements"):
            DatabaseUrl.parse(with_option)
        return
    from pymysql.constants.CLIENT import MULTI_STATEMENTS
    flags = {}
    for name, url in (("plain", db_url), ("option", DatabaseUrl.parse(with_option))):
        database = url.database()
        try:
            flags[name] = bool(database.connection().client_flag & MULTI_STATEMENTS)
        finally:
            database.close()
    assert flags == {"plain": False, "option": True}


def test_a_connection_keeps_its_answer_and_one_with_no_room_for_it_too():
    """The session question's answer is kept on the connection object (one getattr before
    each statement); a connection type that takes no attribute keeps it beside it."""
    from outbox_lite import _session

    class Plain:
        pass

    class NoRoom:
        __slots__ = ("__weakref__",)

    answer = _session.Session(autocommit=True, isolation="READ COMMITTED", server=None)
    for conn in (Plain(), NoRoom()):
        assert _session._kept(conn) is None
        _session._keep(conn, answer)
        assert _session._kept(conn) is answer
    assert getattr(conn, _session._ATTRIBUTE, None) is None and conn in _session._sessions
