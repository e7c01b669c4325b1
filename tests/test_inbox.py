"""The inbox (SPEC §7): accept in the caller's transaction, bad input before any SQL, purge in
autocommit, the table its migration makes. Locking and races: test_inbox_locks.py."""

from __future__ import annotations

import datetime as dt
import os
import threading
import time

import peewee as pw
import pytest

from outbox_lite import (
    Inbox,
    InvalidEventError,
    LockConflictError,
    OutboxError,
    TransactionRequiredError,
)
from outbox_lite import inbox as inbox_module
from outbox_lite import migrate as schema
from outbox_lite.inbox import MAX_CONSUMER_LENGTH, MAX_MESSAGE_ID_LENGTH

from _helpers import (FAMILY, OracleDatabase, T0, TEST_URL, capture_sql, migrated_database,
                      new_event)

EFFECT = (f"CREATE TABLE effect ({FAMILY.SERIAL_ID},"
          f" message_id VARCHAR(704) {FAMILY.EXACT_TEXT} NOT NULL)")


@pytest.fixture
def inbox(db, clock):
    db.execute_sql(EFFECT)
    return Inbox(db, "billing", clock=clock)


def _records(fetch, consumer=None):
    where, params = ("", ()) if consumer is None else (" WHERE consumer = %s", (consumer,))
    return fetch("SELECT consumer, message_id, received_at FROM inbox_message" + where
                 + " ORDER BY consumer, message_id", *params)


def handle(db, inbox, message_id, *, fail=False):
    """The consumer's pattern: accept, then its own write, in one transaction."""
    with db.atomic():
        if not inbox.accept(message_id):
            return False
        db.execute_sql("INSERT INTO effect (message_id) VALUES (%s)", (message_id,))
        if fail:
            raise RuntimeError("the consumer failed after its writes")
    return True


# ---------------------------------------------------------------------------
# accept
# ---------------------------------------------------------------------------

def test_the_first_delivery_is_accepted_and_a_redelivery_changes_nothing(db, inbox, fetch,
                                                                        clock):
    assert handle(db, inbox, "outbox-order%3A1") is True
    first = _records(fetch)
    assert first == [{"consumer": "billing", "message_id": "outbox-order%3A1",
                      "received_at": T0.replace(tzinfo=None)}]
    clock.advance(hours=1)
    assert handle(db, inbox, "outbox-order%3A1") is False
    assert _records(fetch) == first  # received_at is the first delivery's
    assert fetch("SELECT message_id FROM effect") == [{"message_id": "outbox-order%3A1"}]


def test_the_record_commits_with_the_callers_transaction_and_not_before(db, inbox, fetch):
    with db.atomic():
        assert inbox.accept("m-1") is True
        assert _records(fetch) == []  # another connection sees nothing yet
    assert [r["message_id"] for r in _records(fetch)] == ["m-1"]


def test_the_record_rolls_back_with_the_callers_transaction(db, inbox, fetch):
    with pytest.raises(RuntimeError):
        handle(db, inbox, "m-1", fail=True)
    assert _records(fetch) == [] and fetch("SELECT * FROM effect") == []
    assert handle(db, inbox, "m-1") is True  # the retry is a first delivery
    assert fetch("SELECT message_id FROM effect") == [{"message_id": "m-1"}]


def test_after_false_the_callers_transaction_goes_on_and_commits_its_writes(db, inbox, fetch):
    handle(db, inbox, "m-1")
    with db.atomic():
        db.execute_sql("INSERT INTO effect (message_id) VALUES ('before')")
        assert inbox.accept("m-1") is False
        db.execute_sql("INSERT INTO effect (message_id) VALUES ('after')")
        assert inbox.accept("m-2") is True
    assert [r["message_id"] for r in fetch("SELECT message_id FROM effect ORDER BY id")] == [
        "m-1", "before", "after"]
    assert [r["message_id"] for r in _records(fetch)] == ["m-1", "m-2"]


