"""The server's ``max_allowed_packet``: a payload the server would refuse (or, on MySQL, could
never give back) is a PayloadError before any SQL; a stored payload that cannot be read is that
row's dead letter, never the claim's or the relay's death.

The limit is server-wide, so these tests run on one private server of the test server's family
started with ``max_allowed_packet=65536`` (64 KiB), for the whole module. A row larger than that
is stored as a deployment would have stored it: while the limit was higher (``SET GLOBAL``, on
the private server only), then the limit is lowered again.

PostgreSQL has no ``max_allowed_packet`` (``SHOW max_allowed_packet`` is 42704, no such
setting): it takes a statement of any size and a text or json value up to 1 GB (less one byte;
beyond it 54000, program_limit_exceeded), and gives a value back whole. There the tests run on
the shared server (nothing server-wide to set) and state that the library's own
``max_payload_bytes`` (1 MiB by default) is the only bound, to the byte, and that a large stored
payload is read back as it was written, as MariaDB does.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import peewee as pw
import pytest

from outbox_lite import OutboxRepository, PayloadError
from outbox_lite._families import mysql_sql as sql
from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.payload import DEFAULT_MAX_PAYLOAD_BYTES

from _helpers import FAMILY, TEST_URL, capture_sql, committed, sqlstate_or_errno
from _redis import SHARED_REDIS
from _servers import own_server

LIMIT = 65_536
_names = itertools.count()
#: Whether the server has a packet limit at all (MySQL and MariaDB); PostgreSQL has none.
PACKETS = FAMILY.name == "mysql"


@pytest.fixture(scope="module")
def small_packet_server() -> Iterator[DatabaseUrl]:
    """MySQL and MariaDB: a private server at 64 KiB. PostgreSQL: the shared one (no limit
    to set)."""
    if not PACKETS:
        yield TEST_URL
        return
    with own_server(max_allowed_packet=LIMIT) as url:
        yield url


def _set_limit(url: DatabaseUrl, size: int) -> None:
    """The private server's global limit; connections opened afterwards take it (PostgreSQL:
    there is none)."""
    if not PACKETS:
        return
    conn = url.server_connection()
    try:
        with conn.cursor() as cur:
            cur.execute("SET GLOBAL max_allowed_packet = %s", (size,))
    finally:
        conn.close()


@pytest.fixture
def packet_url(small_packet_server: DatabaseUrl) -> Iterator[DatabaseUrl]:
    """A migrated database of this test's own on the private server."""
    url = small_packet_server.with_name(f"packet_{os.getpid()}_{next(_names)}")
    url.create_database(exclusive=True)
    database = url.database()
    schema.migrate(database)
    database.close()
    yield url
    _set_limit(small_packet_server, LIMIT)
    url.drop_database()


def _fetch(url: DatabaseUrl, statement: str, *params: Any) -> list[dict[str, Any]]:
    return committed(url, statement, *params)


def _create(repo: OutboxRepository, payload: Any, aggregate_id: str = "1",
            dedupe_key: str | None = None) -> Any:
    return repo.create_in_transaction(event_type="job.created", aggregate_type="job",
                                      aggregate_id=aggregate_id, payload=payload,
                                      dedupe_key=dedupe_key)


# ---------------------------------------------------------------------------
# Writing: refused before any SQL, saying the server's limit
# ---------------------------------------------------------------------------

