"""Characters: every one is stored and read back as it is, or refused before anything is written.

A 3-byte ``utf8`` connection (Peewee 3's default) makes the server store a 4-byte character as
'?' without an error, and MySQL hands JSON back through it too, so it loses on reading as well.
The repository therefore refuses such a database when it is made, and a utf8mb4 connection
(Peewee 4's default) round-trips them exactly in every text column.

PostgreSQL has no 3-byte UTF-8: its UTF8 encoding is whole. What loses characters there is a
database or a connection (``client_encoding``) of another encoding: LATIN1 or WIN1252 refuse
most characters (22P05), SQL_ASCII stores bytes unchecked and the driver hands them back as
bytes. The encodings are asked with the library's one question about the session (no check is
possible before connecting), so such a database is refused at its first use, after that one
statement and before anything is written; a default Peewee connection speaks the database's
encoding (UTF8, as ``outbox-lite migrate`` creates it) and round-trips them exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import peewee as pw
import pytest

from outbox_lite import OutboxRepository
from outbox_lite import migrate as schema
from outbox_lite._families.mysql import MySQLDatabase as QuietMySQLDatabase

from _helpers import FAMILY, capture_sql, driver_of

ROCKET = "🚀"  # U+1F680: four bytes in UTF-8
PEEWEE_MAJOR = int(pw.__version__.split(".")[0])


def _peewee_default(db_url, **options):
    """The database a Peewee user makes without naming a charset (on PostgreSQL: an
    encoding), with the family's own Peewee class and driver."""
    if FAMILY.name == "postgresql":
        return pw.PostgresqlDatabase(db_url.name, host=db_url.host, port=db_url.port,
                                     user=db_url.user, password=db_url.password, **options)
    return pw.MySQLDatabase(db_url.name, host=db_url.host, port=db_url.port, user=db_url.user,
                            password=db_url.password, **options)


#: The connection encodings that cannot hold every character, per family; on PostgreSQL
#: through each driver (psycopg 3 hands SQL_ASCII's text back as bytes, psycopg2 as str).
NOT_UTF8 = {"mysql": ["utf8", "utf8mb3", "latin1"],
            "postgresql": [f"{encoding}-{driver}" for driver in ("psycopg", "psycopg2")
                           for encoding in ("LATIN1", "WIN1252", "SQL_ASCII")]}[FAMILY.name]


@pytest.mark.parametrize("charset", NOT_UTF8)
def test_a_database_without_utf8mb4_is_refused_before_any_sql(db_url, fetch, charset):
    if FAMILY.name == "postgresql":
        charset, driver = charset.split("-")
        url = dataclasses.replace(db_url, options=(("driver", driver),))
        database = url.database(client_encoding=charset)
        repo = OutboxRepository(database)  # nothing asked yet: no statement, no connection
        assert database.is_closed()
        with capture_sql(database) as statements, pytest.raises(ValueError) as caught:
            with database.atomic():
                repo.create_in_transaction(event_type="t", aggregate_type="a",
                                           aggregate_id=ROCKET, payload={"t": ROCKET})
        message = str(caught.value)
        assert message.startswith(f"the connection's encoding is {charset}, not UTF8"), message
        assert "\n" not in message
        # BEGIN, the session question (which answers the encodings), then the ROLLBACK.
        assert [sql.split()[0] for sql, _ in statements] == ["BEGIN", "SELECT", "ROLLBACK"]
        assert "client_encoding" in statements[1][0]
        assert driver_of(database) == driver
        database.close()
        assert fetch("SELECT COUNT(*) AS n FROM outbox_event")[0]["n"] == 0
        return
    database = _peewee_default(db_url, charset=charset)
    with capture_sql(database) as statements, pytest.raises(ValueError) as caught:
        OutboxRepository(database)
    message = str(caught.value)
    assert f"charset {charset!r}" in message and "charset='utf8mb4'" in message
    assert "\n" not in message
    assert statements == [] and database.is_closed()
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event")[0]["n"] == 0


