"""Schema drift: a history that lost rows, a run that stopped between a migration's DDL and its
history row, a database migrated only part of the way, a table made by hand. ``migrate`` makes
each migration safe to run again; the commands and the Python API check the tables they find
(one information_schema query per database object) and say, in one line, what is wrong and how
to repair it.

On PostgreSQL the hand-made tables are PostgreSQL's DDL (migration 001's ``POSTGRESQL``): an
instant column of a precision below 6 loses microseconds as MySQL's ``DATETIME`` does, while a
``timestamp`` declared without one has PostgreSQL's default precision, 6, and is accepted; a key
column of the database's default collation is refused for ``COLLATE "C"`` (its equality is
exact there too, every database default being deterministic, but "C" pins the byte order and
the exactness whatever the default).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import re
import subprocess
import sys
from typing import Any

import pytest

from outbox_lite import Inbox, OutboxRepository, SchemaError
from outbox_lite import migrate as schema

from _helpers import FAMILY, T0, capture_sql, seed

MIGRATIONS = ["001_create_outbox_event", "002_aggregate_index_published_at",
              "003_status_index_covers_aggregate", "004_create_inbox_message",
              "005_exact_aggregate_ids", "006_headers_and_expiry"]
DDL = re.compile(r"^\s*(CREATE|ALTER|DROP)\b", re.I)


def _history(fetch) -> list[str]:
    return [r["name"] for r in fetch(f"SELECT name FROM {schema.HISTORY_TABLE} ORDER BY id")]


def _migration_sql(name: str, constant: str) -> str:
    scope: dict[str, Any] = {}
    exec((schema.migrations_dir() / f"{name}.py").read_text(), scope)
    return scope[constant]


def _undo(fetch, name: str) -> None:
    """Run a migration's rollback statements by hand (MySQL's ROLLBACK; PostgreSQL's
    POSTGRESQL_ROLLBACK, one statement at a time)."""
    if FAMILY.name == "mysql":
        fetch(_migration_sql(name, "ROLLBACK"))
        return
    scope: dict[str, Any] = {}
    exec((schema.migrations_dir() / f"{name}.py").read_text(), scope)
    for statement in scope["POSTGRESQL_ROLLBACK"]:
        fetch(statement)


def _cli(url, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "outbox_lite.cli", *args,
                           "--database-url", url.secret_text()],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OUTBOX_DATABASE_URL": ""})


# ---------------------------------------------------------------------------
# migrate: safe to run again
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("lost", MIGRATIONS)
def test_a_change_in_place_without_its_history_row_is_recorded_not_redone(
        db_url, repo, fetch, lost, caplog):
    """A run that stopped between a migration's DDL and its history row (MySQL's DDL is not
    transactional). Before: 004 failed every migrate with (1050, "Table 'inbox_message' already
    exists"); 003 (and 002, 005) was silently applied again, out of order."""
    seed(repo, 3)
    fetch(f"INSERT INTO inbox_message VALUES ('c', 'm', {FAMILY.UTC_NOW})")
    fetch(f"DELETE FROM {schema.HISTORY_TABLE} WHERE name = %s", lost)
    database = db_url.database()
    with capture_sql(database) as statements, caplog.at_level(logging.WARNING):
        assert schema.migrate(database) == [lost]
    assert [sql for sql, _ in statements if DDL.match(sql)] == []  # nothing made again
    assert f"{lost} was in place but not recorded" in caplog.text
    assert sorted(_history(fetch)) == MIGRATIONS
    assert schema.migrate(database) == []
    database.close()
    assert len(fetch("SELECT id FROM outbox_event")) == 3
    assert fetch("SELECT consumer FROM inbox_message") == [{"consumer": "c"}]


def test_rollback_refuses_while_history_and_schema_disagree(db_url, fetch):
    """Before: with 004's history row missing, rollback undid 003, not 004."""
    fetch(f"DELETE FROM {schema.HISTORY_TABLE} WHERE name = '004_create_inbox_message'")
    database = db_url.database()
    with pytest.raises(SchemaError, match=r"004_create_inbox_message is in place but not "
                                          r"recorded.*run: outbox-lite migrate"):
        schema.rollback(database)
    assert len(_history(fetch)) == len(MIGRATIONS) - 1  # nothing undone
    assert schema.migrate(database) == ["004_create_inbox_message"]
    assert schema.rollback(database) == MIGRATIONS[-1]
    database.close()


def test_rollback_undoes_the_newest_migration_whatever_order_its_rows_were_written(db_url,
                                                                                   fetch):
    rows = _history(fetch)
    fetch(f"DELETE FROM {schema.HISTORY_TABLE}")
    for name in reversed(rows):  # ids now run 005 … 001
        fetch(f"INSERT INTO {schema.HISTORY_TABLE} (name, migrated_at) VALUES (%s, NOW())",
              name)
    database = db_url.database()
    assert schema.applied(database) == MIGRATIONS
    assert schema.rollback(database) == MIGRATIONS[-1]
    database.close()


def test_a_missing_change_older_than_the_newest_is_applied_out_of_order_with_a_warning(
        db_url, fetch, caplog):
    _undo(fetch, "003_status_index_covers_aggregate")
    fetch(f"DELETE FROM {schema.HISTORY_TABLE} WHERE name = '003_status_index_covers_aggregate'")
    database = db_url.database()
    with caplog.at_level(logging.WARNING):
        assert schema.migrate(database) == ["003_status_index_covers_aggregate"]
    database.close()
    assert (f"003_status_index_covers_aggregate was not applied though {MIGRATIONS[-1]} "
            "is: applied it out of order") in caplog.text
    assert FAMILY.indexes(fetch, "outbox_event")["ix_outbox_event_status_available_at"][1] == [
        "status", "available_at", "id", "aggregate_type", "aggregate_id"]


def test_a_recorded_migration_whose_change_is_missing_is_applied_again(db_url, fetch, caplog):
    fetch("DROP TABLE inbox_message")
    database = db_url.database()
    with caplog.at_level(logging.WARNING):
        assert schema.migrate(database) == ["004_create_inbox_message"]
    database.close()
    assert ("004_create_inbox_message was recorded but its change was missing: applied it "
            "again") in caplog.text
    database = db_url.database()
    assert "inbox_message" in FAMILY.tables(database)
    database.close()
    assert sorted(_history(fetch)) == MIGRATIONS


# ---------------------------------------------------------------------------
# The first-use check: one line, what is wrong and how to repair it
# ---------------------------------------------------------------------------

def _migrated_only_to_001(db_url) -> None:
    database = db_url.database()
    for _ in MIGRATIONS[1:]:
        schema.rollback(database)
    database.close()


def test_a_database_migrated_only_to_001_is_a_schema_error_at_first_use(db_url, fetch):
    """Before: it ran with no warning until ``Inbox.accept`` raised a raw ProgrammingError
    1146."""
    _migrated_only_to_001(db_url)
    database = db_url.database()
    inbox = Inbox(database, "billing")
    with database.atomic():
        with pytest.raises(SchemaError) as missing:
            inbox.accept("m-1")
    assert str(missing.value) == (
        f"table inbox_message is missing in {db_url.name} (run: outbox-lite migrate)")
    repo = OutboxRepository(database)
    with database.atomic():
        with pytest.raises(SchemaError, match=(
                r"aggregate_id compares by utf8mb4_unicode_ci, not exactly.*; run: outbox-lite "
                r"migrate$" if FAMILY.name == "mysql" else r"aggregate_id compares by default, "
                r"not exactly \(C\).*; run: outbox-lite migrate$")):
            repo.create_in_transaction(event_type="t", aggregate_type="a", aggregate_id="1",
                                       payload={})
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]
    assert schema.migrate(database) == MIGRATIONS[1:]
    with database.atomic():  # repaired: the same objects work now
        assert inbox.accept("m-1")
        repo.create_in_transaction(event_type="t", aggregate_type="a", aggregate_id="1",
                                   payload={})
    database.close()


