"""Every statement the library runs on MySQL and MariaDB, whole and named, with the locking rule
each one follows.

* Rows change by primary key only (``FORCE INDEX (PRIMARY)``), as compare-and-set
  ``UPDATE … WHERE id … AND status = … [AND locked_by = …]``: a point lookup on the primary key
  takes a record lock and no gap lock, and the affected-row count decides.
* Scans that find candidates are plain consistent reads and lock nothing. A locking range scan on
  ``(status, available_at)`` would take next-key locks past the end of the range, which block
  writers inserting new events and let two claimers deadlock on each other's gaps.
* Assignments read a column before any later assignment writes it, so every UPDATE means the
  same under MySQL's left-to-right rule and MariaDB's SIMULTANEOUS_ASSIGNMENT mode.

Parameters are named (``%(name)s``); a list of ids is one parameter, ``IN %(ids)s``, given as a
tuple (PyMySQL writes it as ``(1,2,3)``). Every family's statements module has these names.
"""

from __future__ import annotations

import functools

from .contract import Pages, Statement

# The states, as the statements below spell them: pending, processing, published, failed.

# -- writing ----------------------------------------------------------------------------

INSERT = Statement(
    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
    " status, attempt_count, available_at, created_at, updated_at, headers, expires_at)"
    " VALUES (%(event_type)s, %(aggregate_type)s, %(aggregate_id)s, %(dedupe_key)s,"
    " %(payload)s, 'pending', 0, %(available_at)s, %(created_at)s, %(updated_at)s,"
    " %(headers)s, %(expires_at)s)"
)

#: How an event with a caller's ``dedupe_key`` is written: one statement where that keeps a
#: refused duplicate from holding up other writers, else a lock-free read first. Measured on
#: MariaDB 10.11 and MySQL 9.7 with a second writer waiting at most 1 s (1205) while the
#: first's transaction stays open, keys k2 < k8 committed (and k5 for a duplicate):
#:
#: * plain INSERT, duplicate refused (1062): both servers keep a shared next-key lock on the
#:   duplicate's entry in ``uq_outbox_event_dedupe_key`` (a key in (k2, k5) waits, k1 and k9
#:   do not), at READ COMMITTED too; MySQL at REPEATABLE READ (and SERIALIZABLE) also keeps a
#:   gap lock before the primary key's end, handed on from the row it undid, and every other
#:   writer's INSERT waits (k1, k4 and k9 all 1205). A new key: no lock beyond its own row.
#: * INSERT … SELECT … WHERE NOT EXISTS (:data:`INSERT_UNLESS_TAKEN`): at READ COMMITTED (and
#:   READ UNCOMMITTED) the NOT EXISTS is a consistent read on both servers, so no lock at all,
#:   duplicate or not: no writer waits. At REPEATABLE READ both servers read it with shared
#:   next-key locks: a new key leaves gap locks on both sides of it (writers of keys beside it
#:   wait, two such writers deadlock), so not there.
#: * INSERT IGNORE and ON DUPLICATE KEY UPDATE id = id: the same locks as the plain INSERT's
#:   refusal (ON DUPLICATE KEY UPDATE an exclusive one), so nothing gained; INSERT IGNORE also
#:   turns other errors (a truncated value) into warnings. MariaDB's INSERT … RETURNING: the
#:   plain INSERT's locks, and the id is the cursor's lastrowid already.
#:
#: ``python scripts/bench.py write-locks`` measures them again (docs/benchmarks, issue 30): on
#: MySQL 9.7 the WHERE NOT EXISTS refusal of a committed duplicate holds only a record lock
#: on it (no writer waits), but a new key's gap locks remain on both servers.
#:
#: So: READ COMMITTED or READ UNCOMMITTED, both servers: :data:`INSERT_UNLESS_TAKEN` (0 rows:
#: a committed duplicate). REPEATABLE READ or SERIALIZABLE, both servers: :data:`DEDUPE_KEY_TAKEN`,
#: then the INSERT (two round trips; one, :data:`READ_THEN_INSERT`, on a connection that
#: allows multiple statements): every one-statement form leaves a lock that holds up some
#: other writer there (MariaDB's refused INSERT the gap before the key, MySQL's every
#: writer), and no writer waits on another's refused duplicate.
INSERT_UNLESS_TAKEN = Statement(
    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
    " status, attempt_count, available_at, created_at, updated_at, headers, expires_at)"
    " SELECT %(event_type)s, %(aggregate_type)s, %(aggregate_id)s, %(dedupe_key)s,"
    " %(payload)s, 'pending', 0, %(available_at)s, %(created_at)s, %(updated_at)s,"
    " %(headers)s, %(expires_at)s"
    " FROM DUAL WHERE NOT EXISTS"
    " (SELECT 1 FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key)"
    " WHERE dedupe_key = %(dedupe_key)s)"
)

