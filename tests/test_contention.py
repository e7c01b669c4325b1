"""The contention suite at a small size: every scenario holds, and a broken repository fails it."""

from __future__ import annotations

import importlib
import json
import os
import threading

import pytest

from outbox_lite import OutboxRepository
from outbox_lite._db import execute
from outbox_lite.cli import main
from outbox_lite.contention import SCENARIOS, ContentionSuite, format_table
from outbox_lite.contention.suite import REGISTRY
from outbox_lite.errors import LockConflictError

from _helpers import FAMILY, TEST_URL


@pytest.fixture
def suite_url():
    url = TEST_URL.with_name(f"{TEST_URL.name}_suite_{os.getpid()}")
    yield url
    url.drop_database()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenario_holds_its_invariants(suite_url, scenario):
    suite = ContentionSuite(suite_url, workers=6, events=300, batch_size=10)
    [result] = suite.run([scenario])
    assert result.violations == []
    assert result.ok and result.claims > 0 and result.seconds > 0
    if scenario == "cas":
        assert result.cas_misses is not None
    assert result.deadlocks == 0


def _crossed_updates(suite, result, workers):
    """Two workers each update one event, then the other's, in one transaction: each waits
    for the other's row, and the server ends the deadlock by rolling one of them back."""
    ids = suite.seed(2)
    both_hold_one = threading.Barrier(2)

    def worker(i):
        bump = "UPDATE outbox_event SET attempt_count = attempt_count + 1 WHERE id = %s"
        try:
            with suite.database.atomic():
                execute(suite.database, bump, (ids[i],))
                both_hold_one.wait(timeout=30)
                execute(suite.database, bump, (ids[1 - i],))
        except LockConflictError:
            workers.count_conflict()
            return "rolled back"
        return "committed"

    results, errors = workers.run(2, worker)
    result.violations += [repr(e) for e in errors]
    result.claims = results.count("committed")
    result.seconds = workers.seconds


def test_the_suite_reads_deadlocks_and_lock_waits_from_the_server(suite_url, monkeypatch):
    """A scenario of two crossed updates: the figures say what the server saw, read right
    after it (a PostgreSQL session reports its counts only late while it lives: the suite reads
    them once the scenario's sessions have ended).

    Deadlocks: PostgreSQL counts them per database (pg_stat_database), and the suite's database
    is its own: exactly 1. InnoDB counts them for the whole server, which other sessions share:
    at least 1. Lock waits: InnoDB's counter (lock_row_lock_waits) has the waits; PostgreSQL
    keeps no count, and the suite counts the waits it saw in pg_locks (each lasts until the
    deadlock check, deadlock_timeout = 1 s by default, so it is seen): at least 1 either way."""
    monkeypatch.setitem(REGISTRY, "crossed", _crossed_updates)
    suite = ContentionSuite(suite_url, workers=2, events=2)
    [result] = suite.run(["crossed"])
    assert result.violations == []
    assert (result.claims, result.lock_conflicts) == (1, 1)
    if FAMILY.name == "postgresql":
        assert result.deadlocks == 1
        assert result.lock_waits_seen is True
        assert "the server keeps no count of them" in format_table([result])
    else:
        assert result.deadlocks >= 1
        assert result.lock_waits_seen is False
    assert result.lock_waits >= 1


def test_the_run_drops_its_database_unless_kept(suite_url):
    ContentionSuite(suite_url, workers=2, events=10).run(["batch"])
    conn = suite_url.server_connection()
    try:
        cur = conn.cursor()
        cur.execute(FAMILY.DATABASE_COUNT, (suite_url.name,))
        assert tuple(cur.fetchone()) == (0,)
        ContentionSuite(suite_url, workers=2, events=10, keep=True).run(["batch"])
        cur.execute(FAMILY.DATABASE_COUNT, (suite_url.name,))
        assert tuple(cur.fetchone()) == (1,)
    finally:
        conn.close()


class _NoFencing(OutboxRepository):
    """Broken on purpose: publishes whatever the caller names, held by anyone or not."""

    def mark_published(self, event_id, locked_by):
        now = self._now()
        return self.database.execute_sql(
            "UPDATE outbox_event SET status = 'published', published_at = %s,"
            " locked_by = NULL, locked_at = NULL WHERE id = %s",
            (now, event_id)).rowcount == 1


class _NoFencingMany(OutboxRepository):
    """Broken on purpose: the batch publish ignores who holds the events."""

    def mark_published_many(self, event_ids, locked_by):
        ids = list(event_ids)
        if not ids:
            return 0
        now = self._now()
        return self.database.execute_sql(
            "UPDATE outbox_event SET status = 'published', published_at = %s, locked_by = NULL,"
            f" locked_at = NULL WHERE id IN ({', '.join(['%s'] * len(ids))})"
            " AND status = 'processing'", (now, *ids)).rowcount


class _ForgetsRetries(OutboxRepository):
    """Broken on purpose: every failure dead-letters, retryable or not."""

    def mark_failed(self, event_id, locked_by, error_code, error_message, *, retryable=True):
        return super().mark_failed(event_id, locked_by, error_code, error_message,
                                   retryable=False)


class _IgnoresOrder(OutboxRepository):
    """Broken on purpose: an "ordered" claim that ignores the head rule."""

    def claim_batch(self, locked_by, limit=100, *, ordered=False):
        return super().claim_batch(locked_by, limit)


class _LyingRenewal(OutboxRepository):
    """Broken on purpose: extend_locks reports every claim renewed and renews none."""

    def extend_locks(self, event_ids, locked_by):
        return len(set(event_ids))