def test_a_payload_over_the_servers_packet_is_a_payload_error_before_any_sql(packet_url):
    database = packet_url.database()
    repo = OutboxRepository(database)
    if not PACKETS:  # no packet limit: 100 KB is stored; over max_payload_bytes is refused
        assert sqlstate_or_errno(lambda: database.execute_sql("SHOW max_allowed_packet")
                                 ) == "42704"
        database.close()
        with database.atomic():
            _create(repo, {"n": 1}, dedupe_key="before")
            with capture_sql(database) as statements:
                _create(repo, {"blob": "x" * 100_000}, dedupe_key="big")
                with pytest.raises(PayloadError, match=(
                        rf"payload is {DEFAULT_MAX_PAYLOAD_BYTES + 1} bytes of JSON; the limit"
                        rf" is {DEFAULT_MAX_PAYLOAD_BYTES}$")):
                    _create(repo, {"blob": "x" * (DEFAULT_MAX_PAYLOAD_BYTES - 10)},
                            dedupe_key="too-big")
            assert [sql.split()[0] for sql, _ in statements] == ["INSERT"]  # the 100 KB one
            _create(repo, {"n": 2}, dedupe_key="after")  # the transaction goes on
        database.close()
        rows = _fetch(packet_url, "SELECT dedupe_key, length(payload::text) AS size"
                                  " FROM outbox_event ORDER BY id")
        assert [(r["dedupe_key"], r["size"]) for r in rows] == [
            ("before", 7), ("big", 100_011), ("after", 7)]
        return
    with database.atomic():
        _create(repo, {"n": 1}, dedupe_key="before")
        with capture_sql(database) as statements:
            with pytest.raises(PayloadError, match=r"max_allowed_packet \(65536 bytes\)"):
                _create(repo, {"blob": "x" * 100_000}, dedupe_key="big")
        assert statements == []  # the limit was read with the first event: nothing sent
        _create(repo, {"n": 2}, dedupe_key="after")  # the transaction goes on
    database.close()
    rows = _fetch(packet_url, "SELECT dedupe_key FROM outbox_event ORDER BY id")
    assert [r["dedupe_key"] for r in rows] == ["before", "after"]