#: Whether a dedupe_key is taken, by a consistent read that locks nothing: asked before the
#: INSERT at REPEATABLE READ and SERIALIZABLE (see above). It cannot see a key of a
#: transaction that has not committed: that INSERT waits for it, and a refusal after the
#: wait keeps the locks described above on both servers.
DEDUPE_KEY_TAKEN = Statement(
    "SELECT id FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key)"
    " WHERE dedupe_key = %(dedupe_key)s")

#: The session variable that carries :data:`READ_THEN_INSERT`'s read to its INSERT (left set
#: on the session, as any statement's own variable is).
TAKEN_VARIABLE = "@outbox_lite_dedupe_taken"
#: The column whose NULL refuses :data:`READ_THEN_INSERT`'s INSERT when the key is taken:
#: error 1048, which a single-row INSERT raises in every sql_mode, before InnoDB is asked to
#: store the row, so no lock is taken for it.
TAKEN_COLUMN = "status"

#: :data:`DEDUPE_KEY_TAKEN`, then the INSERT, in one round trip: two statements in one packet,
#: on a connection that allows multiple statements (PyMySQL's ``CLIENT.MULTI_STATEMENTS``;
#: the URL option ``multi_statements=true``). The read is a plain ``SELECT … INTO`` a
#: session variable, a consistent read that locks nothing (a ``SET @v = (SELECT …)`` or a
#: subquery in the INSERT reads with shared next-key locks at REPEATABLE READ on both
#: servers: ``python scripts/bench.py write-locks``); the INSERT is refused (1048, status
#: NULL) when the read found the key, with the same locks as the two round trips: none.
READ_THEN_INSERT = Statement(
    "SELECT COUNT(*) FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key)"
    f" WHERE dedupe_key = %(dedupe_key)s INTO {TAKEN_VARIABLE};"
    " INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
    " status, attempt_count, available_at, created_at, updated_at, headers, expires_at)"
    " VALUES (%(event_type)s, %(aggregate_type)s, %(aggregate_id)s, %(dedupe_key)s,"
    f" %(payload)s, IF({TAKEN_VARIABLE} = 0, 'pending', NULL), 0, %(available_at)s,"
    " %(created_at)s, %(updated_at)s, %(headers)s, %(expires_at)s)",
    results=2)

# -- claiming ---------------------------------------------------------------------------

_COLUMNS = ("`id`, `event_type`, `aggregate_type`, `aggregate_id`, `dedupe_key`, `payload`,"
            " `status`, `attempt_count`, `available_at`, `locked_at`, `locked_by`,"
            " `published_at`, `last_error_code`, `last_error_message`, `created_at`,"
            " `updated_at`, `headers`, `expires_at`")

FIND_DISPATCHABLE = Statement(
    f"SELECT {_COLUMNS} FROM outbox_event FORCE INDEX (ix_outbox_event_status_available_at)"
    " WHERE status = 'pending' AND available_at <= %(now)s"
    " ORDER BY available_at, id LIMIT %(limit)s")

