"""The caller owns the transaction; instants are UTC whatever the host's or server's zone."""

from __future__ import annotations

import datetime as dt
import os
import time

import pytest

from outbox_lite import OutboxRepository

from _helpers import FAMILY, T0, new_event

_COUNTERS = ("Com_begin", "Com_commit", "Com_rollback", "Com_savepoint",
             "Com_release_savepoint", "Com_rollback_to_savepoint", "Com_xa_start")


def _session_counters(db):
    """The session's own counts of transaction statements (MySQL and MariaDB). PostgreSQL
    keeps none per session: there, inside a transaction, its start time and id (a COMMIT or
    ROLLBACK would change both), and None outside one (the next test's spy is the proof)."""
    if FAMILY.name != "mysql":
        if not db.in_transaction():
            return None
        return tuple(db.execute_sql("SELECT now(), pg_current_xact_id()::text").fetchone())
    rows = db.execute_sql("SHOW SESSION STATUS WHERE Variable_name IN (%s)" % ", ".join(
        ["%s"] * len(_COUNTERS)), _COUNTERS).fetchall()
    return {name: int(value) for name, value in rows}


def _every_method(repo, db):
    """Call every repository method once; the transactional ones inside the caller's."""
    event = None
    if db.in_transaction():
        event = repo.create_in_transaction(event_type="e", aggregate_type="a",
                                           aggregate_id="1", payload={"x": 1})
        repo.claim_batch("batcher", limit=1)
    repo.find_dispatchable()
    other = repo.model.create(event_type="e", aggregate_type="a", aggregate_id="2",
                              dedupe_key=f"spy-{db.in_transaction()}", payload={},
                              available_at=T0, created_at=T0, updated_at=T0)
    assert repo.mark_processing(other.id, "w")
    assert repo.mark_failed(other.id, "w", "x", "y", retryable=False)
    assert repo.requeue_failed([other.id]) == 1
    assert repo.mark_processing(other.id, "w")
    assert repo.mark_published(other.id, "w")
    repo.release_expired_locks(60)
    repo.requeue_failed()
    return event


def test_no_method_begins_commits_or_rolls_back_anything(db, repo):
    """The server's own per-session counters see every BEGIN/COMMIT/ROLLBACK/SAVEPOINT."""
    db.connect(reuse_if_open=True)
    before = _session_counters(db)
    _every_method(repo, db)  # autocommit
    assert _session_counters(db) == before
    db.begin()  # the caller's own transaction, begun by hand so it is counted once
    db.push_transaction(object())  # tell Peewee a transaction is open, as atomic() does
    try:
        started = _session_counters(db)
        _every_method(repo, db)
        assert _session_counters(db) == started
    finally:
        db.pop_transaction()
        db.rollback()


def test_no_method_calls_peeweees_transaction_api(db, repo, monkeypatch):
    calls = []
    for name in ("atomic", "transaction", "savepoint", "manual_commit", "commit", "rollback",
                 "begin"):
        original = getattr(db, name)
        monkeypatch.setattr(db, name, lambda *a, _n=name, _o=original, **k: (
            calls.append(_n), _o(*a, **k))[1])
    with db.atomic():
        calls.clear()
        _every_method(repo, db)
        assert calls == []
    assert calls == ["commit"]  # the caller's own atomic() ending: the spy does see calls
    calls.clear()
    _every_method(repo, db)
    assert calls == []


def test_single_row_methods_work_inside_the_callers_transaction_and_roll_back(db, repo, fetch):
    event = new_event(repo)
    with pytest.raises(RuntimeError):
        with db.atomic():
            assert repo.mark_processing(event.id, "w")
            assert repo.mark_published(event.id, "w")
            raise RuntimeError("undo")
    assert fetch("SELECT status, attempt_count FROM outbox_event") == [
        {"status": "pending", "attempt_count": 0}]


@pytest.fixture
def shanghai_host():
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Shanghai"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def test_instants_stay_utc_with_a_far_host_zone_and_session_time_zone(db_url, fetch,
                                                                       shanghai_host):
    assert time.timezone == -8 * 3600  # the host is now at +08:00
    database = db_url.database()
    database.execute_sql(FAMILY.TIME_ZONE_PLUS_8)  # the session's zone too
    repo = OutboxRepository(database)  # the real clock
    before = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    started = time.monotonic()
    paris = dt.timezone(dt.timedelta(hours=1))
    with database.atomic():
        event = repo.create_in_transaction(
            event_type="e", aggregate_type="a", aggregate_id="1", payload={},
            available_at=dt.datetime(2026, 6, 1, 13, 0, tzinfo=paris))
    # The clock's reading is the server's, paired with the middle of its round trip: off by
    # at most half of it (the whole write's time bounds it), never by the 8 hours checked.
    slack = dt.timedelta(seconds=(time.monotonic() - started) / 2)
    after = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    row = fetch("SELECT available_at, created_at FROM outbox_event")[0]
    assert row["available_at"] == dt.datetime(2026, 6, 1, 12, 0)
    assert before - slack <= row["created_at"] <= after + slack  # UTC, not Shanghai's
    assert event.created_at.tzinfo == dt.timezone.utc
    reread = repo.model.get_by_id(event.id)
    assert reread.available_at == dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.timezone.utc)
    database.close()


def test_two_repositories_on_two_databases_side_by_side(db, db_url, repo, fetch, clock):
    second_url = db_url.with_name(db_url.name + "_b")
    second_url.drop_database()
    second_url.create_database()
    from outbox_lite import migrate as schema
    second_db = second_url.database()
    try:
        schema.migrate(second_db)
        second = OutboxRepository(second_db, clock=clock)
        new_event(repo, 1)
        new_event(second, 2)
        new_event(second, 3)
        assert [e.aggregate_id for e in repo.find_dispatchable()] == ["1"]
        assert [e.aggregate_id for e in second.find_dispatchable()] == ["2", "3"]
        assert repo.model is not second.model
        assert repo.model._meta.database is db and second.model._meta.database is second_db
        assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 1}]
    finally:
        second_db.close()
        second_url.drop_database()