def test_the_same_id_twice_in_one_transaction_is_true_then_false(db, inbox, fetch):
    with db.atomic():
        assert inbox.accept("m-1") is True
        assert inbox.accept("m-1") is False
    assert len(_records(fetch)) == 1


def test_a_savepoint_that_rolls_back_takes_its_record_with_it(db, inbox, fetch):
    with db.atomic():
        assert inbox.accept("kept") is True
        with pytest.raises(RuntimeError):
            with db.atomic():  # a savepoint of the caller's
                assert inbox.accept("undone") is True
                raise RuntimeError
        assert inbox.accept("undone") is True
    assert [r["message_id"] for r in _records(fetch)] == ["kept", "undone"]


def test_each_consumer_handles_a_message_once(db, inbox, fetch):
    shipping = Inbox(db, "shipping")
    with db.atomic():
        assert inbox.accept("m-1") is True
        assert shipping.accept("m-1") is True
    with db.atomic():
        assert inbox.accept("m-1") is False
        assert shipping.accept("m-1") is False
    assert [(r["consumer"], r["message_id"]) for r in _records(fetch)] == [
        ("billing", "m-1"), ("shipping", "m-1")]


def test_ids_compare_exactly_case_accents_and_4_byte_characters(db, inbox, fetch):
    ids = ["Msg", "msg", "MSG", "caf\u00e9", "cafe\u0301", "\U0001F600", "\U0001F601", "ß", "ss"]
    with db.atomic():
        assert [inbox.accept(i) for i in ids] == [True] * len(ids)
    with db.atomic():
        assert [inbox.accept(i) for i in ids] == [False] * len(ids)
    assert sorted(r["message_id"] for r in _records(fetch)) == sorted(ids)


def test_the_longest_id_and_consumer_are_stored_whole_even_without_strict_mode(db, fetch):
    consumer = "\U0001F600" * MAX_CONSUMER_LENGTH       # 4 bytes a character: the worst case
    message_id = "\U0001F4E8" * MAX_MESSAGE_ID_LENGTH
    if FAMILY.name == "mysql":  # a server that would truncate silently (PostgreSQL never does)
        db.execute_sql("SET SESSION sql_mode = ''")
    else:  # PostgreSQL's btree entry holds 2,704 bytes: a 3,072-byte key is refused before
        # any SQL (the server would abort the caller's transaction); the longest ASCII fits.
        with capture_sql(db) as statements, pytest.raises(InvalidEventError, match="2688"):
            with db.atomic():
                Inbox(db, consumer).accept(message_id)
        assert not [s for s, _ in statements if "inbox_message" in s]
        assert _records(fetch) == []
        consumer, message_id = "c" * MAX_CONSUMER_LENGTH, "m" * MAX_MESSAGE_ID_LENGTH
    inbox = Inbox(db, consumer)
    with db.atomic():
        assert inbox.accept(message_id) is True
        assert inbox.accept(message_id) is False
    [row] = _records(fetch)
    assert (row["consumer"], row["message_id"]) == (consumer, message_id)
    with capture_sql(db) as statements, pytest.raises(InvalidEventError, match="704"):
        with db.atomic():
            inbox.accept(message_id + "x")
    assert not [s for s, _ in statements if "inbox_message" in s]


def test_received_at_is_the_injected_clocks_instant_in_utc(db, fetch):
    tokyo = dt.timezone(dt.timedelta(hours=9))
    inbox = Inbox(db, "c", clock=lambda: dt.datetime(2026, 3, 1, 9, 0, 0, 123456, tzinfo=tokyo))
    with db.atomic():
        inbox.accept("m")
    assert _records(fetch)[0]["received_at"] == dt.datetime(2026, 3, 1, 0, 0, 0, 123456)


def test_accept_outside_a_transaction_raises_before_any_sql(db, inbox, fetch):
    with capture_sql(db) as statements:
        with pytest.raises(TransactionRequiredError, match="atomic"):
            inbox.accept("m-1")
        with pytest.raises(TransactionRequiredError):
            inbox.accept(None)  # the transaction is checked first, as the repository does
    assert statements == [] and _records(fetch) == []