#: The heads of the aggregates that have dispatchable events, for ordered claims: the first
#: ``size`` distinct aggregates among the dispatchable events in (available_at, id) order (a
#: DISTINCT with a LIMIT stops reading once it has that many), then each aggregate's head, its
#: oldest unpublished (pending, processing or failed) event. The aggregate index is
#: (aggregate_type, aggregate_id, published_at) since migration 002: ``published_at`` is NULL
#: exactly while an event is unpublished, so the head is the aggregate's first entry there,
#: one index read. The ORDER BY names the index's leading columns: written as ``ORDER BY o.id``
#: alone, MySQL sorts every unpublished entry of the aggregate instead (MariaDB reads one).
#: One read per aggregate, not per event: a backlog of one hot aggregate costs one head read
#: (MariaDB caches a per-event subquery's result; MySQL has no such cache).
HEADS = Statement(
    "SELECT (SELECT o.id FROM outbox_event AS o FORCE INDEX (ix_outbox_event_aggregate)"
    " WHERE o.aggregate_type = g.aggregate_type AND o.aggregate_id = g.aggregate_id"
    " AND o.published_at IS NULL ORDER BY o.aggregate_type, o.aggregate_id, o.id LIMIT 1)"
    " FROM (SELECT DISTINCT aggregate_type, aggregate_id"
    " FROM outbox_event FORCE INDEX (ix_outbox_event_status_available_at)"
    " WHERE status = 'pending' AND available_at <= %(now)s LIMIT %(size)s) AS g"
)
#: The candidates' locking read, by primary key: rows another claimer holds are skipped.
LOCK_CANDIDATES = Statement(
    f"SELECT {_COLUMNS} FROM outbox_event FORCE INDEX (PRIMARY) WHERE id IN %(ids)s"
    " AND status = 'pending' AND available_at <= %(now)s LIMIT %(limit)s"
    " FOR UPDATE SKIP LOCKED"
)
CLAIM = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'processing',"
    " locked_by = %(locked_by)s, locked_at = %(now)s, attempt_count = attempt_count + 1,"
    " updated_at = %(now)s WHERE id IN %(ids)s"
)
MARK_PROCESSING = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'processing',"
    " locked_by = %(locked_by)s, locked_at = %(now)s, attempt_count = attempt_count + 1,"
    " updated_at = %(now)s WHERE id = %(id)s AND status = 'pending'"
    " AND available_at <= %(now)s"
)

# -- outcomes (each fenced: the event is processing and held by the caller) ----------------

#: What a worker holds (``held_by``): a consistent read, no lock.
HELD_BY = Statement(
    f"SELECT {_COLUMNS} FROM outbox_event"
    " WHERE status = 'processing' AND locked_by = %(locked_by)s ORDER BY id")
HELD_AMONG = Statement(
    f"SELECT {_COLUMNS} FROM outbox_event FORCE INDEX (PRIMARY)"
    " WHERE status = 'processing' AND locked_by = %(locked_by)s AND id IN %(ids)s ORDER BY id")
#: Whether a server session (a connection id) still runs: an interrupted relay waits for
#: the one it dropped before it counts its claims.
SESSION_ALIVE = Statement(
    "SELECT COUNT(*) FROM information_schema.processlist WHERE id = %(session)s")
#: Where the relay's outcomes stand, after a statement whose answer was lost.
OUTCOME_STATES = Statement(
    "SELECT id, status, locked_by, attempt_count, last_error_code"
    " FROM outbox_event FORCE INDEX (PRIMARY) WHERE id IN %(ids)s")
MARK_PUBLISHED = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'published',"
    " published_at = %(now)s, locked_by = NULL, locked_at = NULL, updated_at = %(now)s"
    " WHERE id = %(id)s AND status = 'processing' AND locked_by = %(locked_by)s"
)
MARK_PUBLISHED_MANY = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'published',"
    " published_at = %(now)s, locked_by = NULL, locked_at = NULL, updated_at = %(now)s"
    " WHERE id IN %(ids)s AND status = 'processing' AND locked_by = %(locked_by)s"
)
FAILED_FOR_GOOD = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'failed',"
    " last_error_code = %(code)s, last_error_message = %(message)s, locked_by = NULL,"
    " locked_at = NULL, updated_at = %(now)s"
    " WHERE id = %(id)s AND status = 'processing' AND locked_by = %(locked_by)s"
)


