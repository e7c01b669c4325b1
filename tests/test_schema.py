"""The migrations: the table they make, idempotence, rollback, and an isolated history.

Where the servers differ the table is stated for each: MySQL and MariaDB as information_schema
shows it; PostgreSQL as ``format_type`` shows it (``timestamp(6) without time zone`` holding UTC,
``COLLATE "C"`` for the identifiers that compare exactly, ``json`` for the payload: the text
kept as written, see /work/team/pg-findings.md).
"""

from __future__ import annotations

from pathlib import Path

import peewee as pw
from peewee_migrate import Router

import outbox_lite
from outbox_lite import migrate as schema
from outbox_lite.models import COLUMNS, OutboxEvent

from _helpers import FAMILY

MIGRATIONS = ["001_create_outbox_event", "002_aggregate_index_published_at",
              "003_status_index_covers_aggregate", "004_create_inbox_message",
              "005_exact_aggregate_ids", "006_headers_and_expiry"]
VARCHAR = "varchar" if FAMILY.name == "mysql" else "character varying"
INSTANT = "datetime(6)" if FAMILY.name == "mysql" else "timestamp(6) without time zone"
EXPECTED_TYPES = {
    "id": "bigint", "event_type": f"{VARCHAR}(255)", "aggregate_type": f"{VARCHAR}(255)",
    "aggregate_id": f"{VARCHAR}(255)", "dedupe_key": f"{VARCHAR}(255)",
    "status": f"{VARCHAR}(16)", "available_at": INSTANT,
    "locked_at": INSTANT, "locked_by": f"{VARCHAR}(255)", "published_at": INSTANT,
    "last_error_code": f"{VARCHAR}(64)", "last_error_message": "text",
    "created_at": INSTANT, "updated_at": INSTANT, "expires_at": INSTANT,
}
EXACT = "utf8mb4_bin" if FAMILY.name == "mysql" else "C"  # the identifiers' collation
# An aggregate's head in one index read: MySQL and MariaDB order NULL published_at first;
# PostgreSQL's index is partial instead, the unpublished events only (WHERE published_at IS
# NULL), ordered by id.
AGGREGATE_INDEX = ["aggregate_type", "aggregate_id",
                   "published_at" if FAMILY.name == "mysql" else "id"]


def _columns(fetch):
    return FAMILY.columns(fetch, "outbox_event")


def test_table_has_the_columns_of_the_spec_with_microsecond_instants(fetch):
    columns = _columns(fetch)
    assert [c["name"] for c in columns] == list(COLUMNS)
    assert len(columns) == 18  # the 16 of SPEC §1, headers and expires_at of §11
    types = {c["name"]: c["type"] for c in columns}
    for name, expected in EXPECTED_TYPES.items():
        assert types[name].startswith(expected), (name, types[name])
    if FAMILY.name == "mysql":
        server = FAMILY.server(lambda sql: [tuple(row.values()) for row in fetch(sql)])
        # MySQL 8.0.19 stopped showing integer display widths: int(10) on MariaDB, int on MySQL.
        assert types["attempt_count"] == ("int(10) unsigned" if server.integer_display_width
                                          else "int unsigned")
        # MariaDB's JSON is LONGTEXT with a json_valid CHECK; MySQL has a JSON type of its own.
        assert types["payload"] == types["headers"] == server.json_column_type
    else:  # PostgreSQL has no unsigned integers (a CHECK keeps it >= 0); json keeps the text
        assert (types["attempt_count"], types["payload"], types["headers"]) == (
            "integer", "json", "json")
    coll = {c["name"]: c["coll"] for c in columns}
    # Identifiers compare exactly (005 made the aggregate and the error code so).
    for name in ("dedupe_key", "locked_by", "aggregate_type", "aggregate_id",
                 "last_error_code"):
        assert coll[name] == EXACT, name


def test_table_has_the_required_indexes_and_no_foreign_key(fetch):
    found = FAMILY.indexes(fetch, "outbox_event")
    indexes = {name: columns for name, (_, columns) in found.items()}
    unique = {name: is_unique for name, (is_unique, _) in found.items()}
    assert indexes[FAMILY.primary_key("outbox_event")] == ["id"]
    assert indexes["uq_outbox_event_dedupe_key"] == ["dedupe_key"]
    assert unique["uq_outbox_event_dedupe_key"]
    # (status, available_at) leads it; the aggregate lets ordered claims read the index alone
    assert indexes["ix_outbox_event_status_available_at"] == [
        "status", "available_at", "id", "aggregate_type", "aggregate_id"]
    assert indexes["ix_outbox_event_locked_at"] == ["locked_at"]
    # (aggregate_type, aggregate_id) leads it; published_at makes an aggregate's head one read
    assert indexes["ix_outbox_event_aggregate"] == AGGREGATE_INDEX
    assert FAMILY.foreign_keys(fetch) == []
    if FAMILY.name == "mysql":  # PostgreSQL has one storage engine
        engine = fetch("SELECT engine AS engine FROM information_schema.tables"
                       " WHERE table_schema = DATABASE() AND table_name = 'outbox_event'")
        assert engine == [{"engine": "InnoDB"}]