def test_no_method_begins_commits_or_rolls_back_anything(db, inbox, clock):
    """The server's own session counters say so on MySQL and MariaDB; PostgreSQL keeps none
    per session, so there the statements the driver was handed are the proof."""
    with db.atomic():
        inbox.accept("m-1")
    clock.advance(days=2)
    before = FAMILY.transaction_counters(db)
    with capture_sql(db) as statements:
        with db.atomic():
            inbox.accept("m-1")
            inbox.accept("m-2")
        assert inbox.purge(dt.timedelta(days=1)) == 1
        inbox_module.count_older_than(db, 60, clock=clock)
    after = FAMILY.transaction_counters(db)
    if after is not None:
        assert {k: after[k] - before[k] for k in after} == {
            "Com_begin": 1, "Com_commit": 1, "Com_rollback": 0, "Com_savepoint": 0,
            "Com_rollback_to_savepoint": 0, "Com_release_savepoint": 0}  # the caller's own
    verbs = [s.split()[0].upper() for s, _ in statements]
    assert [v for v in verbs if v in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT")] in (
        ["BEGIN", "COMMIT"], ["BEGIN"])  # the caller's atomic() (Peewee 3 commits natively)


BAD_IDS = [
    ("", "must not be empty"), ("   ", "must not be empty"),
    (" m", "white space"), ("m ", "white space"), ("m\t", "white space"),
    ("m\x00n", "printable"), ("m\nn", "printable"), ("m\u200bn", "printable"),
    ("m\ud800", "surrogates"), ("x" * (MAX_MESSAGE_ID_LENGTH + 1), "limit is 704"),
    (None, "must be a str, not NoneType"), (42, "must be a str, not int"),
    (b"m-1", "must be a str, not bytes"), (["m"], "must be a str, not list"),
]


@pytest.fixture(scope="module")
def shared_db():
    """One migrated database for the many bad-input cases, which must leave it empty."""
    with migrated_database(TEST_URL.with_name(f"{TEST_URL.name}_{os.getpid()}_inbox_input")
                           ) as database:
        yield database


@pytest.mark.parametrize("message_id,words", BAD_IDS)
def test_a_bad_message_id_is_refused_before_any_sql(shared_db, message_id, words):
    inbox = Inbox(shared_db, "c")
    with shared_db.atomic() as txn:
        with capture_sql(shared_db) as statements:
            with pytest.raises(InvalidEventError, match=words) as info:
                inbox.accept(message_id)
        assert isinstance(info.value, ValueError)  # ordinary handlers catch it too
        assert statements == []
        assert inbox.accept("still-usable") is True  # the transaction goes on
        assert [tuple(row) for row in shared_db.execute_sql(
            "SELECT message_id FROM inbox_message").fetchall()] == [("still-usable",)]
        txn.rollback()


@pytest.mark.parametrize("consumer,words", [
    *[(value, words) for value, words in BAD_IDS if value is not None and value != 42
      and not (isinstance(value, str) and len(value) > 100)],
    ("c" * (MAX_CONSUMER_LENGTH + 1), "limit is 64"), (None, "NoneType"), (7, "int")])
def test_a_bad_consumer_is_refused_when_the_inbox_is_made(shared_db, consumer, words):
    with capture_sql(shared_db) as statements:
        with pytest.raises(InvalidEventError, match=words):
            Inbox(shared_db, consumer)
    assert statements == []


