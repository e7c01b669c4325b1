"""The one Peewee 3/4 difference outbox_lite smooths over: how a database connects."""

from __future__ import annotations

import warnings

import peewee as pw


def test_a_url_database_connects_like_peewees_own_without_a_warning(db_url):
    database = db_url.database()
    assert isinstance(database, pw.MySQLDatabase)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        database.connect()
    assert [str(w.message) for w in caught] == []
    conn = database.connection()
    assert conn.get_autocommit()  # as Peewee's own connect: transactions are atomic()'s
    row = database.execute_sql("SELECT DATABASE(), @@character_set_connection").fetchone()
    assert row == (db_url.name, "utf8mb4")
    database.close()

