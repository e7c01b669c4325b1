"""create_in_transaction: one transaction with the business row, dedupe, bad input."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import threading
import time

import pytest

from outbox_lite import (
    DuplicateEventError,
    InvalidEventError,
    LockConflictError,
    OutboxRepository,
    OutboxStatus,
    PayloadError,
    TransactionRequiredError,
)

from _helpers import FAMILY, T0, capture_sql, run_threads

EVENT = dict(event_type="job.created", aggregate_type="ai_job", aggregate_id="42",
             payload={"job_id": 42, "model": "small", "tags": ["a", "b"]})


def test_job_row_and_event_commit_together(db, repo, fetch):
    with db.atomic():
        job_id = FAMILY.insert_id(db, "INSERT INTO job (name) VALUES ('resize')")
        event = repo.create_in_transaction(**{**EVENT, "aggregate_id": str(job_id)})
        # Not visible to anyone else before the caller commits.
        assert fetch("SELECT id FROM outbox_event") == []
    assert fetch("SELECT name FROM job") == [{"name": "resize"}]
    rows = fetch("SELECT * FROM outbox_event")
    assert len(rows) == 1
    row = rows[0]
    assert row["id"] == event.id
    assert row["aggregate_id"] == str(job_id)
    assert json.loads(row["payload"]) == EVENT["payload"]
    assert row["status"] == "pending" and row["attempt_count"] == 0
    assert row["available_at"] == row["created_at"] == row["updated_at"] == T0.replace(tzinfo=None)
    assert row["locked_at"] is None and row["locked_by"] is None and row["published_at"] is None
    assert len(row["dedupe_key"]) == 32  # generated


def test_rollback_leaves_neither_the_job_nor_the_event(db, repo, fetch):
    with pytest.raises(RuntimeError):
        with db.atomic():
            db.execute_sql("INSERT INTO job (name) VALUES ('resize')")
            repo.create_in_transaction(**EVENT)
            raise RuntimeError("the service failed after writing")
    assert fetch("SELECT * FROM job") == []
    assert fetch("SELECT * FROM outbox_event") == []


def test_returned_event_matches_the_stored_row(db, repo):
    with db.atomic():
        event = repo.create_in_transaction(**EVENT, dedupe_key="job-42-created")
    stored = repo.model.get_by_id(event.id)
    for field in repo.model._meta.sorted_fields:
        assert getattr(stored, field.name) == getattr(event, field.name), field.name
    assert stored.status == OutboxStatus.PENDING
    assert stored.available_at.tzinfo == dt.timezone.utc


def test_outside_a_transaction_it_is_refused_and_nothing_is_written(db, repo, fetch):
    with pytest.raises(TransactionRequiredError):
        repo.create_in_transaction(**EVENT)
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


def test_duplicate_dedupe_key_raises_and_the_transaction_stays_usable(db, repo, fetch):
    with db.atomic():
        repo.create_in_transaction(**EVENT, dedupe_key="job-42")
    with db.atomic():
        db.execute_sql("INSERT INTO job (name) VALUES ('after')")
        with pytest.raises(DuplicateEventError) as info:
            repo.create_in_transaction(**EVENT, dedupe_key="job-42")
        assert info.value.dedupe_key == "job-42"
        repo.create_in_transaction(**EVENT, dedupe_key="job-43")
    assert sorted(r["dedupe_key"] for r in fetch("SELECT dedupe_key FROM outbox_event")) == [
        "job-42", "job-43"]
    assert fetch("SELECT name FROM job") == [{"name": "after"}]


def _other_writer(db_url):
    """A second writer on a connection of its own, that waits at most a second for a lock."""
    database = db_url.database()
    FAMILY.limit_lock_waits(database, 1)
    return database, OutboxRepository(database)


def test_a_committed_duplicate_is_refused_without_a_lock_that_holds_up_writers(
        db, repo, db_url, fetch, server):
    """At the servers' default REPEATABLE READ refused by a plain read before any INSERT, on
    both servers: there an INSERT refused by the unique key leaves a lock that holds up other
    writers until the caller's transaction ends (on MySQL a gap lock at the end of the primary
    key that blocks every writer; on MariaDB the gap just before the duplicate's key,
    tests/test_write_round_trip.py). The other writer goes on. PostgreSQL (READ COMMITTED by
    default) sends one INSERT … ON CONFLICT DO NOTHING, refused without an error and without a
    lock on anything but the duplicate's own key."""
    with db.atomic():
        repo.create_in_transaction(**EVENT, dedupe_key="job-42")
    other, other_repo = _other_writer(db_url)
    with db.atomic(), capture_sql(db) as statements:
        with pytest.raises(DuplicateEventError):
            repo.create_in_transaction(**EVENT, dedupe_key="job-42")
        with other.atomic():  # the caller's transaction is still open
            other_repo.create_in_transaction(**EVENT, dedupe_key="job-43")
    other.close()
    sent = [sql.split()[0] for sql, _ in statements if sql.split()[0] != "BEGIN"]
    assert sent == (["SELECT"] if FAMILY.GAP_LOCKS else [FAMILY.WRITE_WORD]), statements
    assert sorted(r["dedupe_key"] for r in fetch("SELECT dedupe_key FROM outbox_event")) == [
        "job-42", "job-43"]