def test_the_database_must_be_mysql_with_utf8mb4_and_the_clock_aware(db, db_url):
    with pytest.raises(TypeError, match="MySQLDatabase"):
        Inbox(OracleDatabase("x"), "c")
    if FAMILY.name == "mysql":  # the charset is the connection's: refused before connecting
        utf8 = db_url.database(charset="utf8")
        with pytest.raises(ValueError, match="utf8mb4"):
            Inbox(utf8, "c")
        assert utf8.is_closed()
    else:  # PostgreSQL: the encodings are the session's, asked with its first statement
        latin1 = db_url.database(options="-c client_encoding=LATIN1")
        inbox = Inbox(latin1, "c")
        with pytest.raises(ValueError, match="UTF8"):
            with latin1.atomic():
                inbox.accept("m")
        latin1.close()
    with pytest.raises(InvalidEventError, match="timezone-aware"):
        Inbox(db, "c", clock=lambda: dt.datetime(2026, 1, 1))
    with pytest.raises(TypeError, match="clock"):
        Inbox(db, "c", clock="now")
    assert repr(Inbox(db, "billing")) == "<Inbox consumer='billing'>"


def test_a_conflict_with_a_locked_record_is_a_lock_conflict_error(db, db_url, inbox, fetch):
    other = db_url.database()
    other_inbox = Inbox(other, "billing")
    with other.atomic():
        assert other_inbox.accept("m-1") is True  # held open by this other transaction
        FAMILY.limit_lock_waits(db, 1)
        with pytest.raises(LockConflictError) as info:
            with db.atomic():
                inbox.accept("m-1")
        assert info.value.errno == FAMILY.LOCK_WAIT and info.value.retryable
    other.close()
    assert [r["message_id"] for r in _records(fetch)] == ["m-1"]


#: How a consumer bounds its wait for a racing delivery, as docs/guides/consuming.md says:
#: PostgreSQL's lock_timeout for this transaction only; MySQL's and MariaDB's
#: innodb_lock_wait_timeout for the session (it has no per-transaction form).
BOUND_THE_WAIT = {"postgresql": "SET LOCAL lock_timeout = '1s'",
                  "mysql": "SET SESSION innodb_lock_wait_timeout = 1"}
#: What each server answers a wait past that bound: SQLSTATE 55P03 (lock_not_available),
#: MySQL's and MariaDB's error 1205 (lock wait timeout exceeded).
WAIT_TIMED_OUT = {"postgresql": "55P03", "mysql": 1205}


def _race_one_id(db_url, bound: bool, hold: float) -> tuple[float, object]:
    """A delivery accepted in one session and left uncommitted for ``hold`` seconds (or,
    ``bound``, until the other is done), while a second session accepts the same id, its wait
    bounded by BOUND_THE_WAIT or not: how long the second waited and what it got (accept's
    answer or the error). Threads released together by a Barrier; asserted by the caller."""
    first, second = db_url.database(), db_url.database()
    started, second_done = threading.Barrier(2), threading.Event()
    got: dict[str, object] = {}

    def holder() -> None:
        try:
            with first.atomic():
                got["first"] = Inbox(first, "billing").accept("m-race")
                started.wait(10)
                second_done.wait(hold)
        except BaseException as exc:  # noqa: BLE001 - reported in the main thread
            got["first"] = exc

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        started.wait(10)  # the first's accept has returned: its record is in, uncommitted
        began = time.monotonic()
        try:
            with second.atomic():
                if bound:
                    second.execute_sql(BOUND_THE_WAIT[FAMILY.name])
                got["second"] = Inbox(second, "billing").accept("m-race")
        except LockConflictError as exc:
            got["second"] = exc
        waited = time.monotonic() - began
    finally:
        second_done.set()
        thread.join(30)
        first.close()
        second.close()
    assert got["first"] is True, got
    return waited, got["second"]


def test_a_racing_accept_waits_as_long_as_the_other_transaction_stays_open(db_url, fetch):
    """Issue 37, on every server: unbounded (the server's default, 50 s on MySQL and MariaDB,
    none on PostgreSQL) the second delivery waits exactly while the first transaction is
    open, then gets False once it commits."""
    waited, second = _race_one_id(db_url, bound=False, hold=1.5)
    assert second is False
    assert 1.0 <= waited < 10, waited
    assert [r["message_id"] for r in _records(fetch)] == ["m-race"]