@functools.lru_cache(maxsize=64)
def retry_or_fail(steps: int) -> Statement:
    """Back to pending at the instant precomputed for its attempt_count (``retry_1`` …
    ``retry_<steps>``, then ``retry_later``), or failed once attempts are used up."""
    whens = " ".join(f"WHEN {n} THEN %(retry_{n})s" for n in range(1, steps + 1))
    return Statement(
        "UPDATE outbox_event FORCE INDEX (PRIMARY) SET"
        " available_at = IF(attempt_count < %(max_attempts)s,"
        f" CASE attempt_count {whens} ELSE %(retry_later)s END, available_at),"
        " status = IF(attempt_count < %(max_attempts)s, 'pending', 'failed'),"
        " last_error_code = %(code)s, last_error_message = %(message)s,"
        " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"
        " WHERE id = %(id)s AND status = 'processing' AND locked_by = %(locked_by)s"
    )


EXTEND_LOCKS = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET locked_at = %(now)s, updated_at = %(now)s"
    " WHERE id IN %(ids)s AND status = 'processing' AND locked_by = %(locked_by)s"
)
#: After EXTEND_LOCKS: the rows it matched but could not change (locked_at was already now).
RENEWED = Statement(
    "SELECT COUNT(*) FROM outbox_event FORCE INDEX (PRIMARY) WHERE id IN %(ids)s"
    " AND status = 'processing' AND locked_by = %(locked_by)s AND locked_at = %(now)s"
)

# -- pages: lock-free keyset reads of ids (``OutboxRepository._pages``) ---------------------


def _pages(source: str, where: str, key: str) -> Pages:
    select = f"SELECT id FROM {source} WHERE {where}"
    return Pages(
        Statement(f"{select} ORDER BY {key}, id LIMIT %(size)s"),
        Statement(f"{select} AND ({key} > %(after_key)s OR ({key} = %(after_key)s"
                  f" AND id > %(after_id)s)) ORDER BY {key}, id LIMIT %(size)s"),
        Statement(f"SELECT {key} FROM outbox_event WHERE id = %(id)s"))


_BY_STATUS = "outbox_event FORCE INDEX (ix_outbox_event_status_available_at)"
#: Dispatchable candidates (the claim's unordered read).
DISPATCHABLE_PAGES = _pages(
    _BY_STATUS, "status = 'pending' AND available_at <= %(now)s", "available_at")
#: Claims older than ``cutoff``, through the locked_at index.
EXPIRED_PAGES = _pages(
    "outbox_event FORCE INDEX (ix_outbox_event_locked_at)",
    "locked_at < %(cutoff)s AND status = 'processing'", "locked_at")
DEAD_PAGES = _pages(_BY_STATUS, "status = 'failed'", "available_at")
DEAD_WITH_CODE_PAGES = _pages(
    _BY_STATUS, "status = 'failed' AND last_error_code = %(code)s", "available_at")
OLD_PUBLISHED_PAGES = _pages(
    _BY_STATUS, "status = 'published' AND published_at < %(cutoff)s", "available_at")

# -- recovery and operations ----------------------------------------------------------------

RELEASE_EXPIRED = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET last_error_message = CONCAT('claim by ',"
    " locked_by, ' taken at ', locked_at, ' UTC expired'),"
    " status = IF(attempt_count >= %(max_attempts)s, 'failed', 'pending'),"
    " last_error_code = 'lock_expired', locked_by = NULL, locked_at = NULL,"
    " updated_at = %(now)s WHERE id IN %(ids)s AND locked_at < %(cutoff)s"
    " AND status = 'processing'"
)
REQUEUE_FAILED = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'pending', attempt_count = 0,"
    " available_at = %(now)s, updated_at = %(now)s WHERE id IN %(ids)s AND status = 'failed'"
)
REQUEUE_FAILED_WITH_CODE = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'pending', attempt_count = 0,"
    " available_at = %(now)s, updated_at = %(now)s WHERE id IN %(ids)s AND status = 'failed'"
    " AND last_error_code = %(code)s"
)
# Multi-table form: single-table DELETE takes no index hint, and left to itself MariaDB may
# scan a secondary index and lock its gaps.
DELETE_FAILED = Statement(
    "DELETE e FROM outbox_event AS e FORCE INDEX (PRIMARY) WHERE e.id IN %(ids)s"
    " AND e.status = 'failed'")
DELETE_FAILED_WITH_CODE = Statement(
    "DELETE e FROM outbox_event AS e FORCE INDEX (PRIMARY) WHERE e.id IN %(ids)s"
    " AND e.status = 'failed' AND e.last_error_code = %(code)s")
