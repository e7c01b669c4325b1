"""Every statement the repository runs, named, with the locking rule each one follows.

* Rows change by primary key only (``FORCE INDEX (PRIMARY)``), as compare-and-set
  ``UPDATE … WHERE id … AND status = … [AND locked_by = …]``: a point lookup on the primary key
  takes a record lock and no gap lock, and the affected-row count decides.
* Scans that find candidates are plain consistent reads and lock nothing. A locking range scan on
  ``(status, available_at)`` would take next-key locks past the end of the range, which block
  writers inserting new events and let two claimers deadlock on each other's gaps.
* Assignments read a column before any later assignment writes it, so every UPDATE means the
  same under MySQL's left-to-right rule and MariaDB's SIMULTANEOUS_ASSIGNMENT mode.

Statements that take a list of ids hold ``{ids}``; fill it with :func:`placeholders`.
"""

from __future__ import annotations

from .models import COLUMNS, OutboxStatus

PENDING = OutboxStatus.PENDING.value
PROCESSING = OutboxStatus.PROCESSING.value
PUBLISHED = OutboxStatus.PUBLISHED.value
FAILED = OutboxStatus.FAILED.value

BY_PK = "outbox_event FORCE INDEX (PRIMARY)"
BY_STATUS = "outbox_event FORCE INDEX (ix_outbox_event_status_available_at)"
BY_LOCKED_AT = "outbox_event FORCE INDEX (ix_outbox_event_locked_at)"
SELECT = "SELECT " + ", ".join(f"`{c}`" for c in COLUMNS) + " FROM "


def placeholders(n: int) -> str:
    return ", ".join(["%s"] * n)


# -- writing ----------------------------------------------------------------------------