def test_a_bounded_wait_for_a_racing_accept_ends_in_a_lock_conflict(db_url, fetch):
    """Issue 37: with lock_timeout (PostgreSQL) or innodb_lock_wait_timeout (MySQL, MariaDB)
    at 1 s, the second delivery gets LockConflictError after about 1 s while the first still
    holds its record: 55P03 on PostgreSQL, 1205 on MySQL and MariaDB; the first commits."""
    waited, second = _race_one_id(db_url, bound=True, hold=30)
    assert isinstance(second, LockConflictError), second
    assert second.errno == WAIT_TIMED_OUT[FAMILY.name] and second.retryable
    assert 0.8 <= waited < 5, waited
    assert [r["message_id"] for r in _records(fetch)] == ["m-race"]


# ---------------------------------------------------------------------------
# purge
# ---------------------------------------------------------------------------

def _seed(db, clock, consumer, ids, *, step=None):
    inbox = Inbox(db, consumer, clock=clock)
    with db.atomic():
        for message_id in ids:
            inbox.accept(message_id)
            if step:
                clock.advance(seconds=step)
    return inbox


def test_purge_deletes_this_consumers_old_records_only(db, inbox, clock, fetch):
    _seed(db, clock, "billing", [f"old-{n}" for n in range(5)])
    _seed(db, clock, "shipping", ["old-0"])
    clock.advance(days=7)
    _seed(db, clock, "billing", ["new-0"])
    clock.advance(hours=1)
    assert inbox.purge(dt.timedelta(days=7)) == 5
    assert [(r["consumer"], r["message_id"]) for r in _records(fetch)] == [
        ("billing", "new-0"), ("shipping", "old-0")]
    assert inbox.purge(dt.timedelta(days=7)) == 0
    assert inbox.purge(1800) == 1  # seconds, as the repository's durations
    assert [r["consumer"] for r in _records(fetch)] == ["shipping"]


def test_purge_of_every_consumer_in_batches_each_delete_in_autocommit(db, clock, fetch):
    for consumer in ("a", "b", "c"):
        _seed(db, clock, consumer, [f"m-{n:02d}" for n in range(7)], step=1)
    clock.advance(days=2)
    _seed(db, clock, "a", ["young"])
    in_transaction = []
    with capture_sql(db, before=lambda sql, _: in_transaction.append(db.in_transaction())
                     ) as statements:
        deleted = inbox_module.purge(db, dt.timedelta(days=1), batch_size=4, clock=clock)
    assert deleted == 21
    assert [(r["consumer"], r["message_id"]) for r in _records(fetch)] == [("a", "young")]
    selects = [s for s, _ in statements if s.startswith("SELECT")]
    deletes = [s for s, _ in statements if s.startswith("DELETE")]
    assert len(selects) == 6  # pages of 4 over 21 rows, the last one short
    # MySQL and MariaDB: each DELETE names the primary key, so it locks those rows and no
    # gap; PostgreSQL has no index hints (and no gap locks): none is sent.
    assert len(deletes) >= 6 and all(
        ("FORCE INDEX (PRIMARY)" in s) == FAMILY.GAP_LOCKS for s in deletes)
    assert not any(in_transaction)  # each statement is its own autocommit transaction


def test_each_batch_commits_alone_so_purge_holds_no_lock_across_batches(db, db_url, clock,
                                                                       fetch):
    _seed(db, clock, "c", [f"m-{n}" for n in range(9)], step=1)
    clock.advance(days=2)
    consumer = db_url.database()
    FAMILY.limit_lock_waits(consumer, 1)
    redelivered = []

    def between_batches(sql, params):
        if sql.startswith("SELECT") and params and len(params) == 3:  # a page after the first
            gone = [r[0] for r in consumer.execute_sql(
                "SELECT message_id FROM (SELECT 'm-0' AS message_id UNION SELECT 'm-3') AS t"
                " WHERE message_id NOT IN (SELECT message_id FROM inbox_message)").fetchall()]
            for message_id in gone:  # deleted by an earlier batch: its locks must be gone
                with consumer.atomic():
                    redelivered.append((message_id, Inbox(consumer, "c").accept(message_id)))

    with capture_sql(db, before=between_batches):
        assert inbox_module.purge(db, 86400, batch_size=3, clock=clock) == 9
    consumer.close()
    assert ("m-0", True) in redelivered and ("m-3", True) in redelivered  # no lock wait
    assert sorted(r["message_id"] for r in _records(fetch)) == ["m-0", "m-3"]


