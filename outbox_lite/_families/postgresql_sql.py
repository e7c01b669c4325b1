"""Every statement the library runs on PostgreSQL, with the same names and parameters as the
MySQL family's (:mod:`.mysql_sql`), and the rule each one follows.

* Rows change by primary key only (``WHERE id = ANY(%(ids)s)`` or ``id = %(id)s``), as
  compare-and-set ``UPDATE … WHERE id … AND status = … [AND locked_by = …]``: the row count
  decides (PostgreSQL counts the rows matched, changed or not).
* A statement that changes several rows other sessions may change at the same time (the
  releasers' RELEASE_EXPIRED, a late owner's MARK_PUBLISHED_MANY and EXTEND_LOCKS, the
  operators' REQUEUE_FAILED, DELETE_FAILED and PURGE_PUBLISHED) changes those a subquery has
  locked in id order (``id = ANY(ARRAY(SELECT id … ORDER BY id FOR UPDATE))``: the rows are
  locked as the sort hands them out). In the plan's own order (an index's, or the heap's
  for a bitmap or sequential scan, which updates shuffle) two such statements could lock
  the same rows in opposite orders and deadlock; MySQL's walk the primary key.
* Scans that find candidates are plain reads (a snapshot) and lock nothing; the claim then
  locks the candidates by id with ``FOR UPDATE SKIP LOCKED``. PostgreSQL has no gap locks: a
  locking range read would not block writers, but it would lock every row it passes.
* An UPDATE's assignments all read the row as it was (as MariaDB's SIMULTANEOUS_ASSIGNMENT),
  and the statements are written so that both orders mean the same.
* Instants are ``timestamp(6)`` (without time zone) holding UTC, written as naive UTC values
  and read back unchanged whatever the session's ``TimeZone``; the server's clock is read as
  ``clock_timestamp() AT TIME ZONE 'UTC'``.
* The payload column is ``json`` (its text kept byte for byte); it is read as ``payload::text``
  so that the library, not the driver, decodes it.

A list of ids is one parameter given as a Python list: ``= ANY(%(ids)s)`` (both drivers send a
list as an array).
"""

from __future__ import annotations

import functools

from .contract import Pages, Statement


def _locked_in_id_order(where: str) -> str:
    """``id = ANY(ARRAY(…))``: the rows among ``%(ids)s`` that meet ``where``, locked in id
    order (the rule above: two statements whose plans visit the same rows in opposite orders
    would otherwise deadlock). The array is computed once, before the statement reads a
    row, so the statement then goes by the primary key whatever the table's size (``id IN
    (SELECT …)`` is a join, which on a small table the planner makes with a full scan)."""
    return (f"id = ANY(ARRAY(SELECT id FROM outbox_event WHERE id = ANY(%(ids)s) AND {where}"
            " ORDER BY id FOR UPDATE))")


# -- writing ----------------------------------------------------------------------------

#: An event without the caller's dedupe_key (a random one: no duplicate to meet), and the
#: relays' wake-up in the same statement (SPEC §9): ``pg_notify('outbox_event', '')`` is
#: ``NOTIFY outbox_event``, evaluated for the row inserted, delivered when the caller commits,
#: once per transaction however many events it created (PostgreSQL folds equal
#: notifications), never on a rollback.
INSERT = Statement(
    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
    " status, attempt_count, available_at, created_at, updated_at, headers, expires_at)"
    " VALUES (%(event_type)s, %(aggregate_type)s, %(aggregate_id)s, %(dedupe_key)s,"
    " %(payload)s, 'pending', 0, %(available_at)s, %(created_at)s, %(updated_at)s,"
    " %(headers)s, %(expires_at)s)"
    " RETURNING id, pg_notify('outbox_event', '')::text"
)
#: An event with the caller's dedupe_key: a duplicate is no row (and no notification), never
#: an error (PostgreSQL aborts the whole transaction on a failed statement, and the caller's
#: transaction must stay usable). The conflict target is the dedupe key alone: a conflict on
#: any other unique index is still an error. A duplicate another transaction has inserted and
#: not yet committed makes this wait for it: at READ COMMITTED no row once it commits
#: (DuplicateEventError), a row once it rolls back; at REPEATABLE READ and SERIALIZABLE a
#: duplicate committed after the caller's snapshot is a serialization failure (40001,
#: LockConflictError: retry, and the retry sees the duplicate).
INSERT_UNLESS_TAKEN = Statement(
    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
    " status, attempt_count, available_at, created_at, updated_at, headers, expires_at)"
    " VALUES (%(event_type)s, %(aggregate_type)s, %(aggregate_id)s, %(dedupe_key)s,"
    " %(payload)s, 'pending', 0, %(available_at)s, %(created_at)s, %(updated_at)s,"
    " %(headers)s, %(expires_at)s)"
    " ON CONFLICT (dedupe_key) DO NOTHING RETURNING id, pg_notify('outbox_event', '')::text"
)
#: The channel the relays LISTEN on.
CHANNEL = "outbox_event"