def test_peewee_default_connection_is_exact_or_refused_by_line(db_url, fetch):
    """Peewee 4 connects with utf8mb4 and round-trips; Peewee 3's utf8 is refused at once."""
    database = _peewee_default(db_url)
    if FAMILY.name == "postgresql":  # the connection speaks the database's encoding
        repo = OutboxRepository(database)
        with database.atomic():
            event = repo.create_in_transaction(event_type="job.created", aggregate_type="ai_job",
                                               aggregate_id=ROCKET, payload={"text": ROCKET})
        assert database.execute_sql("SELECT current_setting('client_encoding'),"
                                    " current_setting('server_encoding')").fetchone() == (
            "UTF8", "UTF8")
        [row] = fetch("SELECT aggregate_id, payload FROM outbox_event WHERE id = %s", event.id)
        assert row["aggregate_id"] == ROCKET and ROCKET in row["payload"]
        database.close()
    elif PEEWEE_MAJOR >= 4:
        assert database.connect_params["charset"] == "utf8mb4"
        repo = OutboxRepository(database)
        with database.atomic():
            event = repo.create_in_transaction(event_type="job.created", aggregate_type="ai_job",
                                               aggregate_id=ROCKET, payload={"text": ROCKET})
        [row] = fetch("SELECT aggregate_id, payload FROM outbox_event WHERE id = %s", event.id)
        assert row["aggregate_id"] == ROCKET and ROCKET in row["payload"]
        database.close()
    else:
        assert database.connect_params["charset"] == "utf8"
        with pytest.raises(ValueError, match="Peewee 3's default is utf8"):
            OutboxRepository(database)
        assert fetch("SELECT COUNT(*) AS n FROM outbox_event")[0]["n"] == 0


def test_four_byte_characters_round_trip_in_every_text_column(db_url, fetch):
    """Written and read through the repository on a utf8mb4 connection, and checked on a
    connection of the test's own: nothing became '?'."""
    database = QuietMySQLDatabase(db_url.name, host=db_url.host, port=db_url.port,
                                  user=db_url.user, password=db_url.password, charset="utf8mb4"
                                  ) if FAMILY.name == "mysql" else db_url.database()
    repo = OutboxRepository(database)
    text = f"{ROCKET} 𝄞 漢字 ü"
    with database.atomic():
        event = repo.create_in_transaction(
            event_type=f"job.{ROCKET}", aggregate_type=f"ai_{ROCKET}", aggregate_id=text,
            dedupe_key=f"key-{ROCKET}", payload={"text": text, ROCKET: [text]})
    with database.atomic():
        [claimed] = repo.claim_batch(f"worker-{ROCKET}")
    assert claimed.payload == {"text": text, ROCKET: [text]}
    assert (claimed.event_type, claimed.aggregate_type, claimed.aggregate_id) == (
        f"job.{ROCKET}", f"ai_{ROCKET}", text)
    assert claimed.locked_by == f"worker-{ROCKET}" and claimed.dedupe_key == f"key-{ROCKET}"
    assert repo.mark_failed(event.id, f"worker-{ROCKET}", "boom", f"broker said {text}",
                            retryable=False)
    [row] = fetch("SELECT event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
                  " last_error_message FROM outbox_event WHERE id = %s", event.id)
    assert row["event_type"] == f"job.{ROCKET}" and row["aggregate_type"] == f"ai_{ROCKET}"
    assert row["aggregate_id"] == text and row["dedupe_key"] == f"key-{ROCKET}"
    assert row["last_error_message"] == f"broker said {text}"
    assert "?" not in row["payload"] and text in row["payload"]
    database.close()


CONNECTION_REPAIR = ("(the database is UTF8; connect with client_encoding UTF8: the driver's "
                     "client_encoding option, PGCLIENTENCODING, or the role's or database's "
                     "client_encoding setting)")
DATABASE_REPAIR = "(create the database with ENCODING 'UTF8', as outbox-lite migrate does)"


def _create_refused(database: Any) -> str:
    """The ValueError's message of an event's creation on ``database``, which must be refused
    after the session question alone (nothing sent that writes)."""
    repo = OutboxRepository(database)
    with capture_sql(database) as statements, pytest.raises(ValueError) as caught:
        with database.atomic():
            repo.create_in_transaction(event_type="t", aggregate_type="a",
                                       aggregate_id=ROCKET, payload={"t": ROCKET})
    assert [sql.split()[0] for sql, _ in statements] == ["BEGIN", "SELECT", "ROLLBACK"]
    database.close()
    return str(caught.value)