PURGE_PUBLISHED = Statement(
    "DELETE e FROM outbox_event AS e FORCE INDEX (PRIMARY)"
    " WHERE e.id IN %(ids)s AND e.status = 'published' AND e.published_at < %(cutoff)s"
)

#: Pending events behind a dead letter of their aggregate: ordered claims leave them alone.
#: Read from the dead letters (few) towards what waits behind each, one index range apiece;
#: DISTINCT, as an event may wait behind two.
HELD_BACK = Statement(
    "SELECT COUNT(DISTINCT e.id)"
    " FROM outbox_event AS f FORCE INDEX (ix_outbox_event_status_available_at)"
    " JOIN outbox_event AS e FORCE INDEX (ix_outbox_event_aggregate)"
    " ON e.aggregate_type = f.aggregate_type AND e.aggregate_id = f.aggregate_id"
    " AND e.published_at IS NULL AND e.id > f.id AND e.status = 'pending'"
    " WHERE f.status = 'failed'"
)
COUNT_BY_STATUS = Statement(
    f"SELECT status, COUNT(*) FROM {_BY_STATUS} GROUP BY status")
#: When the published event that became available first was published: one entry of the
#: status index and its row (``published_at`` is in no index; events are published in about
#: the order they become available, so this is the oldest publish but for a straggler).
OLDEST_PUBLISHED = Statement(
    f"SELECT published_at FROM {_BY_STATUS} WHERE status = 'published'"
    " ORDER BY available_at, id LIMIT 1")
OLDEST_DISPATCHABLE = Statement(
    f"SELECT MIN(available_at) FROM {_BY_STATUS}"
    " WHERE status = 'pending' AND available_at <= %(now)s")
COUNT_EXPIRED = Statement(
    "SELECT COUNT(*) FROM outbox_event FORCE INDEX (ix_outbox_event_locked_at)"
    " WHERE locked_at < %(cutoff)s AND status = 'processing'")
DEAD_BY_CODE = Statement(
    f"SELECT COALESCE(last_error_code, ''), COUNT(*) FROM {_BY_STATUS}"
    " WHERE status = 'failed' GROUP BY last_error_code"
)

#: A pending event whose stored payload cannot be read (``find_dispatchable`` found it):
#: its dead letter, compare-and-set on its status.
UNREADABLE_PENDING = Statement(
    "UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'failed',"
    " last_error_code = %(code)s, last_error_message = %(message)s, updated_at = %(now)s"
    " WHERE id = %(id)s AND status = 'pending'"
)

# -- the inbox (``outbox_lite.inbox``; its locking is described there) ----------------------

INBOX_INSERT = Statement(
    "INSERT INTO inbox_message (consumer, message_id, received_at)"
    " VALUES (%(consumer)s, %(message_id)s, %(now)s)")
_INBOX_BY_AGE = "inbox_message FORCE INDEX (ix_inbox_message_received_at)"
#: A page of old records, read lock-free through the received_at index, in its order (ORDER
#: BY the key columns too would sort the whole range on both servers); the next page starts
#: at the previous one's last instant (its rows are deleted by then).
INBOX_OLD = Statement(
    f"SELECT received_at, consumer, message_id FROM {_INBOX_BY_AGE}"
    " WHERE received_at < %(cutoff)s ORDER BY received_at LIMIT %(size)s")
INBOX_OLD_SINCE = Statement(
    f"SELECT received_at, consumer, message_id FROM {_INBOX_BY_AGE}"
    " WHERE received_at < %(cutoff)s AND received_at >= %(since)s"
    " ORDER BY received_at LIMIT %(size)s")
INBOX_OLD_OF = Statement(
    f"SELECT received_at, consumer, message_id FROM {_INBOX_BY_AGE}"
    " WHERE received_at < %(cutoff)s AND consumer = %(consumer)s"
    " ORDER BY received_at LIMIT %(size)s")
INBOX_OLD_OF_SINCE = Statement(
    f"SELECT received_at, consumer, message_id FROM {_INBOX_BY_AGE}"
    " WHERE received_at < %(cutoff)s AND consumer = %(consumer)s"
    " AND received_at >= %(since)s ORDER BY received_at LIMIT %(size)s")