def test_a_duplicate_from_a_race_holds_up_writers_until_the_refused_transaction_ends(
        db, repo, db_url, fetch):
    """The one case the plain read cannot see: the other transaction had not committed yet.
    The INSERT then waits for it and is refused, and both servers keep a lock (under
    REPEATABLE READ) that holds up other writers' events until the refused transaction ends:
    the README tells callers to end it soon. PostgreSQL has no gap locks: the other writer
    goes on."""
    first = db_url.database()
    first_repo = OutboxRepository(first)
    outcome: list[BaseException] = []
    with first.atomic():
        first_repo.create_in_transaction(**EVENT, dedupe_key="race")

        racer_connection: list[int] = []

        def racer() -> None:
            other, other_repo = _other_writer(db_url)  # connections are per thread
            try:
                racer_connection.append(FAMILY.session_id(db))
                with db.atomic():
                    try:
                        repo.create_in_transaction(**EVENT, dedupe_key="race")
                    except DuplicateEventError as exc:
                        outcome.append(exc)
                        try:  # the refused transaction is still open: may others write?
                            with other.atomic():
                                other_repo.create_in_transaction(**EVENT, dedupe_key="new")
                        except LockConflictError as conflict:
                            outcome.append(conflict)
            except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
                outcome.append(exc)
            finally:
                db.close()
                other.close()

        thread = threading.Thread(target=racer)
        thread.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                racer_connection and FAMILY.waits_for_lock(fetch, racer_connection[0])):
            time.sleep(0.1)  # until the racer's INSERT waits on ours (the table refreshes at 0.1 s)
    thread.join(timeout=30)
    first.close()
    assert not thread.is_alive() and isinstance(outcome[0], DuplicateEventError), outcome
    if FAMILY.GAP_LOCKS:
        assert len(outcome) == 2 and isinstance(outcome[1], LockConflictError), outcome
        assert outcome[1].errno == FAMILY.LOCK_WAIT
        assert [r["dedupe_key"] for r in fetch("SELECT dedupe_key FROM outbox_event")] == [
            "race"]
    else:  # PostgreSQL: the other writer did not wait
        assert len(outcome) == 1, outcome
        assert sorted(r["dedupe_key"] for r in fetch("SELECT dedupe_key FROM outbox_event")) == [
            "new", "race"]


def test_dedupe_keys_are_exact_not_case_folded(db, repo, fetch):
    with db.atomic():
        repo.create_in_transaction(**EVENT, dedupe_key="Job-1")
        repo.create_in_transaction(**EVENT, dedupe_key="job-1")
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 2}]


@pytest.mark.parametrize("round_", range(5))
def test_dedupe_key_raced_by_many_threads_has_exactly_one_winner(db, repo, fetch, round_):
    def insert(i):
        with db.atomic():
            return repo.create_in_transaction(**EVENT, dedupe_key=f"race-{round_}").id

    results, errors = run_threads(8, insert, db)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert len(errors) == 7 and all(isinstance(e, DuplicateEventError) for e in errors), errors
    assert fetch("SELECT id FROM outbox_event WHERE dedupe_key = %s", f"race-{round_}") == [
        {"id": winners[0]}]


def test_available_at_is_converted_to_utc(db, repo, fetch):
    tokyo = dt.timezone(dt.timedelta(hours=9))
    when = dt.datetime(2026, 3, 1, 9, 30, 0, 123456, tzinfo=tokyo)
    with db.atomic():
        event = repo.create_in_transaction(**EVENT, available_at=when)
    assert event.available_at == when
    assert fetch("SELECT available_at FROM outbox_event")[0]["available_at"] == dt.datetime(
        2026, 3, 1, 0, 30, 0, 123456)


