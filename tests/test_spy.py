"""The SQL spy the other tests rely on (``_helpers.capture_sql``): it must see everything."""

from __future__ import annotations

from _helpers import FAMILY, capture_sql, run_threads, transaction_state

#: What the library's one question about a new session asks (outbox_lite._session): MySQL's
#: autocommit (the server's, which the handshake may misreport); PostgreSQL has none on the
#: server, so its isolation level and encodings.
SESSION_QUESTION = {"mysql": ("@@SESSION.autocommit",),
                    "postgresql": ("default_transaction_isolation", "client_encoding")}[
    FAMILY.name]


def test_records_every_statement_with_its_params_in_order(db, repo, fetch):
    with db.atomic():  # the first use per connection reads the schema and the packet limit
        repo.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="0",
                                   payload={})
    with capture_sql(db) as statements:
        with db.atomic():
            db.execute_sql("INSERT INTO job (name) VALUES (%s)", ("spy",))
            repo.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="1",
                                       payload={})
        assert repo.model.select().count() == 2
    assert [sql.split()[0] for sql, _ in statements] == [
        "BEGIN", "INSERT", "INSERT", "COMMIT", "SELECT"]
    assert statements[1] == ("INSERT INTO job (name) VALUES (%s)", ("spy",))
    assert "cursor" not in vars(db)  # the database is left as it was
    db.execute_sql("SELECT 1")
    assert len(statements) == 5
    # On a new connection the library's first statement is its one question about the session
    # (outbox_lite._session): the spy sees that too.
    db.close()
    with capture_sql(db) as fresh:
        assert repo.mark_published(1, "nobody") is False
    assert all(word in fresh[0][0] for word in SESSION_QUESTION), fresh
    assert [sql.split()[0] for sql, _ in fresh] == ["SELECT", "UPDATE"], fresh
    # ... and the UPDATE committed by itself: another session sees no transaction left open
    # (MySQL: none in INNODB_TRX; PostgreSQL: pg_stat_activity says idle).
    assert transaction_state(fetch, FAMILY.session_id(db)) == "idle"


def test_sees_other_threads_and_runs_before_each_statement(db):
    seen = []
    with capture_sql(db, before=lambda sql, _: seen.append(
            db.execute_sql("SELECT %s", (sql,)).fetchone()[0])) as statements:
        results, errors = run_threads(3, lambda i: db.execute_sql(
            "SELECT %s", (i,)).fetchone()[0], database=db)
    assert errors == [] and results == [0, 1, 2]
    assert sorted(params for _, params in statements) == [(0,), (1,), (2,)]
    assert seen == ["SELECT %s"] * 3  # the hook's own statements are not recorded