# Multi-table form: a single-table DELETE takes no index hint, and by primary key each row
# is a record lock with no gap (a range on received_at would lock gaps new records go into).
INBOX_DELETE = Statement(
    "DELETE m FROM inbox_message AS m FORCE INDEX (PRIMARY)"
    " WHERE m.consumer = %(consumer)s AND m.message_id IN %(ids)s"
    " AND m.received_at < %(cutoff)s")
INBOX_COUNT_OLD = Statement(
    f"SELECT COUNT(*) FROM {_INBOX_BY_AGE} WHERE received_at < %(cutoff)s")
INBOX_COUNT_OLD_OF = Statement(
    f"SELECT COUNT(*) FROM {_INBOX_BY_AGE} WHERE received_at < %(cutoff)s"
    " AND consumer = %(consumer)s")

# -- named locks: one session at a time does a chore (``outbox_lite._named_lock``) ------------

#: A user-level lock of this session, never waited for (timeout 0): 1 taken, 0 held by another
#: session. GET_LOCK names are server-wide and at most 64 characters, so the name is hashed
#: with the database's own (SHA2: MySQL 9 has no SHA1()); the lock goes with the session (a
#: lost connection releases it). Galera: see _named_lock.
_LOCK_NAME = "CONCAT('outbox_lite:', LEFT(SHA2(CONCAT(DATABASE(), '/', %(name)s), 256), 48))"
TRY_LOCK = Statement(f"SELECT GET_LOCK({_LOCK_NAME}, 0)")
UNLOCK = Statement(f"SELECT RELEASE_LOCK({_LOCK_NAME})")

# -- the session, the clock, the schema ------------------------------------------------------

#: The server's clock, the one every instant comes from (``outbox_lite._clock``).
NOW = Statement("SELECT UTC_TIMESTAMP(6)")
#: What a connection's session is (``outbox_lite._session``): MariaDB before 11.1 knows only
#: ``tx_isolation``, MySQL 8.0 removed it for ``transaction_isolation``.
SESSION_MARIADB = Statement("SELECT @@SESSION.autocommit, @@SESSION.tx_isolation")
SESSION_MYSQL = Statement("SELECT @@SESSION.autocommit, @@SESSION.transaction_isolation")
#: The same, and whether the server can take writes, for a connection of a URL listing several
#: hosts (asked once, when it opens; the session question then reads this answer): the third
#: column is 1 when the server is read-only (``read_only``, MySQL's ``super_read_only``), the
#: fourth (MariaDB) Galera's ``wsrep_local_state_comment`` (NULL without Galera: ``Synced`` is
#: the state that takes writes; a node that is not ready refuses this very statement, 1047).
#: Group Replication is answered by ``super_read_only`` alone: the plugin sets it on every member
#: that is not an ONLINE PRIMARY (a secondary, one recovering, one in ERROR), and its member
#: table (performance_schema.replication_group_members) is refused to an ordinary account
#: (1142, measured on MySQL 9.7), so asking it would refuse the connection to a service.
#: It replaces the session question on such a connection, so the writability costs no round
#: trip: measured here (2,000 round trips each, twice, on 2 shared cores at a load of 5)
#: MariaDB 10.11 599-933 µs against 274-545 µs for SESSION_MARIADB, MySQL 9.7 (with the member
#: table, since dropped) 442-478 µs against 366-456 µs for SESSION_MYSQL; a second round trip
#: would cost the latter.
WRITABLE_MARIADB = Statement(
    "SELECT @@SESSION.autocommit, @@SESSION.tx_isolation, @@GLOBAL.read_only,"
    " IF(@@GLOBAL.wsrep_on, (SELECT variable_value FROM information_schema.global_status"
    " WHERE variable_name = 'WSREP_LOCAL_STATE_COMMENT'), NULL)")
WRITABLE_MYSQL = Statement(
    "SELECT @@SESSION.autocommit, @@SESSION.transaction_isolation,"
    " @@GLOBAL.super_read_only OR @@GLOBAL.read_only, NULL")
AUTOCOMMIT_ON = Statement("SET autocommit = 1")
#: ``max_allowed_packet`` and whether the server is MariaDB (``mysql_packet``).
PACKET = Statement("SELECT @@SESSION.max_allowed_packet, VERSION()")
#: Both tables' columns in one read (``outbox_lite._schema``).
SCHEMA_COLUMNS = Statement(
    "SELECT table_name, column_name, column_type, collation_name"
    " FROM information_schema.columns WHERE table_schema = DATABASE()"
    " AND table_name IN %(tables)s")