def test_purge_ends_when_more_records_than_a_batch_share_one_instant(db, clock, fetch):
    _seed(db, clock, "c", [f"m-{n:03d}" for n in range(25)])  # the clock stands still
    clock.advance(hours=2)
    with capture_sql(db) as statements:
        assert inbox_module.purge(db, 3600, batch_size=10, clock=clock) == 25
    assert _records(fetch) == []
    assert len([s for s, _ in statements if s.startswith("SELECT")]) == 3


def test_a_dry_run_count_matches_what_purge_deletes(db, clock, fetch):
    _seed(db, clock, "a", ["1", "2", "3"])
    _seed(db, clock, "b", ["1"])
    clock.advance(days=3)
    _seed(db, clock, "a", ["4"])
    assert inbox_module.count_older_than(db, 86400, clock=clock) == 4
    assert inbox_module.count_older_than(db, 86400, consumer="a", clock=clock) == 3
    assert len(_records(fetch)) == 5  # counting deleted nothing
    assert inbox_module.purge(db, 86400, consumer="a", clock=clock) == 3
    assert inbox_module.purge(db, 86400, clock=clock) == 1


def test_purge_refuses_to_run_inside_a_transaction(db, inbox, clock, fetch):
    _seed(db, clock, "billing", ["m"])
    clock.advance(days=2)
    with db.atomic():
        with capture_sql(db) as statements, pytest.raises(OutboxError, match="autocommit"):
            inbox.purge(86400)
    assert statements == [] and len(_records(fetch)) == 1


@pytest.mark.parametrize("older_than", [0, -1, float("nan"), float("inf"), True, "7d", None,
                                        dt.timedelta(0), dt.timedelta(days=-1),
                                        dt.timedelta(days=36_501)])
def test_a_bad_age_is_refused_before_any_sql(shared_db, older_than):
    inbox = Inbox(shared_db, "c")
    with capture_sql(shared_db) as statements:
        with pytest.raises(InvalidEventError, match="older_than"):
            inbox.purge(older_than)
        with pytest.raises(InvalidEventError, match="older_than"):
            inbox_module.count_older_than(shared_db, older_than)
    assert statements == []


def test_bad_purge_arguments_are_refused_before_any_sql(db, inbox):
    with capture_sql(db) as statements:
        for batch_size in (0, -1, 10_001, 1.5, True):
            with pytest.raises(InvalidEventError, match="batch_size"):
                inbox.purge(60, batch_size=batch_size)
        with pytest.raises(InvalidEventError, match="consumer"):
            inbox_module.purge(db, 60, consumer="")
        with pytest.raises(InvalidEventError, match="year 1000"):
            Inbox(db, "c", clock=lambda: dt.datetime(1000, 1, 2, tzinfo=dt.timezone.utc)
                  ).purge(dt.timedelta(days=3))
    assert statements == []


def test_purge_waits_only_for_a_consumer_holding_one_of_the_records_it_deletes(
        db, db_url, clock, fetch):
    _seed(db, clock, "c", ["held", "free"])
    clock.advance(days=2)
    holder = db_url.database()
    with holder.atomic():
        assert Inbox(holder, "c").accept("held") is False  # a redelivery, still open
        FAMILY.limit_lock_waits(db, 1)
        if FAMILY.name == "mysql":  # InnoDB: the refused INSERT holds a lock on the record
            with pytest.raises(LockConflictError):
                inbox_module.purge(db, 86400, clock=clock)
        else:  # PostgreSQL: ON CONFLICT DO NOTHING locks nothing; nobody waits
            assert inbox_module.purge(db, 86400, clock=clock) == 2
    holder.close()
    if FAMILY.name == "mysql":
        assert [r["message_id"] for r in _records(fetch)] == ["free", "held"]  # rolled back
        assert inbox_module.purge(db, 86400, clock=clock) == 2  # run again: done
    assert _records(fetch) == []