# -- claiming ---------------------------------------------------------------------------

_COLUMNS = ("id, event_type, aggregate_type, aggregate_id, dedupe_key, payload::text,"
            " status, attempt_count, available_at, locked_at, locked_by, published_at,"
            " last_error_code, last_error_message, created_at, updated_at, headers::text,"
            " expires_at")

FIND_DISPATCHABLE = Statement(
    f"SELECT {_COLUMNS} FROM outbox_event"
    " WHERE status = 'pending' AND available_at <= %(now)s"
    " ORDER BY available_at, id LIMIT %(limit)s")

#: The heads of the aggregates that have dispatchable events, for ordered claims: the first
#: ``size`` aggregates by their oldest dispatchable event, then each one's head, its oldest
#: unpublished event: the first entry of the partial index of unpublished events
#: (aggregate_type, aggregate_id, id) WHERE published_at IS NULL, one index read. The
#: aggregates' read goes through the status index alone (it includes the aggregate); unlike
#: MySQL's DISTINCT … LIMIT it reads every dispatchable entry before it picks (PostgreSQL has
#: no loose index scan).
HEADS = Statement(
    "SELECT (SELECT o.id FROM outbox_event AS o"
    " WHERE o.aggregate_type = g.aggregate_type AND o.aggregate_id = g.aggregate_id"
    " AND o.published_at IS NULL ORDER BY o.id LIMIT 1)"
    " FROM (SELECT aggregate_type, aggregate_id FROM outbox_event"
    " WHERE status = 'pending' AND available_at <= %(now)s"
    " GROUP BY aggregate_type, aggregate_id ORDER BY MIN(available_at), MIN(id)"
    " LIMIT %(size)s) AS g"
)
#: The candidates' locking read, by primary key: rows another claimer holds are skipped.
LOCK_CANDIDATES = Statement(
    f"SELECT {_COLUMNS} FROM outbox_event WHERE id = ANY(%(ids)s)"
    " AND status = 'pending' AND available_at <= %(now)s ORDER BY id LIMIT %(limit)s"
    " FOR UPDATE SKIP LOCKED"
)
CLAIM = Statement(
    "UPDATE outbox_event SET status = 'processing', locked_by = %(locked_by)s,"
    " locked_at = %(now)s, attempt_count = attempt_count + 1, updated_at = %(now)s"
    " WHERE id = ANY(%(ids)s)"
)
MARK_PROCESSING = Statement(
    "UPDATE outbox_event SET status = 'processing', locked_by = %(locked_by)s,"
    " locked_at = %(now)s, attempt_count = attempt_count + 1, updated_at = %(now)s"
    " WHERE id = %(id)s AND status = 'pending' AND available_at <= %(now)s"
)

# -- outcomes (each fenced: the event is processing and held by the caller) ----------------

HELD_BY = Statement(
    f"SELECT {_COLUMNS} FROM outbox_event"
    " WHERE status = 'processing' AND locked_by = %(locked_by)s ORDER BY id")
HELD_AMONG = Statement(
    f"SELECT {_COLUMNS} FROM outbox_event"
    " WHERE status = 'processing' AND locked_by = %(locked_by)s AND id = ANY(%(ids)s)"
    " ORDER BY id")
#: Whether a server session (a backend's pid) still runs.
SESSION_ALIVE = Statement(
    "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = %(session)s")
