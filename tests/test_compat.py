"""Peewee 3 and 4 alike: how a database connects (the one difference); --version."""

from __future__ import annotations

import warnings
from importlib import metadata

import peewee as pw
import psycopg
import psycopg2
import pymysql
import pytest

import outbox_lite
from outbox_lite.cli import main

from _helpers import FAMILY


def test_a_url_database_connects_like_peewees_own_without_a_warning(db_url):
    database = db_url.database()
    assert isinstance(database, pw.MySQLDatabase if FAMILY.name == "mysql"
                      else pw.PostgresqlDatabase)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        database.connect()
    assert [str(w.message) for w in caught] == []
    conn = database.connection()
    # As Peewee's own connect: transactions are atomic()'s.
    assert conn.get_autocommit() if FAMILY.name == "mysql" else conn.autocommit
    if FAMILY.name == "mysql":
        row = database.execute_sql("SELECT DATABASE(), @@character_set_connection").fetchone()
        assert row == (db_url.name, "utf8mb4")
    else:  # the client's encoding, and the database's: UTF8 both, or text would change
        row = database.execute_sql(
            "SELECT current_database(), current_setting('client_encoding'),"
            " current_setting('server_encoding')").fetchone()
        assert tuple(row) == (db_url.name, "UTF8", "UTF8")
    database.close()


def test_version_names_ours_and_the_peewee_line_in_use(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"outbox-lite {outbox_lite.__version__} (Peewee {pw.__version__}, ")
    assert f"peewee-migrate {metadata.version('peewee-migrate')}, " in line
    # each driver installed, by version (the [test] extra brings all three)
    for shown, module in (("PyMySQL", pymysql), ("psycopg", psycopg), ("psycopg2", psycopg2)):
        version = (module.VERSION_STRING if module is pymysql else
                   module.__version__.split()[0])
        assert f"{shown} {version}, " in line
    assert metadata.version("outbox-lite") == outbox_lite.__version__  # setup.cfg reads it