# ---------------------------------------------------------------------------
# The table and its migration
# ---------------------------------------------------------------------------

def test_the_table_is_what_the_code_expects(fetch):
    """MySQL and MariaDB as information_schema shows it (aliased lower-case names: it answers
    in upper case on MySQL); PostgreSQL as its catalog does (tests/_helpers.py), the ids
    compared exactly by ``COLLATE "C"``, the instant a UTC ``timestamp(6)``."""
    if FAMILY.name == "mysql":
        columns = fetch(
            "SELECT column_name AS name, column_type AS type, is_nullable AS nullable,"
            " character_set_name AS charset, collation_name AS coll"
            " FROM information_schema.columns"
            " WHERE table_schema = DATABASE() AND table_name = 'inbox_message'"
            " ORDER BY ordinal_position")
        assert [(c["name"], c["type"].lower(), c["nullable"], c["charset"], c["coll"])
                for c in columns] == [
            ("consumer", f"varchar({MAX_CONSUMER_LENGTH})", "NO", "utf8mb4", "utf8mb4_bin"),
            ("message_id", f"varchar({MAX_MESSAGE_ID_LENGTH})", "NO", "utf8mb4", "utf8mb4_bin"),
            ("received_at", "datetime(6)", "NO", None, None)]
        assert fetch("SELECT engine AS engine, row_format AS row_format"
                     " FROM information_schema.tables"
                     " WHERE table_schema = DATABASE() AND table_name = 'inbox_message'") == [
            {"engine": "InnoDB", "row_format": "Dynamic"}]
    else:
        assert [(c["name"], c["type"], c["nullable"], c["coll"])
                for c in FAMILY.columns(fetch, "inbox_message")] == [
            ("consumer", f"character varying({MAX_CONSUMER_LENGTH})", "NO", "C"),
            ("message_id", f"character varying({MAX_MESSAGE_ID_LENGTH})", "NO", "C"),
            ("received_at", "timestamp(6) without time zone", "NO", None)]
    assert FAMILY.indexes(fetch, "inbox_message") == {
        FAMILY.primary_key("inbox_message"): (True, ["consumer", "message_id"]),
        "ix_inbox_message_received_at": (False, ["received_at"])}
    assert FAMILY.foreign_keys(fetch) == []
    assert FAMILY.triggers(fetch) == []


def test_the_migration_rolls_back_and_applies_again(db_url, fetch):
    database = db_url.database()
    inbox = Inbox(database, "c")
    with database.atomic():
        inbox.accept("m")
    assert schema.rollback(database) == "006_headers_and_expiry"
    assert schema.rollback(database) == "005_exact_aggregate_ids"
    assert schema.rollback(database) == "004_create_inbox_message"
    tables = FAMILY.tables(database)
    assert "inbox_message" not in tables
    assert "outbox_event" in tables  # the outbox is untouched
    with pytest.raises(pw.ProgrammingError, match="inbox_message"):
        with database.atomic():
            inbox.accept("m")
    assert schema.migrate(database) == ["004_create_inbox_message", "005_exact_aggregate_ids",
                                        "006_headers_and_expiry"]
    with database.atomic():
        assert inbox.accept("m") is True  # an empty table again
    database.close()


def test_a_service_that_never_uses_the_inbox_pays_only_an_empty_table(db, repo, clock, fetch):
    with capture_sql(db) as statements:
        event = new_event(repo)
        with db.atomic():
            repo.claim_batch("w")
        repo.mark_published(event.id, "w")
        clock.advance(days=30)
        repo.purge_published(dt.timedelta(days=7))
        repo.stats()
    assert statements and not [s for s, _ in statements if "inbox" in s.lower()]
    assert fetch("SELECT COUNT(*) AS n FROM inbox_message") == [{"n": 0}]