@functools.lru_cache(maxsize=8)
def session_question(mariadb: bool, clock: bool, schema: bool) -> Statement:
    """Everything a new connection is asked, in one statement (``outbox_lite._session``).
    The session's row (0 in the first column, the last row) says the session's autocommit
    and isolation level (:data:`SESSION_MARIADB`, :data:`SESSION_MYSQL`),
    ``max_allowed_packet`` and the version (:data:`PACKET`) and, with ``clock``, the
    server's clock at the statement's start (:data:`NOW`) and the microseconds the server
    has spent on the statement when it writes that row (so the clock knows how much of the
    round trip was not the network's); with ``schema`` the rows before it (1 in the first
    column) are :data:`SCHEMA_COLUMNS`' for ``%(tables)s``. Each part reads what its own
    statement reads, in columns of its own (no type is mixed)."""
    isolation = "tx_isolation" if mariadb else "transaction_isolation"
    session = ("SELECT 0, @@SESSION.autocommit, @@SESSION." + isolation + ","
               " @@SESSION.max_allowed_packet, VERSION(), "
               + ("UTC_TIMESTAMP(6), TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6))"
                  if clock else "NULL, NULL"))
    if not schema:
        return Statement(session)
    return Statement(
        "SELECT 1, NULL, NULL, NULL, NULL, NULL, NULL,"
        " table_name, column_name, column_type, collation_name"
        " FROM information_schema.columns WHERE table_schema = DATABASE()"
        " AND table_name IN %(tables)s"
        " UNION ALL " + session + ", NULL, NULL, NULL, NULL")


#: Whether a table exists though information_schema shows none of its columns; one per table
#: the library makes (a name is never a parameter).
TABLE_PROBES = {
    "outbox_event": Statement("SELECT 1 FROM `outbox_event` LIMIT 0"),
    "inbox_message": Statement("SELECT 1 FROM `inbox_message` LIMIT 0"),
    "outbox_lite_migrations": Statement("SELECT 1 FROM `outbox_lite_migrations` LIMIT 0"),
}

# -- the contention suite's own tables and statements ----------------------------------------

CONTENTION_TABLES = {
    # The "broker": one row per publish, in publish order.
    "contention_sink": "CREATE TABLE contention_sink (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
                       " event_id BIGINT NOT NULL, worker VARCHAR(64) NOT NULL,"
                       " attempt INT NOT NULL, KEY ix_sink_event (event_id)) ENGINE=InnoDB",
    # Business rows of the dedupe scenario.
    "contention_job": "CREATE TABLE contention_job (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
                      " dedupe_key VARCHAR(64) NOT NULL) ENGINE=InnoDB",
    # One row per aggregate with an event in flight (claimed and not yet recorded).
    "contention_flight": "CREATE TABLE contention_flight (aggregate VARCHAR(64) PRIMARY KEY,"
                         " event_id BIGINT NOT NULL) ENGINE=InnoDB",
}
CONTENTION_EMPTY = {
    "outbox_event": Statement("TRUNCATE TABLE outbox_event"),
    "contention_sink": Statement("TRUNCATE TABLE contention_sink"),
    "contention_job": Statement("TRUNCATE TABLE contention_job"),
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
    """The batch's aggregates into flight (``aggregate_<n>``, ``event_id_<n>``); one already
    there is left as it is (the caller counts them from the row count)."""
    rows = ", ".join(f"(%(aggregate_{n})s, %(event_id_{n})s)" for n in range(count))
    return Statement(
        f"INSERT IGNORE INTO contention_flight (aggregate, event_id) VALUES {rows}")


#: The batch's aggregates out of flight, by primary key: no scan, no gap locks (the hint: left
#: alone, a short table is scanned, all locked).
CONTENTION_LEAVE_FLIGHT = Statement(
    "DELETE f FROM contention_flight AS f FORCE INDEX (PRIMARY)"
    " WHERE f.aggregate IN %(aggregates)s AND f.event_id IN %(ids)s")