def test_status_check_constraint_refuses_unknown_states(db, fetch):
    now = FAMILY.UTC_NOW
    fetch("INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key,"
          " payload, status, available_at, created_at, updated_at) VALUES"
          f" ('a', 'b', 'c', 'k1', '{{}}', 'pending', {now}, {now}, {now})")
    try:
        fetch("UPDATE outbox_event SET status = 'lost' WHERE dedupe_key = 'k1'")
    except Exception as exc:  # noqa: BLE001
        assert "ck_outbox_event_status" in str(exc) or "CONSTRAINT" in str(exc)
    else:
        raise AssertionError("the CHECK constraint let an unknown status in")
    assert fetch("SELECT status FROM outbox_event") == [{"status": "pending"}]


def _index(fetch, name="ix_outbox_event_aggregate"):
    return FAMILY.indexes(fetch, "outbox_event").get(name, (False, []))[1]


STATUS_INDEX = "ix_outbox_event_status_available_at"


def test_migrate_twice_is_a_no_op_and_rollback_undoes_one_migration_at_a_time(db_url, fetch):
    database = db_url.database()
    assert schema.migrate(database) == []  # the fixture migrated already
    assert schema.applied(database) == MIGRATIONS
    assert schema.rollback(database) == "006_headers_and_expiry"
    assert len(_columns(fetch)) == 16
    assert schema.rollback(database) == "005_exact_aggregate_ids"
    assert {c["name"]: c["coll"] for c in _columns(fetch)}["aggregate_id"] == (
        "utf8mb4_unicode_ci" if FAMILY.name == "mysql" else None)  # the database's default
    assert schema.rollback(database) == "004_create_inbox_message"
    assert schema.rollback(database) == "003_status_index_covers_aggregate"
    assert _index(fetch, STATUS_INDEX) == ["status", "available_at"]
    assert schema.rollback(database) == "002_aggregate_index_published_at"
    assert _index(fetch) == ["aggregate_type", "aggregate_id"]
    assert len(_columns(fetch)) == 16
    assert schema.rollback(database) == "001_create_outbox_event"
    assert "outbox_event" not in FAMILY.tables(database)
    assert schema.rollback(database) is None
    assert schema.migrate(database) == MIGRATIONS
    assert len(_columns(fetch)) == 18
    assert _index(fetch) == AGGREGATE_INDEX
    assert _index(fetch, STATUS_INDEX) == ["status", "available_at", "id", "aggregate_type",
                                           "aggregate_id"]
    database.close()


def test_the_index_migrations_keep_the_rows_of_a_table_in_use(db_url, repo, fetch):
    from _helpers import seed
    ids = seed(repo, 50)
    database = db_url.database()
    assert schema.rollback(database) == "006_headers_and_expiry"
    assert schema.rollback(database) == "005_exact_aggregate_ids"
    assert schema.rollback(database) == "004_create_inbox_message"
    assert schema.rollback(database) == "003_status_index_covers_aggregate"
    assert schema.rollback(database) == "002_aggregate_index_published_at"
    assert schema.migrate(database) == ["002_aggregate_index_published_at",
                                        "003_status_index_covers_aggregate",
                                        "004_create_inbox_message", "005_exact_aggregate_ids",
                                        "006_headers_and_expiry"]
    database.close()
    assert [r["id"] for r in fetch("SELECT id FROM outbox_event ORDER BY id")] == ids
    if FAMILY.name == "mysql":  # PostgreSQL's indexes are checked by amcheck, not installed
        assert fetch("CHECK TABLE outbox_event")[0]["Msg_text"] == "OK"


def test_history_is_isolated_from_a_host_services_peewee_migrate(db_url, fetch, tmp_path):
    database = db_url.database()
    host_dir = tmp_path / "host_migrations"
    host_dir.mkdir()
    (host_dir / "001_host.py").write_text(
        "def migrate(migrator, database, *, fake=False):\n"
        "    migrator.sql('CREATE TABLE host_thing (id INT PRIMARY KEY)')\n")
    host = Router(database, migrate_dir=host_dir)  # the host's own, default history table
    assert host.run() == ["001_host"]
    # Ours, built after the host's router, must not read or write the host's history ...
    assert schema.applied(database) == MIGRATIONS
    assert schema.migrate(database) == []
    # ... and the host's history must still hold only the host's migration.
    assert [r["name"] for r in fetch("SELECT name FROM migratehistory")] == ["001_host"]
    assert [r["name"] for r in fetch(f"SELECT name FROM {schema.HISTORY_TABLE}")] == MIGRATIONS
    assert host.done == ["001_host"]
    database.close()


def test_model_fields_match_the_migrated_table(db, fetch):
    table = {c["name"]: c for c in _columns(fetch)}
    for field in OutboxEvent._meta.sorted_fields:
        column = table[field.column_name]
        assert (column["nullable"] == "YES") == field.null, field.name
        if isinstance(field, pw.CharField):
            assert column["type"] == f"{VARCHAR}({field.max_length})", field.name


def test_the_installed_package_carries_the_migrations():
    package_dir = Path(outbox_lite.__file__).resolve().parent
    if (package_dir.parent / "setup.cfg").is_file():  # imported from a checkout
        assert schema.migrations_dir() == package_dir.parent / "migrations"
    else:  # imported from an installed wheel, which must carry them itself
        assert schema.migrations_dir() == package_dir / "migrations"
    assert (schema.migrations_dir() / "001_create_outbox_event.py").is_file()
    assert (package_dir / "py.typed").is_file()