def _hand_made(fetch, *changes: tuple[str, str]) -> None:
    if FAMILY.name == "postgresql":  # 001's table, its indexes, then 006's columns
        create, *indexes = _migration_sql("001_create_outbox_event", "POSTGRESQL")
        for column in ("aggregate_type     VARCHAR(255)", "aggregate_id       VARCHAR(255)",
                       "last_error_code    VARCHAR(64) "):
            assert column in create
            create = create.replace(column, f'{column.rstrip()} COLLATE "C" ')
        for old, new in changes:
            assert old in create
            create = create.replace(old, new)
        fetch("DROP TABLE outbox_event")
        for statement in (create, *indexes,
                          _migration_sql("006_headers_and_expiry", "POSTGRESQL_MIGRATE")):
            fetch(statement)
        return
    create = _migration_sql("001_create_outbox_event", "CREATE_OUTBOX_EVENT")
    create = create.replace("aggregate_type     VARCHAR(255)", "aggregate_type     VARCHAR(255)"
                            " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    create = create.replace("aggregate_id       VARCHAR(255)", "aggregate_id       VARCHAR(255)"
                            " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    create = create.replace("last_error_code    VARCHAR(64) ", "last_error_code    VARCHAR(64)"
                            " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    for old, new in changes:
        assert old in create
        create = create.replace(old, new)
    fetch("DROP TABLE outbox_event")
    fetch(create)
    fetch(_migration_sql("006_headers_and_expiry", "MIGRATE"))  # made by hand up to date


HAND_MADE = {"mysql": [
    ([("locked_at          DATETIME(6)", "locked_at          DATETIME"),
      ("available_at       DATETIME(6)", "available_at       DATETIME")],
     "available_at is datetime, not datetime(6) (its instants would lose their microseconds), "
     "locked_at is datetime, not datetime(6) (its instants would lose their microseconds); "
     "repair: ALTER TABLE outbox_event MODIFY available_at DATETIME(6) NOT NULL, "
     "MODIFY locked_at DATETIME(6) NULL"),
    ([("dedupe_key         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
       "dedupe_key         VARCHAR(255)")],
     "dedupe_key compares by utf8mb4_unicode_ci, not exactly (utf8mb4_bin); repair: ALTER "
     "TABLE outbox_event MODIFY dedupe_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE "
     "utf8mb4_bin NOT NULL"),
], "postgresql": [
    ([("locked_at          TIMESTAMP(6)", "locked_at          TIMESTAMP(0)"),
      ("available_at       TIMESTAMP(6)", "available_at       TIMESTAMP(3)")],
     "available_at is timestamp(3) without time zone, not timestamp(6) without time zone (its "
     "instants would lose their microseconds), locked_at is timestamp(0) without time zone, "
     "not timestamp(6) without time zone (its instants would lose their microseconds); "
     "repair: ALTER TABLE outbox_event ALTER COLUMN available_at TYPE TIMESTAMP(6), "
     "ALTER COLUMN locked_at TYPE TIMESTAMP(6)"),
    ([('dedupe_key         VARCHAR(255) COLLATE "C"', "dedupe_key         VARCHAR(255)")],
     'dedupe_key compares by default, not exactly (C); repair: ALTER TABLE outbox_event '
     'ALTER COLUMN dedupe_key TYPE VARCHAR(255) COLLATE "C"'),
]}[FAMILY.name]


@pytest.mark.parametrize("changes, complaint", HAND_MADE,
                         ids=["datetime-without-fraction", "case-insensitive-dedupe-key"]
                         if FAMILY.name == "mysql" else ["timestamp-without-fraction",
                                                         "default-collation-dedupe-key"])
def test_a_hand_made_table_is_refused_with_the_statement_that_repairs_it(
        db_url, fetch, changes, complaint):
    """Before: accepted, and then ``extend_locks`` returned 0 for claims that were held (the
    instants lost their microseconds), or two keys differing in case were one."""
    _hand_made(fetch, *changes)
    database = db_url.database()
    repo = OutboxRepository(database)
    expected = (f"table outbox_event in database {db_url.name} is not as outbox_lite needs "
                f"it: {complaint}")
    with pytest.raises(SchemaError) as wrong:
        repo.find_dispatchable()
    assert str(wrong.value) == expected
    with pytest.raises(SchemaError) as again:  # migrate cannot make it right: it says so too
        schema.migrate(database)
    assert str(again.value) == expected
    ran = _cli(db_url, "stats")
    assert (ran.returncode, ran.stdout) == (1, "")
    assert ran.stderr == f"outbox-lite stats: error: {expected}; on {db_url.location}\n"
    fetch(expected.split("repair: ")[1])  # the repair it names works
    seed(repo, 2)
    with database.atomic():
        assert len(repo.claim_batch("w", limit=5)) == 2
    database.close()


def test_an_instant_declared_without_a_precision_is_what_each_server_makes_it(db_url, fetch):
    """MySQL's ``DATETIME`` is datetime(0): refused (above). PostgreSQL's ``TIMESTAMP`` is
    timestamp(6): accepted, and its instants keep their microseconds. Before, the check read
    ``timestamp without time zone`` as not timestamp(6) and refused it, saying its instants
    would lose their microseconds."""
    if FAMILY.name == "mysql":
        _hand_made(fetch, ("locked_at          DATETIME(6)", "locked_at          DATETIME"))
        database = db_url.database()
        with pytest.raises(SchemaError, match=r"locked_at is datetime, not datetime\(6\)"):
            OutboxRepository(database).find_dispatchable()
        database.close()
        return
    _hand_made(fetch, ("locked_at          TIMESTAMP(6)", "locked_at          TIMESTAMP"),
               ("available_at       TIMESTAMP(6)", "available_at       TIMESTAMP"))
    assert {c["name"]: c["type"] for c in FAMILY.columns(fetch, "outbox_event")}[
        "locked_at"] == "timestamp without time zone"
    database = db_url.database()
    repo = OutboxRepository(database, clock=lambda: T0.replace(microsecond=123456))
    seed(repo, 2)
    with database.atomic():
        claimed = repo.claim_batch("w", limit=5)
    assert len(claimed) == 2
    assert repo.extend_locks([e.id for e in claimed], "w") == 2  # the instants compare whole
    assert {r["t"] for r in fetch("SELECT available_at AS t FROM outbox_event")} == {
        T0.replace(microsecond=123456, tzinfo=None)}
    database.close()


def test_the_commands_say_it_in_one_line_without_the_url(db_url, fetch):
    _migrated_only_to_001(db_url)
    for command in (["stats"], ["dead-letters"], ["inbox", "purge", "--older-than", "7d"]):
        ran = _cli(db_url, *command)
        assert ran.returncode == 1, (command, ran.stderr)
        lines = ran.stderr.splitlines()
        assert len(lines) == 1 and "run: outbox-lite migrate" in lines[0], (command, lines)
        # Only as the hint's --database-url (the database given, not the default one's).
        assert ran.stderr.count(f"{FAMILY.SCHEME}://") == ran.stderr.count(
            f"--database-url {shlex.quote(str(db_url))}")
    ran = _cli(db_url, "migrate")
    assert ran.returncode == 0, ran.stderr
    assert _history(fetch) == MIGRATIONS
    assert _cli(db_url, "stats").returncode == 0


def test_the_first_use_check_is_one_query_per_database_object(db_url):
    database = db_url.database()
    repo, inbox = OutboxRepository(database), Inbox(database, "c")
    with capture_sql(database) as statements:
        repo.find_dispatchable()
        repo.stats()
        with database.atomic():
            inbox.accept("m")
        OutboxRepository(database).find_dispatchable()
    checks = [sql for sql, _ in statements if FAMILY.CATALOG_WORD in sql]
    assert len(checks) == 1
    database.close()


# ---------------------------------------------------------------------------
# Types that hold the values but change them: a zoned instant, a binary JSON
# ---------------------------------------------------------------------------

def _refused_before_writing(db_url, fetch, expected: str) -> None:
    """The repository, ``migrate`` and the command line refuse with ``expected``; nothing is
    written."""
    database = db_url.database()
    repo = OutboxRepository(database)
    with database.atomic():
        with pytest.raises(SchemaError) as wrong:
            repo.create_in_transaction(event_type="t", aggregate_type="a", aggregate_id="1",
                                       payload={"b": 1, "a": 2})
    assert str(wrong.value) == expected
    with pytest.raises(SchemaError) as again:
        schema.migrate(database)
    assert str(again.value) == expected
    database.close()
    ran = _cli(db_url, "stats")
    assert (ran.returncode, ran.stderr) == (
        1, f"outbox-lite stats: error: {expected}; on {db_url.location}\n")
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


ZONED = ("the library's UTC instants would be taken as times of the session's TimeZone: stored "
         "and read back shifted by its offset in any zone but UTC")


def test_an_instant_column_with_a_time_zone_is_refused_for_the_shift_it_would_make(db_url,
                                                                                   fetch):
    """PostgreSQL's ``timestamptz`` takes the naive UTC instants the library writes as times
    of the session's TimeZone: in a session on Europe/Berlin an event created at 01:30 UTC is
    stored as 00:30 UTC and read back as 01:30+01:00. Before, it was refused "(its instants
    would lose their microseconds)", which is not what goes wrong, and the repair it gave
    converted at the repairing session's TimeZone (shifting every row in a session not on
    UTC). MySQL's zoned type is TIMESTAMP(6): refused there for the same shift (before: "(its
    instants would lose their microseconds)" too), with MODIFY … DATETIME(6)."""
    if FAMILY.name == "mysql":
        _hand_made(fetch, ("available_at       DATETIME(6)", "available_at       TIMESTAMP(6)"))
        database = db_url.database()
        with pytest.raises(SchemaError) as wrong:
            OutboxRepository(database).find_dispatchable()
        database.close()
        assert str(wrong.value).startswith(
            f"table outbox_event in database {db_url.name} is not as outbox_lite needs it: "
            "available_at is timestamp(6), not datetime(6) (a TIMESTAMP takes the library's "
            "UTC instants as times of the session's time_zone")
        assert str(wrong.value).endswith(
            "repair: ALTER TABLE outbox_event MODIFY available_at DATETIME(6) NOT NULL")
        assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]
        return
    _hand_made(fetch, ("available_at       TIMESTAMP(6)", "available_at       TIMESTAMPTZ"),
               ("locked_at          TIMESTAMP(6)", "locked_at          TIMESTAMPTZ(3)"))
    expected = (
        f"table outbox_event in database {db_url.name} is not as outbox_lite needs it: "
        f"available_at is timestamp(6) with time zone, not timestamp(6) without time zone "
        f"({ZONED}), locked_at is timestamp(3) with time zone, not timestamp(6) without time "
        f"zone ({ZONED}, and they would lose their microseconds); repair: ALTER TABLE "
        "outbox_event ALTER COLUMN available_at TYPE TIMESTAMP(6) USING available_at AT TIME "
        "ZONE 'UTC', ALTER COLUMN locked_at TYPE TIMESTAMP(6) USING locked_at AT TIME ZONE "
        "'UTC'")
    _refused_before_writing(db_url, fetch, expected)
    # What the server does with such a column: the same instant, stored from a session on
    # UTC and from one on Europe/Berlin, is two instants an hour apart.
    berlin = db_url.database(options="-c TimeZone=Europe/Berlin")
    utc = db_url.database(options="-c TimeZone=UTC")
    naive = "2026-03-29 01:30:00.123456"
    assert berlin.execute_sql("SELECT (%s::timestamp::timestamptz AT TIME ZONE 'UTC')::text",
                              (naive,)).fetchone() == ("2026-03-29 00:30:00.123456",)
    # A row stored right (from a session on UTC); the repair, run from a session on Berlin,
    # keeps its instant.
    utc.execute_sql("INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id,"
                    " dedupe_key, payload, status, attempt_count, available_at, created_at,"
                    " updated_at) VALUES ('t', 'a', '1', 'k', '{}', 'pending', 0, %s, %s, %s)",
                    (naive, naive, naive))
    berlin.execute_sql(expected.split("repair: ")[1])
    assert fetch("SELECT available_at::text AS t FROM outbox_event") == [
        {"t": "2026-03-29 01:30:00.123456"}]
    berlin.close()
    utc.close()
    database = db_url.database()
    repo = OutboxRepository(database)
    seed(repo, 1)
    with database.atomic():
        assert len(repo.claim_batch("w", limit=5)) == 2
    database.close()