OUTCOME_STATES = Statement(
    "SELECT id, status, locked_by, attempt_count, last_error_code"
    " FROM outbox_event WHERE id = ANY(%(ids)s)")
MARK_PUBLISHED = Statement(
    "UPDATE outbox_event SET status = 'published', published_at = %(now)s,"
    " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"
    " WHERE id = %(id)s AND status = 'processing' AND locked_by = %(locked_by)s"
)
MARK_PUBLISHED_MANY = Statement(
    "UPDATE outbox_event SET status = 'published', published_at = %(now)s,"
    " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"
    " WHERE " + _locked_in_id_order("status = 'processing' AND locked_by = %(locked_by)s")
)
FAILED_FOR_GOOD = Statement(
    "UPDATE outbox_event SET status = 'failed', last_error_code = %(code)s,"
    " last_error_message = %(message)s, locked_by = NULL, locked_at = NULL,"
    " updated_at = %(now)s"
    " WHERE id = %(id)s AND status = 'processing' AND locked_by = %(locked_by)s"
)


@functools.lru_cache(maxsize=64)
def retry_or_fail(steps: int) -> Statement:
    """Back to pending at the instant precomputed for its attempt_count (``retry_1`` …
    ``retry_<steps>``, then ``retry_later``), or failed once attempts are used up."""
    whens = " ".join(f"WHEN {n} THEN %(retry_{n})s::timestamp" for n in range(1, steps + 1))
    return Statement(
        "UPDATE outbox_event SET available_at = CASE WHEN attempt_count < %(max_attempts)s"
        f" THEN CASE attempt_count {whens} ELSE %(retry_later)s::timestamp END"
        " ELSE available_at END,"
        " status = CASE WHEN attempt_count < %(max_attempts)s THEN 'pending' ELSE 'failed' END,"
        " last_error_code = %(code)s, last_error_message = %(message)s,"
        " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"
        " WHERE id = %(id)s AND status = 'processing' AND locked_by = %(locked_by)s"
    )


#: PostgreSQL counts matched rows: one statement says how many claims were renewed.
EXTEND_LOCKS = Statement(
    "UPDATE outbox_event SET locked_at = %(now)s, updated_at = %(now)s"
    " WHERE " + _locked_in_id_order("status = 'processing' AND locked_by = %(locked_by)s")
)

# -- pages: lock-free keyset reads of ids -------------------------------------------------


def _pages(where: str, key: str) -> Pages:
    select = f"SELECT id FROM outbox_event WHERE {where}"
    return Pages(
        Statement(f"{select} ORDER BY {key}, id LIMIT %(size)s"),
        Statement(f"{select} AND ({key}, id) > (%(after_key)s, %(after_id)s)"
                  f" ORDER BY {key}, id LIMIT %(size)s"),
        Statement(f"SELECT {key} FROM outbox_event WHERE id = %(id)s"))


DISPATCHABLE_PAGES = _pages("status = 'pending' AND available_at <= %(now)s", "available_at")
EXPIRED_PAGES = _pages("locked_at < %(cutoff)s AND status = 'processing'", "locked_at")
DEAD_PAGES = _pages("status = 'failed'", "available_at")
DEAD_WITH_CODE_PAGES = _pages("status = 'failed' AND last_error_code = %(code)s",
                              "available_at")
OLD_PUBLISHED_PAGES = _pages("status = 'published' AND published_at < %(cutoff)s",
                             "available_at")

# -- recovery and operations ----------------------------------------------------------------

RELEASE_EXPIRED = Statement(
    "UPDATE outbox_event SET last_error_message = 'claim by ' || locked_by || ' taken at '"
    " || to_char(locked_at, 'YYYY-MM-DD HH24:MI:SS.US') || ' UTC expired',"
    " status = CASE WHEN attempt_count >= %(max_attempts)s THEN 'failed' ELSE 'pending' END,"
    " last_error_code = 'lock_expired', locked_by = NULL, locked_at = NULL,"
    " updated_at = %(now)s WHERE "
    + _locked_in_id_order("locked_at < %(cutoff)s AND status = 'processing'")
)
_REQUEUE = ("UPDATE outbox_event SET status = 'pending', attempt_count = 0,"
            " available_at = %(now)s, updated_at = %(now)s WHERE ")