INSERT = (
    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
    " status, attempt_count, available_at, created_at, updated_at)"
    f" VALUES (%s, %s, %s, %s, %s, '{PENDING}', 0, %s, %s, %s)"
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
#: So: READ COMMITTED or READ UNCOMMITTED, both servers: :data:`INSERT_UNLESS_TAKEN` (0 rows:
#: a committed duplicate). REPEATABLE READ or SERIALIZABLE, both servers: :data:`DEDUPE_KEY_TAKEN`,
#: then the INSERT (two round trips): every one-statement form leaves a lock that holds up
#: some other writer there (MariaDB's refused INSERT the gap before the key, MySQL's every
#: writer), and no writer waits on another's refused duplicate.
INSERT_UNLESS_TAKEN = (
    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
    " status, attempt_count, available_at, created_at, updated_at)"
    f" SELECT %s, %s, %s, %s, %s, '{PENDING}', 0, %s, %s, %s FROM DUAL WHERE NOT EXISTS"
    " (SELECT 1 FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key)"
    " WHERE dedupe_key = %s)"
)

#: Whether a dedupe_key is taken, by a consistent read that locks nothing: asked before the
#: INSERT at REPEATABLE READ and SERIALIZABLE (see above). It cannot see a key of a
#: transaction that has not committed: that INSERT waits for it, and a refusal after the
#: wait keeps the locks described above on both servers.
DEDUPE_KEY_TAKEN = (
    "SELECT id FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key) WHERE dedupe_key = %s")

# -- claiming ---------------------------------------------------------------------------

DISPATCHABLE = f"status = '{PENDING}' AND available_at <= %s"
FIND_DISPATCHABLE = f"{SELECT}{BY_STATUS} WHERE {DISPATCHABLE} ORDER BY available_at, id LIMIT %s"
#: The heads of the aggregates that have dispatchable events, for ordered claims: the first
#: ``%s`` distinct aggregates among the dispatchable events in (available_at, id) order (a
#: DISTINCT with a LIMIT stops reading once it has that many), then each aggregate's head, its
#: oldest unpublished (pending, processing or failed) event. The aggregate index is
#: (aggregate_type, aggregate_id, published_at) since migration 002: ``published_at`` is NULL
#: exactly while an event is unpublished, so the head is the aggregate's first entry there,
#: one index read. The ORDER BY names the index's leading columns: written as ``ORDER BY o.id``
#: alone, MySQL sorts every unpublished entry of the aggregate instead (MariaDB reads one).
#: One read per aggregate, not per event: a backlog of one hot aggregate costs one head read
#: (MariaDB caches a per-event subquery's result; MySQL has no such cache).
HEADS = (
    "SELECT (SELECT o.id FROM outbox_event AS o FORCE INDEX (ix_outbox_event_aggregate)"
    " WHERE o.aggregate_type = g.aggregate_type AND o.aggregate_id = g.aggregate_id"
    " AND o.published_at IS NULL ORDER BY o.aggregate_type, o.aggregate_id, o.id LIMIT 1)"
    f" FROM (SELECT DISTINCT aggregate_type, aggregate_id FROM {BY_STATUS}"
    f" WHERE {DISPATCHABLE} LIMIT %s) AS g"
)
LOCK_CANDIDATES = (
    f"{SELECT}{BY_PK} WHERE id IN ({{ids}}) AND {DISPATCHABLE} LIMIT %s FOR UPDATE SKIP LOCKED"
)
CLAIM_SET = (
    f"SET status = '{PROCESSING}', locked_by = %s, locked_at = %s,"
    " attempt_count = attempt_count + 1, updated_at = %s"
)
CLAIM = f"UPDATE {BY_PK} {CLAIM_SET} WHERE id IN ({{ids}})"
MARK_PROCESSING = f"UPDATE {BY_PK} {CLAIM_SET} WHERE id = %s AND {DISPATCHABLE}"

# -- outcomes (each fenced: the event is processing and held by the caller) ----------------

HELD = f"status = '{PROCESSING}' AND locked_by = %s"
#: What a worker holds (``held_by``): a consistent read, no lock.
HELD_BY = f"{SELECT}outbox_event WHERE {HELD} ORDER BY id"
HELD_AMONG = f"{SELECT}{BY_PK} WHERE {HELD} AND id IN ({{ids}}) ORDER BY id"
#: Whether a server session (a connection id) still runs: an interrupted relay waits for
#: the one it dropped before it counts its claims.
SESSION_ALIVE = "SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s"
#: Where the relay's outcomes stand, after a statement whose answer was lost.
OUTCOME_STATES = (f"SELECT id, status, locked_by, attempt_count, last_error_code FROM {BY_PK}"
                  " WHERE id IN ({ids})")
_PUBLISH_SET = (
    f"SET status = '{PUBLISHED}', published_at = %s,"
    " locked_by = NULL, locked_at = NULL, updated_at = %s"
)
MARK_PUBLISHED = f"UPDATE {BY_PK} {_PUBLISH_SET} WHERE id = %s AND {HELD}"
MARK_PUBLISHED_MANY = f"UPDATE {BY_PK} {_PUBLISH_SET} WHERE id IN ({{ids}}) AND {HELD}"
FAILED_FOR_GOOD = (
    f"UPDATE {BY_PK} SET status = '{FAILED}', last_error_code = %s,"
    " last_error_message = %s, locked_by = NULL, locked_at = NULL, updated_at = %s"
    f" WHERE id = %s AND {HELD}"
)


def retry_or_fail(steps: int) -> str:
    """Back to pending at the instant precomputed for its attempt_count (``steps`` of them,
    then an ELSE), or failed once attempts are used up."""
    whens = " ".join(f"WHEN {n} THEN %s" for n in range(1, steps + 1))
    return (
        f"UPDATE {BY_PK} SET available_at = IF(attempt_count < %s,"
        f" CASE attempt_count {whens} ELSE %s END, available_at),"
        f" status = IF(attempt_count < %s, '{PENDING}', '{FAILED}'),"
        " last_error_code = %s, last_error_message = %s,"
        " locked_by = NULL, locked_at = NULL, updated_at = %s"
        f" WHERE id = %s AND {HELD}"
    )


EXTEND_LOCKS = (
    f"UPDATE {BY_PK} SET locked_at = %s, updated_at = %s WHERE id IN ({{ids}}) AND {HELD}"
)
#: After EXTEND_LOCKS: the rows it matched but could not change (locked_at was already now).
RENEWED = f"SELECT COUNT(*) FROM {BY_PK} WHERE id IN ({{ids}}) AND {HELD} AND locked_at = %s"

# -- recovery and operations ----------------------------------------------------------------

EXPIRED = f"locked_at < %s AND status = '{PROCESSING}'"
RELEASE_EXPIRED = (
    f"UPDATE {BY_PK} SET last_error_message = CONCAT('claim by ', locked_by,"
    " ' taken at ', locked_at, ' UTC expired'),"
    f" status = IF(attempt_count >= %s, '{FAILED}', '{PENDING}'),"
    " last_error_code = 'lock_expired', locked_by = NULL, locked_at = NULL,"
    f" updated_at = %s WHERE id IN ({{ids}}) AND {EXPIRED}"
)
DEAD = f"status = '{FAILED}'"
WITH_CODE = " AND last_error_code = %s"
REQUEUE_FAILED = (
    f"UPDATE {BY_PK} SET status = '{PENDING}', attempt_count = 0,"
    " available_at = %s, updated_at = %s WHERE id IN ({ids}) AND " + DEAD
)
# Multi-table form: single-table DELETE takes no index hint, and left to itself MariaDB may
# scan a secondary index and lock its gaps.
DELETE_FAILED = (
    "DELETE e FROM outbox_event AS e FORCE INDEX (PRIMARY) WHERE e.id IN ({ids}) AND e." + DEAD
)
OLD_PUBLISHED = f"status = '{PUBLISHED}' AND published_at < %s"
PURGE_PUBLISHED = (
    "DELETE e FROM outbox_event AS e FORCE INDEX (PRIMARY)"
    f" WHERE e.id IN ({{ids}}) AND e.status = '{PUBLISHED}' AND e.published_at < %s"
)
KEY_OF = "SELECT {key} FROM outbox_event WHERE id = %s"

#: Pending events behind a dead letter of their aggregate: ordered claims leave them alone.
#: Read from the dead letters (few) towards what waits behind each, one index range apiece;
#: DISTINCT, as an event may wait behind two.
HELD_BACK = (
    "SELECT COUNT(DISTINCT e.id)"
    " FROM outbox_event AS f FORCE INDEX (ix_outbox_event_status_available_at)"
    " JOIN outbox_event AS e FORCE INDEX (ix_outbox_event_aggregate)"
    " ON e.aggregate_type = f.aggregate_type AND e.aggregate_id = f.aggregate_id"
    f" AND e.published_at IS NULL AND e.id > f.id AND e.status = '{PENDING}'"
    f" WHERE f.status = '{FAILED}'"
)
COUNT_BY_STATUS = f"SELECT status, COUNT(*) FROM {BY_STATUS} GROUP BY status"
OLDEST_DISPATCHABLE = f"SELECT MIN(available_at) FROM {BY_STATUS} WHERE {DISPATCHABLE}"
COUNT_EXPIRED = f"SELECT COUNT(*) FROM {BY_LOCKED_AT} WHERE {EXPIRED}"
DEAD_BY_CODE = (
    f"SELECT COALESCE(last_error_code, ''), COUNT(*) FROM {BY_STATUS}"
    f" WHERE {DEAD} GROUP BY last_error_code"
)

#: A pending event whose stored payload cannot be read (``find_dispatchable`` found it):
#: its dead letter, compare-and-set on its status.
UNREADABLE_PENDING = (
    f"UPDATE {BY_PK} SET status = '{FAILED}', last_error_code = %s,"
    " last_error_message = %s, updated_at = %s"
    f" WHERE id = %s AND status = '{PENDING}'"
)