def test_the_limit_is_the_servers_own_to_the_byte(packet_url):
    """The largest payload accepted is stored and read back whole; one byte more is refused,
    and the server itself refuses that very INSERT (1153 on both servers)."""
    database = packet_url.database()
    repo = OutboxRepository(database)

    def accepted(n: int) -> bool:
        try:
            with database.atomic() as txn:
                _create(repo, {"b": "x" * n}, dedupe_key="edge")
                txn.rollback()
        except PayloadError:
            return False
        return True

    # accepted(low), not accepted(high); PostgreSQL: the library's bound, 1 MiB
    low, high = 1_000, LIMIT if PACKETS else DEFAULT_MAX_PAYLOAD_BYTES
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if accepted(middle) else (low, middle)
    with database.atomic():
        _create(repo, {"b": "x" * low}, dedupe_key="edge")
    with database.atomic():
        [event] = repo.claim_batch("w", limit=10)
    assert event.payload == {"b": "x" * low}
    database.close()
    if not PACKETS:
        # To the byte: the JSON text {"b":"…"} is max_payload_bytes long. The server itself
        # takes the one byte more, sent around the library; what it refuses is a value over
        # 1 GB (asked without building one: repeat() checks the size first).
        assert low + len('{"b":""}') == DEFAULT_MAX_PAYLOAD_BYTES
        _fetch(packet_url, "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id,"
                           " dedupe_key, payload, available_at, created_at, updated_at) VALUES"
                           " ('t', 'a', '1', 'raw', %s, now(), now(), now())",
               json.dumps({"b": "x" * high}, separators=(",", ":")))
        assert [r["size"] for r in _fetch(packet_url, "SELECT length(payload::text) AS size"
                                          " FROM outbox_event ORDER BY id")] == [
            DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_PAYLOAD_BYTES + 1]
        assert sqlstate_or_errno(lambda: _fetch(
            packet_url, "SELECT length(repeat('x', %s))", 2 ** 30 - 4)) == "54000"
        return
    import pymysql  # the refused statement, as MySQL's driver sends it
    # The refused one, sent as PyMySQL would have sent it: exactly one byte too many.
    now = dt.datetime(2026, 1, 1, 12, 0, 0, 123456)
    params = ("job.created", "job", "1", "egde", json.dumps({"b": "x" * high},
              separators=(",", ":")), now, now, now, None, None)  # no headers, no expiry
    conn = packet_url.server_connection()
    conn.select_db(packet_url.name)
    statement = conn.cursor().mogrify(sql.INSERT, params)
    assert 1 + len(statement.encode()) == LIMIT  # the command byte and the statement
    with pytest.raises(pymysql.MySQLError) as refused:
        conn.cursor().execute(statement)
    assert refused.value.args[0] in (1153, 2006, 2013)  # 1153, or the connection it closed
    conn.close()
    assert _fetch(packet_url, "SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 1}]


def test_a_payload_mysql_could_store_but_never_give_back_is_refused_on_mysql(packet_url,
                                                                              server):
    """12,000 ``true``s are 60,001 bytes of JSON, which the server takes; MySQL writes them
    back as 72,000 bytes (``true, true, …``), more than the limit, and answers an empty
    string (warning 1301). MariaDB gives the text back as stored, and so does PostgreSQL
    (its json type keeps the text)."""
    payload = [True] * 12_000
    if not PACKETS:
        text = json.dumps(payload, separators=(",", ":"))
        _fetch(packet_url, "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id,"
                           " dedupe_key, payload, available_at, created_at, updated_at) VALUES"
                           " ('t', 'a', '1', 'raw', %s, now(), now(), now())", text)
        assert _fetch(packet_url, "SELECT payload FROM outbox_event") == [{"payload": text}]
        _fetch(packet_url, "DELETE FROM outbox_event")
        database = packet_url.database()
        repo = OutboxRepository(database)
        with database.atomic():
            _create(repo, payload)
        with database.atomic():
            assert [e.payload for e in repo.claim_batch("w")] == [payload]
        database.close()
        return
    conn = packet_url.server_connection()
    conn.select_db(packet_url.name)
    with conn.cursor() as cur:  # what the server does with it, sent around the library
        cur.execute("INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id,"
                    " dedupe_key, payload, available_at, created_at, updated_at) VALUES"
                    " ('t', 'a', '1', 'raw', %s, NOW(6), NOW(6), NOW(6))",
                    (json.dumps(payload, separators=(",", ":")),))
        cur.execute("SELECT payload FROM outbox_event WHERE dedupe_key = 'raw'")
        stored = cur.fetchone()[0]
        cur.execute("SHOW WARNINGS")
        warnings = [row[1] for row in cur.fetchall()]
        cur.execute("DELETE FROM outbox_event")
    conn.close()
    database = packet_url.database()
    repo = OutboxRepository(database)
    if server.is_mariadb:
        assert json.loads(stored) == payload and warnings == []
        with database.atomic():
            _create(repo, payload)
        with database.atomic():
            assert [e.payload for e in repo.claim_batch("w")] == [payload]
    else:
        assert stored == "" and warnings == [1301]
        with database.atomic():
            with pytest.raises(PayloadError, match=r"gives back as 72000 bytes.*65536 bytes"):
                _create(repo, payload)
        assert _fetch(packet_url, "SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]
    database.close()


# ---------------------------------------------------------------------------
# Reading: an unreadable row is its own dead letter
# ---------------------------------------------------------------------------

def _store_oversized_row_then_lower_the_limit(url: DatabaseUrl, server_url: DatabaseUrl,
                                              small: int = 20) -> tuple[int, list[int]]:
    """One 100 KB payload (aggregate ``big``), then ``small`` small events (each its own
    aggregate), stored under a 1 MiB limit; then the limit is 64 KiB again."""
    _set_limit(server_url, 1024 * 1024)
    database = url.database()
    repo = OutboxRepository(database)
    with database.atomic():
        big = _create(repo, {"blob": "x" * 100_000}, aggregate_id="big").id
        ids = [_create(repo, {"n": n}, aggregate_id=f"small-{n}").id for n in range(small)]
    database.close()
    _set_limit(server_url, LIMIT)
    return big, ids


def _row(url: DatabaseUrl, event_id: int) -> dict[str, Any]:
    [row] = _fetch(url, "SELECT status, attempt_count, last_error_code, last_error_message,"
                        " locked_by FROM outbox_event WHERE id = %s", event_id)
    return row


def test_an_unreadable_stored_payload_is_its_rows_dead_letter_and_the_rest_flow(
        packet_url, small_packet_server, server, caplog):
    big, ids = _store_oversized_row_then_lower_the_limit(packet_url, small_packet_server)
    database = packet_url.database()
    repo = OutboxRepository(database)
    found = repo.find_dispatchable(limit=100)
    if server.is_mariadb or not PACKETS:  # MariaDB sends a LONGTEXT whole, whatever the
        # limit; PostgreSQL has none
        assert [e.id for e in found] == [big, *ids]
        assert found[0].payload == {"blob": "x" * 100_000}
        assert _row(packet_url, big)["status"] == "pending"
        with database.atomic():
            claimed = repo.claim_batch("w", limit=100, ordered=True)
        assert [e.id for e in claimed] == [big, *ids]
        database.close()
        return
    # MySQL answers the payload as '' (warning 1301): that row becomes a dead letter.
    assert [e.id for e in found] == ids
    row = _row(packet_url, big)
    assert (row["status"], row["attempt_count"], row["last_error_code"]) == (
        "failed", 0, "payload_too_large")
    assert "max_allowed_packet" in row["last_error_message"]
    assert f"outbox event {big} is a dead letter (payload_too_large)" in caplog.text
    # Requeued while the limit is still too small, a claim dead-letters it again, fenced as
    # its claim, and hands out every other event, ordered or not.
    assert repo.requeue_failed([big]) == 1
    with database.atomic():
        claimed = repo.claim_batch("w", limit=100, ordered=True)
    assert [e.id for e in claimed] == ids
    row = _row(packet_url, big)
    assert (row["status"], row["attempt_count"], row["last_error_code"], row["locked_by"]) == (
        "failed", 1, "payload_too_large", None)
    assert {r["status"] for r in _fetch(packet_url, "SELECT status FROM outbox_event"
                                        " WHERE id <> %s", big)} == {"processing"}
    database.close()


def test_the_relay_command_publishes_past_an_unreadable_row(packet_url, small_packet_server,
                                                            server, rds, queue):
    """Before: ``outbox-lite relay`` exited 2 on MySQL with ``Expecting value: line 1 column 1
    (char 0)`` and published none of the 20 events behind the row."""
    big, ids = _store_oversized_row_then_lower_the_limit(packet_url, small_packet_server)
    ran = subprocess.run(
        [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
         packet_url.secret_text(), "--bullmq-url", SHARED_REDIS, "--queue", queue,
         "--batch-size", "5", "--until-empty"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)})
    assert ran.returncode == 0, ran.stderr
    statuses = {r["id"]: r["status"] for r in _fetch(packet_url,
                                                     "SELECT id, status FROM outbox_event")}
    assert all(statuses[i] == "published" for i in ids)
    if server.is_mariadb or not PACKETS:
        assert statuses[big] == "published"
        assert rds.llen(f"bull:{queue}:wait") == 21
    else:
        assert statuses[big] == "failed"
        assert _row(packet_url, big)["last_error_code"] == "payload_too_large"
        assert rds.llen(f"bull:{queue}:wait") == 20
        assert "is a dead letter (payload_too_large)" in ran.stderr


# ---------------------------------------------------------------------------
# Text that is not JSON (shared server: no limit involved)
# ---------------------------------------------------------------------------

def test_a_stored_payload_that_is_not_json_is_its_rows_dead_letter(repo, db, fetch, server):
    """MySQL's JSON type refuses such text (3140), and so does PostgreSQL's json (22P02);
    MariaDB's JSON is LONGTEXT whose CHECK a table made or altered by hand may lack."""
    insert = ("INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key,"
              " payload, available_at, created_at, updated_at) VALUES ('t', 'a', 'x', 'bad',"
              " 'not json', '2026-01-01', '2026-01-01', '2026-01-01')")
    if not server.is_mariadb:
        with pytest.raises(pw.DatabaseError) as refused:
            fetch(insert)
        assert FAMILY.error_code(refused.value) == (3140 if FAMILY.name == "mysql" else "22P02")
        return
    fetch("ALTER TABLE outbox_event MODIFY payload LONGTEXT NOT NULL")  # no json_valid CHECK
    fetch(insert)
    with db.atomic():
        event = repo.create_in_transaction(event_type="t", aggregate_type="a",
                                           aggregate_id="y", payload={"ok": True})
    with db.atomic():
        claimed = repo.claim_batch("w", limit=10)
    assert [e.id for e in claimed] == [event.id]
    [row] = fetch("SELECT status, last_error_code FROM outbox_event WHERE dedupe_key = 'bad'")
    assert row == {"status": "failed", "last_error_code": "payload_not_json"}