def test_a_connection_of_another_encoding_on_a_utf8_database_names_the_connection(
        db_url, fetch, monkeypatch):
    """Before, a UTF8 database reached through a LATIN1 connection was refused with "create
    the database with ENCODING 'UTF8'", which it has. The connection's encoding comes from the
    driver's client_encoding option or libpq's PGCLIENTENCODING: each is refused with the
    connection's repair, and the repair works. MySQL names the connection's charset before any
    SQL (the database's own charset does not matter there: the tables carry utf8mb4)."""
    if FAMILY.name == "mysql":
        database = _peewee_default(db_url, charset="latin1")
        with pytest.raises(ValueError) as caught:
            OutboxRepository(database)
        assert "charset 'latin1'" in str(caught.value)
        assert "charset='utf8mb4'" in str(caught.value)
        assert "create the database" not in str(caught.value)
        assert fetch("SELECT COUNT(*) AS n FROM outbox_event")[0]["n"] == 0
        return
    expected = ("the connection's encoding is LATIN1, not UTF8: events would not be stored and "
                f"read back as they are {CONNECTION_REPAIR}")
    assert fetch("SELECT current_setting('server_encoding') AS e") == [{"e": "UTF8"}]
    assert _create_refused(db_url.database(client_encoding="LATIN1")) == expected
    monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
    assert _create_refused(db_url.database()) == expected
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event")[0]["n"] == 0
    database = db_url.database(client_encoding="UTF8")  # the repair named, with the variable
    repo = OutboxRepository(database)
    with database.atomic():
        event = repo.create_in_transaction(event_type="t", aggregate_type="a",
                                           aggregate_id=ROCKET, payload={"t": ROCKET})
    database.close()
    assert fetch("SELECT aggregate_id FROM outbox_event WHERE id = %s", event.id) == [
        {"aggregate_id": ROCKET}]


def _latin1_database(db_url, fetch, suffix: str):
    """A new database beside the test's whose encoding is LATIN1 (MySQL: latin1); its URL."""
    url = db_url.with_name(f"{db_url.name}_{suffix}")
    url.drop_database()
    if FAMILY.name == "mysql":
        fetch(f"CREATE DATABASE {url.name} CHARACTER SET latin1")
    else:
        fetch(f"CREATE DATABASE {url.name} ENCODING 'LATIN1' LOCALE 'C' TEMPLATE template0")
    return url


def test_a_database_of_another_encoding_is_refused_with_the_database_repair(db_url, fetch):
    """A LATIN1 database (its connections speak LATIN1 too, by default) is refused for the
    database, with the database's repair, and nothing is written; a UTF8 connection to it is
    refused the same (the server would still refuse most characters). MySQL and MariaDB: a
    database of latin1 by default, migrated, keeps every character (each table is utf8mb4)."""
    url = _latin1_database(db_url, fetch, "latin1")
    try:
        if FAMILY.name == "mysql":
            database = QuietMySQLDatabase(url.name, host=url.host, port=url.port, user=url.user,
                                          password=url.password, charset="utf8mb4")
            schema.migrate(database)
            repo = OutboxRepository(database)
            with database.atomic():
                event = repo.create_in_transaction(event_type="t", aggregate_type="a",
                                                   aggregate_id=ROCKET, payload={"t": ROCKET})
            assert database.execute_sql("SELECT aggregate_id FROM outbox_event WHERE id = %s",
                                        (event.id,)).fetchone() == (ROCKET,)
            database.close()
            return
        setup = url.database()  # migration 001's table, made by hand
        scope: dict[str, Any] = {}
        exec((schema.migrations_dir() / "001_create_outbox_event.py").read_text(), scope)
        setup.execute_sql(scope["POSTGRESQL"][0])
        setup.close()
        expected = ("the database's encoding is LATIN1, not UTF8: events would not be stored "
                    f"and read back as they are {DATABASE_REPAIR}")
        for database in (url.database(), url.database(client_encoding="UTF8")):
            message = _create_refused(database)
            assert message == expected and "client_encoding" not in message
        check = url.database()
        assert check.execute_sql("SELECT COUNT(*) FROM outbox_event").fetchone() == (0,)
        check.close()
    finally:
        url.drop_database()


def test_migrate_into_a_database_of_another_encoding(db_url, fetch):
    """PostgreSQL: ``migrate`` on a LATIN1 database is refused before its first migration, the
    database's repair named, and no table is made (before, it made all six migrations' tables
    and only then refused). MySQL and MariaDB: a latin1 database is migrated, each table
    utf8mb4 whatever the database's default."""
    url = _latin1_database(db_url, fetch, "latin1m")
    try:
        database = url.database()
        if FAMILY.name == "mysql":
            assert schema.migrate(database)
            tables = database.execute_sql(
                "SELECT TABLE_NAME, TABLE_COLLATION FROM information_schema.TABLES"
                " WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ('outbox_event', 'inbox_message')",
                (url.name,)).fetchall()
            assert len(tables) == 2 and all(c.startswith("utf8mb4") for _, c in tables), tables
        else:
            with pytest.raises(ValueError) as refused:
                schema.migrate(database)
            assert str(refused.value) == (
                "the database's encoding is LATIN1, not UTF8: events would not be stored and "
                f"read back as they are {DATABASE_REPAIR}")
            assert database.execute_sql(
                "SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
        database.close()
    finally:
        url.drop_database()