REQUEUE_FAILED = Statement(_REQUEUE + _locked_in_id_order("status = 'failed'"))
REQUEUE_FAILED_WITH_CODE = Statement(
    _REQUEUE + _locked_in_id_order("status = 'failed' AND last_error_code = %(code)s"))
DELETE_FAILED = Statement(
    "DELETE FROM outbox_event WHERE " + _locked_in_id_order("status = 'failed'"))
DELETE_FAILED_WITH_CODE = Statement(
    "DELETE FROM outbox_event WHERE "
    + _locked_in_id_order("status = 'failed' AND last_error_code = %(code)s"))
PURGE_PUBLISHED = Statement(
    "DELETE FROM outbox_event WHERE "
    + _locked_in_id_order("status = 'published' AND published_at < %(cutoff)s"))

#: Pending events behind a dead letter of their aggregate: ordered claims leave them alone.
HELD_BACK = Statement(
    "SELECT COUNT(DISTINCT e.id) FROM outbox_event AS f"
    " JOIN outbox_event AS e ON e.aggregate_type = f.aggregate_type"
    " AND e.aggregate_id = f.aggregate_id AND e.published_at IS NULL AND e.id > f.id"
    " AND e.status = 'pending' WHERE f.status = 'failed'"
)
COUNT_BY_STATUS = Statement("SELECT status, COUNT(*) FROM outbox_event GROUP BY status")
#: As MySQL's: the publish of the published event that became available first, one entry of
#: the status index (status, available_at, id) and its row.
OLDEST_PUBLISHED = Statement(
    "SELECT published_at FROM outbox_event WHERE status = 'published'"
    " ORDER BY available_at, id LIMIT 1")
OLDEST_DISPATCHABLE = Statement(
    "SELECT MIN(available_at) FROM outbox_event"
    " WHERE status = 'pending' AND available_at <= %(now)s")
COUNT_EXPIRED = Statement(
    "SELECT COUNT(*) FROM outbox_event WHERE locked_at < %(cutoff)s AND status = 'processing'")
DEAD_BY_CODE = Statement(
    "SELECT COALESCE(last_error_code, ''), COUNT(*) FROM outbox_event"
    " WHERE status = 'failed' GROUP BY last_error_code")
UNREADABLE_PENDING = Statement(
    "UPDATE outbox_event SET status = 'failed', last_error_code = %(code)s,"
    " last_error_message = %(message)s, updated_at = %(now)s"
    " WHERE id = %(id)s AND status = 'pending'"
)

# -- the inbox ------------------------------------------------------------------------------

#: A record already there (committed, or this transaction's) is no row, never an error; one
#: another open transaction has just inserted makes this wait for it (no row once it
#: commits, a row once it rolls back).
INBOX_INSERT = Statement(
    "INSERT INTO inbox_message (consumer, message_id, received_at)"
    " VALUES (%(consumer)s, %(message_id)s, %(now)s)"
    " ON CONFLICT (consumer, message_id) DO NOTHING")
INBOX_OLD = Statement(
    "SELECT received_at, consumer, message_id FROM inbox_message"
    " WHERE received_at < %(cutoff)s ORDER BY received_at LIMIT %(size)s")
INBOX_OLD_SINCE = Statement(
    "SELECT received_at, consumer, message_id FROM inbox_message"
    " WHERE received_at < %(cutoff)s AND received_at >= %(since)s"
    " ORDER BY received_at LIMIT %(size)s")
INBOX_OLD_OF = Statement(
    "SELECT received_at, consumer, message_id FROM inbox_message"
    " WHERE received_at < %(cutoff)s AND consumer = %(consumer)s"
    " ORDER BY received_at LIMIT %(size)s")
INBOX_OLD_OF_SINCE = Statement(
    "SELECT received_at, consumer, message_id FROM inbox_message"
    " WHERE received_at < %(cutoff)s AND consumer = %(consumer)s"
    " AND received_at >= %(since)s ORDER BY received_at LIMIT %(size)s")
INBOX_DELETE = Statement(
    "DELETE FROM inbox_message WHERE consumer = %(consumer)s"
    " AND message_id = ANY(%(ids)s) AND received_at < %(cutoff)s")