BINARY_JSON = ("jsonb does not keep the JSON text written: keys come back reordered and numbers "
               "rewritten, 1e+16 as 10000000000000000")


def test_a_binary_json_payload_column_is_refused_for_the_text_it_would_change(db_url, fetch,
                                                                              server):
    """PostgreSQL's ``jsonb`` stores a parsed value: the payload ``{"b":1,"a":2,"x":1e+16}``
    comes back as ``{"a": 2, "b": 1, "x": 10000000000000000}`` (a consumer decoding it gets an
    integer for a float, and a message body of other bytes), and a string holding U+0000 is
    refused. Before, the check took it for ``json`` (its type name starts so) and accepted it.
    MySQL and MariaDB have one JSON type, the migration's: MariaDB's keeps the text, MySQL's
    re-serialises it (``Server.keeps_json_text``) but keeps a float a float."""
    given = '{"b":1,"a":2,"x":1e+16}'
    if FAMILY.name == "mysql":
        database = db_url.database()
        repo = OutboxRepository(database)
        with database.atomic():
            event = repo.create_in_transaction(event_type="t", aggregate_type="a",
                                               aggregate_id="1", payload={"b": 1, "a": 2,
                                                                          "x": 1e16})
        database.close()
        [row] = fetch("SELECT payload FROM outbox_event WHERE id = %s", event.id)
        if server.keeps_json_text:
            assert row["payload"] == given
        else:
            assert row["payload"] != given and json.loads(row["payload"]) == {
                "b": 1, "a": 2, "x": 1e16}
            assert type(json.loads(row["payload"])["x"]) is float
        return
    assert fetch("SELECT (%s::jsonb)::text AS t", given) == [
        {"t": '{"a": 2, "b": 1, "x": 10000000000000000}'}]
    _hand_made(fetch)
    fetch("ALTER TABLE outbox_event ALTER COLUMN payload TYPE jsonb,"
          " ALTER COLUMN headers TYPE jsonb")
    expected = (f"table outbox_event in database {db_url.name} is not as outbox_lite needs "
                f"it: payload is jsonb, not json ({BINARY_JSON}), headers is jsonb, not json "
                f"({BINARY_JSON}); repair: ALTER TABLE outbox_event ALTER COLUMN payload TYPE "
                "JSON, ALTER COLUMN headers TYPE JSON")
    _refused_before_writing(db_url, fetch, expected)
    fetch(expected.split("repair: ")[1])  # the repair it names works
    database = db_url.database()
    repo = OutboxRepository(database)
    with database.atomic():
        event = repo.create_in_transaction(event_type="t", aggregate_type="a", aggregate_id="1",
                                           payload={"b": 1, "a": 2, "x": 1e16},
                                           headers={"zz": "1", "a": "2"})
    with database.atomic():
        [claimed] = repo.claim_batch("w", limit=1)
    database.close()
    assert fetch("SELECT payload::text AS p, headers::text AS h FROM outbox_event"
                 " WHERE id = %s", event.id) == [{"p": given, "h": '{"zz":"1","a":"2"}'}]
    assert list(claimed.payload.items()) == [("b", 1), ("a", 2), ("x", 1e16)]
    assert type(claimed.payload["x"]) is float and list(claimed.headers) == ["zz", "a"]
