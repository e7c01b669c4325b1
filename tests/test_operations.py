"""Operations: stats, requeue by code, purge in bounded batches, least privilege, the CLI."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from outbox_lite import InvalidEventError, OutboxRepository
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.cli import main

from _servers import password_server
from _helpers import (FAMILY, OracleDatabase, as_admin, capture_sql, create_login, drop_login,
                      grant, let_migrate, login_name, new_event, seed)

ROOT = Path(__file__).resolve().parent.parent


def _url_text(url, user=None, password=None) -> str:
    return dataclasses.replace(url, user=user or url.user,
                               password=url.password if password is None else password
                               ).secret_text()


def _dead_letter(repo, code, n=0):
    event = new_event(repo, n)
    assert repo.mark_processing(event.id, "w")
    assert repo.mark_failed(event.id, "w", code, "no", retryable=False)
    return event


def test_stats_counts_lag_stuck_claims_and_dead_letters(repo, clock):
    seed(repo, 3)  # pending since T0
    claimed = new_event(repo, 9)
    assert repo.mark_processing(claimed.id, "w")
    _dead_letter(repo, "http_500", 1)
    _dead_letter(repo, "http_500", 2)
    _dead_letter(repo, "bad_payload", 3)
    clock.advance(minutes=10)
    stats = repo.stats(lock_timeout=dt.timedelta(minutes=5))
    assert stats.counts == {"pending": 3, "processing": 1, "published": 0, "failed": 3}
    assert stats.oldest_pending_age == dt.timedelta(minutes=10)
    assert stats.expired_claims == 1
    assert stats.dead_letters_by_code == {"http_500": 2, "bad_payload": 1}
    assert repo.stats().expired_claims is None
    assert stats.as_dict()["oldest_pending_age_seconds"] == 600.0


def test_requeue_by_error_code_only_moves_those(repo, fetch):
    a = _dead_letter(repo, "http_500", 1)
    b = _dead_letter(repo, "bad_payload", 2)
    assert repo.requeue_failed(error_code="http_500") == 1
    rows = {r["id"]: r["status"] for r in fetch("SELECT id, status FROM outbox_event")}
    assert rows == {a.id: "pending", b.id: "failed"}
    assert repo.requeue_failed([b.id], error_code="http_500") == 0
    assert repo.requeue_failed([b.id], error_code="bad_payload") == 1


def test_held_back_counts_each_pending_event_behind_a_dead_letter_once(db, repo, clock):
    with db.atomic():
        ids = {agg: [repo.create_in_transaction(event_type="e", aggregate_type="job",
                                                aggregate_id=agg, payload={}).id
                     for _ in range(4)] for agg in ("a", "b", "c")}
    for agg, dead in (("a", 0), ("a", 1), ("b", 2)):  # a: two dead letters, b: its third
        assert repo.mark_processing(ids[agg][dead], "w")
        assert repo.mark_failed(ids[agg][dead], "w", "x", "y", retryable=False)
    assert repo.mark_processing(ids["b"][3], "w")  # processing: not pending, not counted
    assert repo.stats().held_back == 2  # a's last two; b's fourth is in flight
    assert repo.requeue_failed([ids["a"][0]]) == 1
    assert repo.stats().held_back == 2  # still behind a's second dead letter
    assert repo.delete_failed(None) == 2
    assert repo.stats().held_back == 0


def test_delete_failed_deletes_only_the_dead_letters_named(repo, fetch):
    a = _dead_letter(repo, "http_500", 1)
    b = _dead_letter(repo, "bad_payload", 2)
    c = _dead_letter(repo, "bad_payload", 3)
    pending = new_event(repo, 4)
    claimed = new_event(repo, 5)
    assert repo.mark_processing(claimed.id, "w")
    assert repo.delete_failed([a.id, pending.id, claimed.id, 10 ** 9]) == 1
    assert repo.delete_failed([b.id, c.id], error_code="http_500") == 0
    assert {r["id"] for r in fetch("SELECT id FROM outbox_event")} == {
        b.id, c.id, pending.id, claimed.id}
    assert repo.delete_failed(None, error_code="bad_payload") == 2
    assert fetch("SELECT id, status FROM outbox_event ORDER BY id") == [
        {"id": pending.id, "status": "pending"}, {"id": claimed.id, "status": "processing"}]
    assert repo.delete_failed(None) == 0


def test_delete_failed_of_every_dead_letter_pages_through_them(db, repo, fetch):
    ids = seed(repo, 1203)
    with db.atomic():
        assert len(repo.claim_batch("w", limit=1203)) == 1203
    for event_id in ids[:1201]:
        assert repo.mark_failed(event_id, "w", "x", "y", retryable=False)
    assert repo.delete_failed(None) == 1201
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 2}]


def test_purge_deletes_only_old_published_events_in_bounded_batches(db, repo, fetch, clock):
    old = seed(repo, 2500)
    with db.atomic():
        for event in repo.claim_batch("w", limit=2500):
            repo.mark_published(event.id, "w")
    clock.advance(days=8)
    recent = new_event(repo, 1)
    assert repo.mark_processing(recent.id, "w") and repo.mark_published(recent.id, "w")
    pending = new_event(repo, 2)
    with capture_sql(db) as statements:
        assert repo.purge_published(dt.timedelta(days=7), batch_size=1000) == 2500
    deletes = [params for sql, params in statements if sql.startswith("DELETE")]
    # The ids of one DELETE: MySQL sends one placeholder per id (then the cutoff), PostgreSQL
    # one array parameter (``id = ANY(%s)``). At most 500 a DELETE whatever the batch: MariaDB
    # scans and locks the whole table for an IN list of 1,000 values or more.
    sizes = [len(p[0]) if FAMILY.name == "postgresql" else len(p) - 1 for p in deletes]
    assert sizes == [500] * 5
    left = {r["id"] for r in fetch("SELECT id FROM outbox_event")}
    assert left == {recent.id, pending.id} and not left & set(old)
    assert repo.purge_published(dt.timedelta(days=7)) == 0


@pytest.mark.parametrize("call,field", [
    (lambda r: r.purge_published(-1), "older_than"),
    (lambda r: r.purge_published(60, batch_size=0), "batch_size"),
    (lambda r: r.stats(lock_timeout="5m"), "lock_timeout"),
    (lambda r: r.requeue_failed(error_code=""), "error_code"),
    (lambda r: r.delete_failed(None, error_code=" x"), "error_code"),
    (lambda r: r.delete_failed("1"), "event_ids"),
    (lambda r: r.delete_failed([-1]), "event_id"),
    (lambda r: r.find_dispatchable(limit=-3), "limit"),
    (lambda r: r.mark_failed(1, "w", "c", "m", retryable=1), "retryable"),
])
def test_operations_refuse_bad_arguments(repo, fetch, call, field):
    seed(repo, 1)
    with pytest.raises(InvalidEventError, match=field):
        call(repo)
    assert fetch("SELECT status, attempt_count FROM outbox_event") == [
        {"status": "pending", "attempt_count": 0}]


def test_repository_options_are_checked():
    import peewee as pw
    database = pw.MySQLDatabase("x", charset="utf8mb4")
    with pytest.raises(InvalidEventError, match="max_attempts"):
        OutboxRepository(database, max_attempts=0)
    with pytest.raises(TypeError):
        OutboxRepository("mysql://root@localhost/x")
    with pytest.raises(TypeError):
        OutboxRepository(database, allowed_payload_keys="token")


# ---------------------------------------------------------------------------
# Least privilege
# ---------------------------------------------------------------------------

@pytest.fixture
def runtime_user(db_url, fetch):
    user, password = f"ol_rt_{os.getpid()}", "rt-Pass-123"
    create_login(user, password)
    for table in ("outbox_event", "job"):
        grant("SELECT, INSERT, UPDATE, DELETE", db_url, table, user)
    if FAMILY.name == "postgresql":
        # job's id is BIGSERIAL: its INSERT takes nextval() of a sequence, a privilege of its
        # own on PostgreSQL (outbox_event's id is an identity column: INSERT is enough).
        as_admin(db_url, f"GRANT USAGE ON SEQUENCE job_id_seq TO {login_name(user)}")
    yield user, password
    drop_login(user, db_url)


def test_writer_and_worker_flows_run_with_only_dml_grants(db, db_url, runtime_user, fetch,
                                                          clock):
    user, password = runtime_user
    from outbox_lite._families.url import DatabaseUrl
    url = DatabaseUrl.parse(_url_text(db_url, user, password))
    database = url.database()
    repo = OutboxRepository(database, clock=clock)
    with database.atomic():
        database.execute_sql("INSERT INTO job (name) VALUES ('least')")
        first = repo.create_in_transaction(event_type="e", aggregate_type="a",
                                           aggregate_id="1", payload={"x": 1})
        second = repo.create_in_transaction(event_type="e", aggregate_type="a",
                                            aggregate_id="2", payload={"x": 2})
    with database.atomic():
        assert [e.id for e in repo.claim_batch("w")] == [first.id, second.id]
    assert repo.mark_published(first.id, "w")
    assert repo.mark_failed(second.id, "w", "x", "y", retryable=False)
    assert repo.requeue_failed() == 1
    assert repo.mark_processing(second.id, "w")
    clock.advance(hours=1)
    assert repo.release_expired_locks(60) == 1
    assert repo.stats(lock_timeout=60).counts["pending"] == 1
    clock.advance(days=30)
    assert repo.purge_published(dt.timedelta(days=7)) == 1
    with pytest.raises(Exception) as info:  # and nothing more than DML is allowed
        database.execute_sql("CREATE TABLE sneaky (id INT)")
    assert "1142" in str(info.value) or "denied" in str(info.value)
    database.close()
    assert fetch("SELECT id, status FROM outbox_event") == [{"id": second.id,
                                                             "status": "pending"}]


def test_a_read_only_user_is_refused_changes_never_told_nothing_matched(db_url, repo, fetch,
                                                                        clock):
    # A user with SELECT alone: every command that would change a row says which privilege
    # is missing (exit 1) whenever a row qualifies, and changes nothing; "0" only when none did.
    user, password = f"ol_ro_{os.getpid()}", "ro-Pass-123"
    create_login(user, password)
    grant("SELECT", db_url, "outbox_event", user)
    try:
        url = _url_text(db_url, user, password)
        dead = _dead_letter(repo, "http_500", 1)
        published = new_event(repo, 2)
        fetch("UPDATE outbox_event SET status = 'published', published_at = %s WHERE id = %s",
              (clock.now - dt.timedelta(days=30)).replace(tzinfo=None), published.id)
        before = fetch("SELECT id, status, attempt_count FROM outbox_event ORDER BY id")
        for args, privilege in ((["dead-letters", "--requeue"], "UPDATE"),
                                (["dead-letters", "--delete", "--all"], "DELETE"),
                                (["purge", "--older-than", "7d"], "DELETE")):
            result = subprocess.run([sys.executable, "-m", "outbox_lite.cli", *args,
                                     "--database-url", url], capture_output=True, text=True,
                                    timeout=60, cwd=ROOT)
            assert result.returncode == 1 and result.stdout == "", (args, result.stdout)
            # MySQL's refusal names the privilege ("UPDATE command denied"); PostgreSQL's
            # only the table ("permission denied for table outbox_event").
            lacks = {"mysql": f"the {privilege} privilege", "postgresql": "a privilege"}
            assert result.stderr.strip() == (
                f"outbox-lite {args[0]}: error: user {user} lacks {lacks[FAMILY.name]} on"
                " table outbox_event: see 'Schema, migrations and grants' in the README;"
                f" on {DatabaseUrl.parse(url).location}"), args
        assert fetch("SELECT id, status, attempt_count FROM outbox_event ORDER BY id") == before
        assert {r["id"]: r["status"] for r in before} == {dead.id: "failed",
                                                          published.id: "published"}
        fetch("DELETE FROM outbox_event")  # nothing qualifies: the truth is 0
        result = subprocess.run([sys.executable, "-m", "outbox_lite.cli", "dead-letters",
                                 "--requeue", "--database-url", url], capture_output=True,
                                text=True, timeout=60, cwd=ROOT)
        assert result.returncode == 0 and result.stdout.strip() == "requeued 0 dead letters"
    finally:
        drop_login(user, db_url)


# ---------------------------------------------------------------------------
# The operations CLI
# ---------------------------------------------------------------------------

def test_cli_stats_requeue_purge(db, db_url, repo, capsys):
    _dead_letter(repo, "http_500", 1)
    url = _url_text(db_url)
    assert main(["stats", "--database-url", url, "--json"]) == 0
    assert '"failed": 1' in capsys.readouterr().out
    assert main(["requeue", "--database-url", url, "--error-code", "http_500"]) == 0
    assert "requeued 1" in capsys.readouterr().out
    assert main(["purge", "--database-url", url, "--older-than", "7d"]) == 0
    assert "purged 0" in capsys.readouterr().out
    assert main(["stats", "--database-url", url]) == 0
    assert "pending      1" in capsys.readouterr().out


def test_cli_on_a_database_without_the_table_says_so_in_one_line(db_url, fetch):
    fetch("DROP TABLE outbox_event")
    result = subprocess.run([sys.executable, "-m", "outbox_lite.cli", "stats",
                             "--database-url", _url_text(db_url)],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"outbox-lite stats: error: table outbox_event is missing in "
                                     f"{db_url.name} (run: outbox-lite migrate --database-url"
                                     f" {shlex.quote(str(db_url))})")


def test_cli_refuses_wrong_credentials_without_echoing_them(db_url):
    # A server that checks passwords: MySQL's and MariaDB's test servers do; PostgreSQL's
    # trusts every login from 127.0.0.1, so there a private one with scram-sha-256.
    with password_server() as admin:
        wrong = _url_text(admin.with_name(db_url.name), admin.user, "Wr0ngPass")
        result = subprocess.run([sys.executable, "-m", "outbox_lite.cli", "requeue",
                                 "--database-url", wrong],
                                capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"outbox-lite requeue: error: access denied for user {admin.user} (check the user and"
        f" password); on {DatabaseUrl.parse(wrong).location}"]
    assert "Wr0ngPass" not in result.stderr


def test_the_documented_migration_grants_are_enough(fetch):
    from outbox_lite import migrate as schema
    from outbox_lite._families.url import DatabaseUrl
    from _helpers import TEST_URL
    user, password = f"ol_mig_{os.getpid()}", "mig-Pass-123"
    target = TEST_URL.with_name(f"{TEST_URL.name}_grants_{os.getpid()}")
    target.drop_database()
    target.create_database()
    create_login(user, password)
    let_migrate(target, user)
    database = DatabaseUrl.parse(_url_text(target, user, password)).database()
    try:
        migrations = ["001_create_outbox_event", "002_aggregate_index_published_at",
                      "003_status_index_covers_aggregate", "004_create_inbox_message",
                      "005_exact_aggregate_ids", "006_headers_and_expiry"]
        assert schema.migrate(database) == migrations
        for name in reversed(migrations):
            assert schema.rollback(database) == name
        assert schema.migrate(database) == migrations
        with pytest.raises(Exception, match="denied"):
            database.execute_sql("CREATE DATABASE sneaky_grants")
    finally:
        database.close()
        drop_login(user, target)
        target.drop_database()


# ---------------------------------------------------------------------------
# Durations that would overflow the clock arithmetic, and construction checks
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("call,field", [
    (lambda r: r.release_expired_locks(1e12), "lock_timeout"),
    (lambda r: r.release_expired_locks(10 ** 30), "lock_timeout"),
    (lambda r: r.release_expired_locks(dt.timedelta.max), "lock_timeout"),
    (lambda r: r.stats(lock_timeout=1e12), "lock_timeout"),
    (lambda r: r.stats(lock_timeout=dt.timedelta(days=999_999_999)), "lock_timeout"),
    (lambda r: r.purge_published(dt.timedelta.max), "older_than"),
    (lambda r: r.purge_published(float("inf")), "older_than"),
    (lambda r: r.purge_published(1e300), "older_than"),
])
def test_durations_beyond_the_clock_are_invalid_before_any_sql(repo, fetch, clock, call, field):
    [event_id] = seed(repo, 1)
    assert repo.mark_processing(event_id, "w")
    clock.advance(days=365 * 200)  # everything is old: a wrong cutoff would change rows
    with pytest.raises(InvalidEventError, match=field):
        call(repo)
    assert fetch("SELECT status, attempt_count FROM outbox_event") == [
        {"status": "processing", "attempt_count": 1}]


def test_a_duration_reaching_before_the_year_1000_is_invalid(db, fetch):
    from _helpers import FakeClock
    clock = FakeClock(dt.datetime(1010, 1, 1, tzinfo=dt.timezone.utc))
    repo = OutboxRepository(db, clock=clock)
    with pytest.raises(InvalidEventError, match="before the year 1000"):
        repo.release_expired_locks(dt.timedelta(days=365 * 20))
    with pytest.raises(InvalidEventError, match="before the year 1000"):
        repo.purge_published(dt.timedelta(days=365 * 20))
    assert repo.release_expired_locks(dt.timedelta(days=365)) == 0


def test_mysql_and_postgresql_databases_are_accepted_and_nothing_else():
    """SPEC §9: a Peewee MySQLDatabase or PostgresqlDatabase (or a subclass: pooled, with a
    mixin) is taken; any other database is a TypeError that names what it got."""
    import peewee as pw
    from playhouse.pool import PooledMySQLDatabase, PooledPostgresqlDatabase
    from playhouse.shortcuts import ReconnectMixin

    class Reconnecting(ReconnectMixin, pw.MySQLDatabase):
        pass

    for database in (pw.MySQLDatabase("x", charset="utf8mb4"),
                     PooledMySQLDatabase("x", charset="utf8mb4"),
                     Reconnecting("x", charset="utf8mb4"),
                     pw.PostgresqlDatabase("x"), PooledPostgresqlDatabase("x")):
        assert OutboxRepository(database).database is database
    with pytest.raises(TypeError, match="PostgresqlDatabase.*not OracleDatabase"):
        OutboxRepository(OracleDatabase("x"))


@pytest.mark.parametrize("clock,words", [
    (lambda: dt.datetime(2026, 1, 1), "must be timezone-aware"),
    (lambda: "2026-01-01", "must be a timezone-aware datetime, not str"),
    (lambda: dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc), "must lie between years 1000 and 9999"),
])
def test_a_bad_clock_is_refused_at_construction(db, clock, words):
    with pytest.raises(InvalidEventError, match=f"clock\\(\\) {words}"):
        OutboxRepository(db, clock=clock)


def test_a_clock_that_turns_naive_later_is_a_clear_error_before_any_sql(db, fetch):
    readings = iter([dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)])
    repo = OutboxRepository(db, clock=lambda: next(readings, dt.datetime(2026, 1, 2)))
    with pytest.raises(InvalidEventError, match="clock\\(\\) must be timezone-aware"):
        with db.atomic():
            repo.create_in_transaction(event_type="e", aggregate_type="a", aggregate_id="1",
                                       payload={})
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


@pytest.mark.parametrize("options,words", [
    ({"base": "1"}, "base must be a number, not str"),
    ({"factor": None}, "factor must be a number, not NoneType"),
    ({"cap": True}, "cap must be a number, not bool"),
    ({"jitter": float("nan")}, "jitter must be finite"),
    ({"cap": 1e12}, "cap must be at most"),
    ({"random": 0.5}, "random must be a callable"),
    ({"base": 0}, "base > 0"),
])
def test_backoff_options_are_checked(options, words):
    from outbox_lite import Backoff
    with pytest.raises(InvalidEventError, match=words):
        Backoff(**options)


def test_backoff_with_a_huge_factor_stays_at_its_cap():
    from outbox_lite import Backoff
    backoff = Backoff(base=1, factor=1e10, cap=3600, jitter=0)
    assert backoff.delay(64) == dt.timedelta(hours=1)


# ---------------------------------------------------------------------------
# The dead-letter and purge commands
# ---------------------------------------------------------------------------

def _statuses(fetch):
    return {r["id"]: r["status"] for r in fetch("SELECT id, status FROM outbox_event")}


def test_cli_dead_letters_requeue_and_delete_say_what_happened(db, db_url, repo, fetch, capsys):
    a = _dead_letter(repo, "http_500", 1)
    b = _dead_letter(repo, "http_500", 2)
    c = _dead_letter(repo, "bad_payload", 3)
    pending = new_event(repo, 4)
    url = ["--database-url", _url_text(db_url)]

    assert main(["dead-letters", "--requeue", "--id", str(a.id), str(pending.id), "999999",
                 *url]) == 0
    assert capsys.readouterr().out.strip() == (
        "requeued 1 dead letter; 2 of the 3 given ids are not dead letters"
        " (missing, or not failed)")
    assert _statuses(fetch) == {a.id: "pending", b.id: "failed", c.id: "failed",
                                pending.id: "pending"}

    assert main(["requeue", "--id", str(c.id), "--error-code", "http_500", *url]) == 0
    assert capsys.readouterr().out.strip() == (
        "requeued 0 dead letters; 1 of the 1 given id is not a dead letter with "
        "last_error_code http_500 (missing, or not failed)")

    assert main(["dead-letters", "--delete", "--error-code", "nope", *url]) == 0
    assert capsys.readouterr().out.strip() == (
        "deleted 0 dead letters (no dead letter has last_error_code nope)")

    assert main(["dead-letters", "--delete", "--all", "--dry-run", *url]) == 0
    assert capsys.readouterr().out.strip() == (
        "would delete 2 dead letters (dry run: nothing changed)")
    assert main(["dead-letters", "--requeue", "--error-code", "bad_payload", "--dry-run",
                 *url]) == 0
    assert capsys.readouterr().out.strip() == (
        "would requeue 1 dead letter (dry run: nothing changed)")
    assert _statuses(fetch)[b.id] == "failed" and _statuses(fetch)[c.id] == "failed"

    assert main(["dead-letters", "--delete", "--id", str(b.id), *url]) == 0
    assert capsys.readouterr().out.strip() == "deleted 1 dead letter"
    assert main(["dead-letters", "--delete", "--all", *url]) == 0
    assert capsys.readouterr().out.strip() == "deleted 1 dead letter"
    assert _statuses(fetch) == {a.id: "pending", pending.id: "pending"}


def test_cli_delete_of_every_dead_letter_must_be_asked_for(db, db_url, repo, fetch):
    dead = _dead_letter(repo, "http_500", 1)
    result = subprocess.run([sys.executable, "-m", "outbox_lite.cli", "dead-letters",
                             "--delete", "--database-url", _url_text(db_url)],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2
    assert "--all for every one" in result.stderr
    assert _statuses(fetch) == {dead.id: "failed"}


def test_cli_purge_says_the_age_as_given_and_can_dry_run(db, db_url, repo, fetch, capsys):
    event = new_event(repo, 1)
    assert repo.mark_processing(event.id, "w") and repo.mark_published(event.id, "w")
    fetch(f"UPDATE outbox_event SET published_at = published_at - {FAMILY.interval('30 DAY')}")
    url = ["--database-url", _url_text(db_url)]
    assert main(["purge", "--older-than", "7d", "--dry-run", *url]) == 0
    assert capsys.readouterr().out.strip() == (
        "would purge 1 published event older than 7d (dry run: nothing changed)")
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 1}]
    assert main(["purge", "--older-than", "2w", *url]) == 0
    assert capsys.readouterr().out.strip() == "purged 1 published event older than 2w"
    assert main(["purge", "--older-than", "12h", *url]) == 0
    assert capsys.readouterr().out.strip() == "purged 0 published events older than 12h"
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]
    assert main(["purge", "--older-than", " 7 D ", "--dry-run", *url]) == 0  # as typed, tidied
    assert capsys.readouterr().out.strip() == (
        "would purge 0 published events older than 7d (dry run: nothing changed)")