BAD_FIELDS = [
    ("event_type", ""), ("event_type", "   "), ("event_type", None), ("event_type", 5),
    ("event_type", "x" * 256), ("aggregate_type", ""), ("aggregate_type", b"bytes"),
    ("aggregate_id", ""), ("aggregate_id", 42), ("aggregate_id", " 42"),
    ("dedupe_key", ""), ("dedupe_key", "key "), ("dedupe_key", "k" * 256),
    ("dedupe_key", "a\x00b"), ("event_type", "bad\ud800"),
    ("available_at", dt.datetime(2026, 1, 1)),  # naive: ambiguous
    ("available_at", "2026-01-01T00:00:00Z"), ("available_at", dt.date(2026, 1, 1)),
    ("available_at", dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc)),
]


@pytest.mark.parametrize("field,value", BAD_FIELDS)
def test_bad_fields_are_refused_before_any_sql(db, repo, fetch, field, value):
    with db.atomic():
        with capture_sql(db) as statements, pytest.raises(InvalidEventError) as info:
            repo.create_in_transaction(**{**EVENT, field: value})
        assert statements == [], "SQL ran before the error"
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


BAD_PAYLOADS = [
    ("a string", "JSON object"), (42, "JSON object"), (None, "JSON object"),
    ({"x": float("nan")}, "non-finite"), ([float("inf")], "non-finite"),
    ({"when": dt.datetime(2026, 1, 1)},
     "$.when is a datetime, which is not JSON: send an ISO 8601 string (value.isoformat())"),
    ({"on": [dt.date(2026, 1, 1)]}, "$.on[0] is a date, which is not JSON: send an ISO 8601"),
    ({"total": decimal.Decimal("19.90")}, "is a Decimal, which is not JSON: send it as a string"),
    ({"s": {1, 2}}, "is a set, which is not JSON: send a list"),
    ({1: "int key"}, "keys must be strings"), ({"x": b"bytes"}, "bytes"),
    ({"blob": "x" * (1024 * 1024)}, "limit"),
]


@pytest.mark.parametrize("payload,words", BAD_PAYLOADS)
def test_bad_payloads_are_refused_and_nothing_is_written(db, repo, fetch, payload, words):
    with db.atomic():
        with pytest.raises(PayloadError) as info:
            repo.create_in_transaction(**{**EVENT, "payload": payload})
    assert words in str(info.value)
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]


def test_payload_nesting_beyond_the_servers_limit_is_refused_before_sql(db, repo, fetch):
    deep: list = []
    node = deep
    for _ in range(40):
        node.append([])
        node = node[0]
    with db.atomic():
        with pytest.raises(PayloadError, match="nested deeper"):
            repo.create_in_transaction(**{**EVENT, "payload": deep})
        ok: list = []
        node = ok
        for _ in range(30):
            node.append([])
            node = node[0]
        repo.create_in_transaction(**{**EVENT, "payload": ok})
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 1}]


def test_payload_limit_is_configurable_and_exact(db, clock):
    from outbox_lite import OutboxRepository
    repo = OutboxRepository(db, clock=clock, max_payload_bytes=20)
    with db.atomic():
        repo.create_in_transaction(**{**EVENT, "payload": {"a": "x" * 12}})  # 20 bytes
        with pytest.raises(PayloadError, match="21 bytes"):
            repo.create_in_transaction(**{**EVENT, "payload": {"a": "x" * 13}})


def test_unicode_payload_round_trips(db, repo):
    payload = {"名前": "ジョブ", "emoji": "🚀", "nested": {"list": [1, 2.5, None, True]}}
    with db.atomic():
        event = repo.create_in_transaction(**{**EVENT, "payload": payload})
    assert repo.model.get_by_id(event.id).payload == payload


def test_returned_event_holds_the_payload_given_and_the_row_its_json(db, repo, fetch, server):
    payload = {"job_id": 7, "sizes": (512, 256)}
    with db.atomic():
        event = repo.create_in_transaction(**{**EVENT, "payload": payload})
    assert event.payload is payload  # as Peewee's Model.create returns what it was given
    stored = fetch("SELECT payload FROM outbox_event WHERE id = %s", event.id)
    # MariaDB keeps the text outbox_lite wrote; MySQL answers an equal value in its own text.
    expected = ('{"job_id":7,"sizes":[512,256]}' if server.keeps_json_text
                else '{"sizes": [512, 256], "job_id": 7}')
    assert stored == [{"payload": expected}]
    assert repo.model.get_by_id(event.id).payload == {"job_id": 7, "sizes": [512, 256]}