INBOX_COUNT_OLD = Statement("SELECT COUNT(*) FROM inbox_message WHERE received_at < %(cutoff)s")
INBOX_COUNT_OLD_OF = Statement(
    "SELECT COUNT(*) FROM inbox_message WHERE received_at < %(cutoff)s"
    " AND consumer = %(consumer)s")

# -- named locks: one session at a time does a chore (``outbox_lite._named_lock``) ------------

#: A session-level advisory lock, never waited for: true taken, false held by another session.
#: Advisory locks are per database already; the key is the name's 64-bit hash. It survives the
#: session's commits and goes with the session (a lost connection releases it).
TRY_LOCK = Statement("SELECT pg_try_advisory_lock(hashtextextended(%(name)s, 0))")
UNLOCK = Statement("SELECT pg_advisory_unlock(hashtextextended(%(name)s, 0))")

# -- the session, the clock, the schema ------------------------------------------------------

#: The server's clock as naive UTC with microseconds, whatever the session's TimeZone (the
#: statement's own instant, as MySQL's UTC_TIMESTAMP(6): now() is the transaction's start).
NOW = Statement("SELECT clock_timestamp() AT TIME ZONE 'UTC'")
#: The session (one round trip): its isolation level (the session's default: asked inside a
#: transaction, transaction_isolation would say that transaction's), the server's version and
#: the encodings (UTF8 both, or characters would change or fail).
SESSION = Statement(
    "SELECT current_setting('default_transaction_isolation'),"
    " current_setting('server_version'),"
    " current_setting('server_encoding'), current_setting('client_encoding')")
#: PostgreSQL has no autocommit setting on the server: nothing to turn on.
AUTOCOMMIT_ON = Statement("SELECT 1")
#: The tables' columns in one read, from the catalog (every user sees it): type as
#: ``format_type`` writes it, collation name (NULL: none). A ``timestamp`` (or ``timestamptz``)
#: declared without a precision keeps microseconds (PostgreSQL's default precision is 6): it
#: reads as timestamp(6) (timestamp(6) with time zone).
SCHEMA_COLUMNS = Statement(
    "SELECT c.relname, a.attname, format_type(a.atttypid, CASE WHEN a.atttypmod = -1"
    " AND a.atttypid IN ('timestamp'::regtype, 'timestamptz'::regtype) THEN 6"
    " ELSE a.atttypmod END), co.collname"
    " FROM pg_catalog.pg_attribute AS a"
    " JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid"
    " LEFT JOIN pg_catalog.pg_collation AS co ON co.oid = a.attcollation"
    " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')"
    " AND c.relname = ANY(%(tables)s) AND a.attnum > 0 AND NOT a.attisdropped")


@functools.lru_cache(maxsize=4)
def session_question(clock: bool, schema: bool) -> Statement:
    """Everything a new connection is asked, in one statement (``outbox_lite._session``).
    The session's row (0 in the first column, the last row) says what :data:`SESSION` says
    and, with ``clock``, the server's clock at the statement's start (as naive UTC) and the
    microseconds the server has spent on the statement when it writes that row (so the clock
    knows how much of the round trip was not the network's); with ``schema`` the rows before
    it (1 in the first column) are :data:`SCHEMA_COLUMNS`' for ``%(tables)s``. Each part
    reads what its own statement reads, in columns of its own."""
    session = ("SELECT 0, current_setting('default_transaction_isolation'),"
               " current_setting('server_version'), current_setting('server_encoding'),"
               " current_setting('client_encoding'), "
               + ("statement_timestamp() AT TIME ZONE 'UTC', (extract(epoch FROM"
                  " clock_timestamp() - statement_timestamp()) * 1000000)::bigint"
                  if clock else "NULL::timestamp, NULL::bigint"))
    if not schema:
        return Statement(session)
    columns = SCHEMA_COLUMNS.named.replace(
        "SELECT c.relname, a.attname,",
        "SELECT 1, NULL, NULL, NULL, NULL, NULL::timestamp, NULL::bigint, c.relname::text,"
        " a.attname::text,", 1).replace("co.collname", "co.collname::text", 1)
    return Statement(columns + " UNION ALL " + session
                     + ", NULL::text, NULL::text, NULL::text, NULL::text")