class _UnfencedRenewal(OutboxRepository):
    """Broken on purpose: extend_locks renews claims whoever holds them."""

    def extend_locks(self, event_ids, locked_by):
        ids = sorted(set(event_ids))
        now = self._now()
        return self.database.execute_sql(
            f"UPDATE outbox_event SET locked_at = %s WHERE id IN ({', '.join(['%s'] * len(ids))})"
            " AND status = 'processing'", (now, *ids)).rowcount if ids else 0


@pytest.mark.parametrize("broken,scenario,words", [
    (_NoFencing, "fencing", "stale calls were accepted"),
    (_NoFencingMany, "fencing", "stale calls were accepted"),
    (_UnfencedRenewal, "fencing", "stale calls were accepted"),
    (_ForgetsRetries, "retry", "statuses"),
    (_LyingRenewal, "lease", "renewed claims were taken over"),
])
def test_a_broken_repository_breaks_the_invariants(suite_url, broken, scenario, words):
    suite = ContentionSuite(suite_url, workers=4, events=200, batch_size=10,
                            repository_factory=broken)
    [result] = suite.run([scenario])
    assert not result.ok
    assert any(words in v for v in result.violations), result.violations
    assert "BROKEN" in format_table([result])


@pytest.mark.parametrize("newest_first", [False, True])
def test_a_claim_that_breaks_aggregate_order_breaks_the_ordered_scenario(
        suite_url, monkeypatch, newest_first):
    if newest_first:  # one event per aggregate, but its newest unpublished one
        # The statements of the server's family (outbox_lite._families.mysql_sql is MySQL's).
        sql = importlib.import_module(f"outbox_lite._families.{FAMILY.name}_sql")
        monkeypatch.setattr(sql, "HEADS", sql.HEADS.replace("o.id LIMIT 1", "o.id DESC LIMIT 1"))
        broken, expected = OutboxRepository, [
            "reached the sink before an older one of their aggregate",
            "behind a dead letter were claimed"]
    else:  # a batch of 50 over 20 interleaved aggregates holds some of them twice
        broken, expected = _IgnoresOrder, [
            "claims found their aggregate already in flight",
            "behind a dead letter were claimed"]
    suite = ContentionSuite(suite_url, workers=4, events=200, batch_size=50,
                            repository_factory=broken)
    [result] = suite.run(["ordered"])
    for words in expected:
        assert any(words in v for v in result.violations), result.violations


def test_cli_prints_json_and_exits_zero(capsys):
    name = f"{TEST_URL.name}_cli_suite_{os.getpid()}"  # the suite runs in <name>_contention
    url = f"{FAMILY.SCHEME}://{TEST_URL.user}@{TEST_URL.host}:{TEST_URL.port}/{name}"
    code = main(["contention", "--database-url", url, "--scenario", "batch",
                 "--scenario", "dedupe", "--workers", "3", "--events", "30", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads(out)
    assert doc["ok"] is True
    assert [s["scenario"] for s in doc["scenarios"]] == ["batch", "dedupe"]
    assert all(s["ok"] and s["violations"] == [] for s in doc["scenarios"])


def test_cli_refuses_bad_sizes():
    with pytest.raises(SystemExit) as info:
        main(["contention", "--workers", "0"])
    assert info.value.code == 2


def _tables(url):
    database = url.database()
    try:
        return FAMILY.tables(database)
    finally:
        database.close()


def test_an_existing_database_is_refused_and_left_alone(suite_url):
    from outbox_lite._families.url import DatabaseExistsError
    suite_url.create_database()
    suite_url.database().execute_sql("CREATE TABLE precious (id INT PRIMARY KEY)")
    with pytest.raises(DatabaseExistsError, match=suite_url.name):
        ContentionSuite(suite_url, workers=2, events=10).run(["batch"])
    with pytest.raises(DatabaseExistsError):
        ContentionSuite(suite_url, workers=2, events=10, keep=True).run(["batch"])
    assert _tables(suite_url) == ["precious"]  # not dropped, not touched


def test_force_replaces_an_existing_database(suite_url):
    suite_url.create_database()
    suite_url.database().execute_sql("CREATE TABLE precious (id INT PRIMARY KEY)")
    [result] = ContentionSuite(suite_url, workers=2, events=10, keep=True,
                               force=True).run(["batch"])
    assert result.ok
    assert "precious" not in _tables(suite_url) and "outbox_event" in _tables(suite_url)


def test_cli_refuses_an_existing_contention_database_in_one_line(capsys):
    name = f"{TEST_URL.name}_cli_exists_{os.getpid()}"
    target = TEST_URL.with_name(f"{name}_contention")
    target.drop_database()
    target.create_database()
    try:
        target.database().execute_sql("CREATE TABLE precious (id INT PRIMARY KEY)")
        url = TEST_URL.with_name(name).secret_text()
        args = ["contention", "--database-url", url, "--scenario", "batch", "--workers", "2",
                "--events", "10", "--json"]
        assert main(args) == 1
        err = capsys.readouterr().err
        assert err.strip() == (
            f"outbox-lite contention: error: database {target.name} exists already and the suite would "
            "replace it: drop it yourself, or pass --force to let the suite drop and "
            f"re-create it; on {target.location}")
        assert _tables(target) == ["precious"]
        assert main([*args, "--force"]) == 0
        assert json.loads(capsys.readouterr().out)["ok"] is True
        assert not target.exists()  # the run's own database, dropped after the run
    finally:
        target.drop_database()