#: Whether a table exists and whether the user may read it: answered without an error (an
#: error would abort the caller's transaction).
TABLE_STATE = Statement(
    "SELECT to_regclass(%(table)s) IS NOT NULL,"
    " COALESCE(has_table_privilege(to_regclass(%(table)s), 'SELECT'), FALSE)")

# -- the contention suite ---------------------------------------------------------------------

CONTENTION_TABLES = {
    # The "broker": one row per publish, in publish order.
    "contention_sink": "CREATE TABLE contention_sink (id BIGSERIAL PRIMARY KEY,"
                       " event_id BIGINT NOT NULL, worker VARCHAR(64) NOT NULL,"
                       " attempt INT NOT NULL)",
    "ix_sink_event": "CREATE INDEX ix_sink_event ON contention_sink (event_id)",
    # Business rows of the dedupe scenario.
    "contention_job": "CREATE TABLE contention_job (id BIGSERIAL PRIMARY KEY,"
                      " dedupe_key VARCHAR(64) NOT NULL)",
    # One row per aggregate with an event in flight (claimed and not yet recorded).
    "contention_flight": "CREATE TABLE contention_flight (aggregate VARCHAR(64) PRIMARY KEY,"
                         " event_id BIGINT NOT NULL)",
}
CONTENTION_EMPTY = {
    "outbox_event": Statement("TRUNCATE TABLE outbox_event RESTART IDENTITY"),
    "contention_sink": Statement("TRUNCATE TABLE contention_sink RESTART IDENTITY"),
    "contention_job": Statement("TRUNCATE TABLE contention_job RESTART IDENTITY"),
    "contention_flight": Statement("TRUNCATE TABLE contention_flight"),
}
CONTENTION_JOB = Statement("INSERT INTO contention_job (dedupe_key) VALUES (%(key)s)")


@functools.lru_cache(maxsize=64)
def contention_sink(count: int) -> Statement:
    """One sink row per published event and attempt (``event_id_<n>``, ``attempt_<n>``),
    all by ``worker``."""
    rows = ", ".join(f"(%(event_id_{n})s, %(worker)s, %(attempt_{n})s)" for n in range(count))
    return Statement(f"INSERT INTO contention_sink (event_id, worker, attempt) VALUES {rows}")


@functools.lru_cache(maxsize=64)
def contention_enter_flight(count: int) -> Statement:
    """The batch's aggregates into flight; one already there is left as it is."""
    rows = ", ".join(f"(%(aggregate_{n})s, %(event_id_{n})s)" for n in range(count))
    return Statement(f"INSERT INTO contention_flight (aggregate, event_id) VALUES {rows}"
                     " ON CONFLICT (aggregate) DO NOTHING")


CONTENTION_LEAVE_FLIGHT = Statement(
    "DELETE FROM contention_flight WHERE aggregate = ANY(%(aggregates)s)"
    " AND event_id = ANY(%(ids)s)")
#: The server's deadlocks in this database since its statistics were reset.
DEADLOCKS = Statement(
    "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
#: How many other sessions are connected to this database. A session's counts reach
#: pg_stat_database by the time it leaves pg_stat_activity (it flushes them at exit, before
#: its entry there is cleared); a live one's only at most once a second, or after 10 s idle.
OTHER_SESSIONS = Statement(
    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid()")
#: The row-lock waits going on now in this database's sessions (for a row's tuple lock, for
#: the transaction that holds a row, or for an insert of the same unique key: what InnoDB
#: counts as row-lock waits), each named by the waiting session and the instant its wait
#: began (pg_locks.waitstart, PostgreSQL 14+; NULL for an instant after the wait starts, so
#: such a row is left for the next look).
LOCK_WAITS_NOW = Statement(
    "SELECT l.pid, l.waitstart FROM pg_locks l"
    " JOIN pg_stat_activity a ON a.pid = l.pid AND a.datname = current_database()"
    " WHERE NOT l.granted AND l.waitstart IS NOT NULL"
    " AND l.locktype IN ('tuple', 'transactionid', 'spectoken')")
