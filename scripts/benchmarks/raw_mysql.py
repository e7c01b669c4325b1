"""The library's claim and record protocol written straight against PyMySQL, with no ORM and
nothing of outbox_lite: the raw baseline of ``bench.py protocol`` and the raw twin of
``bench.py relay`` (whose fresh processes start as fast as PyMySQL lets them).
The benches check that COLUMNS and CLAIM_WINDOW still match the library's."""

from __future__ import annotations

import datetime as dt
from typing import Any

#: outbox_event's columns, in the order the library reads them for each claimed event.
COLUMNS = ("id", "event_type", "aggregate_type", "aggregate_id", "dedupe_key", "payload",
           "status", "attempt_count", "available_at", "locked_at", "locked_by", "published_at",
           "last_error_code", "last_error_message", "created_at", "updated_at", "headers",
           "expires_at")
AVAILABLE_AT = COLUMNS.index("available_at")
CLAIM_WINDOW = 4  # OutboxRepository's default claim_window

#: The lock-free read of a caller's dedupe_key that the library sends before its INSERT at
#: REPEATABLE READ and SERIALIZABLE (a committed duplicate is refused without a lock).
DEDUPE_KEY_TAKEN = ("SELECT id FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key)"
                    " WHERE dedupe_key = %s")

_SELECT = ", ".join(f"`{c}`" for c in COLUMNS)
_PUBLISH = ("UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'published',"
            " published_at = %s, locked_by = NULL, locked_at = NULL, updated_at = %s"
            " WHERE id {where} AND status = 'processing' AND locked_by = %s")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def claim(cur: Any, worker: str, limit: int, window: int = CLAIM_WINDOW) -> list[tuple[Any, ...]]:
    """claim_batch in the caller's transaction: candidate ids lock-free, paged past those
    other workers hold; their rows FOR UPDATE SKIP LOCKED by primary key; one UPDATE.
    Returns the rows (payload as stored), oldest available_at first."""
    now = utcnow()
    size = limit * window
    rows: list[tuple[Any, ...]] = []
    after: tuple[Any, int] | None = None
    while len(rows) < limit:
        keyset, params = "", [now]  # type: str, list[Any]
        if after is not None:
            keyset = " AND (available_at > %s OR (available_at = %s AND id > %s))"
            params += [after[0], after[0], after[1]]
        cur.execute("SELECT id FROM outbox_event FORCE INDEX (ix_outbox_event_status_available_at)"
                    f" WHERE status = 'pending' AND available_at <= %s{keyset}"
                    " ORDER BY available_at, id LIMIT %s", (*params, size))
        ids = [row[0] for row in cur.fetchall()]
        if not ids:
            break
        marks = ", ".join(["%s"] * len(ids))
        cur.execute(f"SELECT {_SELECT} FROM outbox_event FORCE INDEX (PRIMARY)"
                    f" WHERE id IN ({marks}) AND status = 'pending' AND available_at <= %s"
                    " LIMIT %s FOR UPDATE SKIP LOCKED", (*ids, now, limit - len(rows)))
        rows += cur.fetchall()
        if len(ids) < size or len(rows) >= limit:
            break
        cur.execute("SELECT available_at FROM outbox_event WHERE id = %s", (ids[-1],))
        after = (cur.fetchone()[0], ids[-1])
    if rows:
        marks = ", ".join(["%s"] * len(rows))
        cur.execute("UPDATE outbox_event FORCE INDEX (PRIMARY) SET status = 'processing',"
                    " locked_by = %s, locked_at = %s, attempt_count = attempt_count + 1,"
                    f" updated_at = %s WHERE id IN ({marks})",
                    (worker, now, now, *(row[0] for row in rows)))
    rows.sort(key=lambda row: row[AVAILABLE_AT])  # id order within, as the library's
    return rows


def publish(cur: Any, event_id: int, worker: str) -> bool:
    """mark_published."""
    now = utcnow()
    return cur.execute(_PUBLISH.format(where="= %s"), (now, now, event_id, worker)) == 1


def publish_many(cur: Any, event_ids: list[int], worker: str) -> int:
    """mark_published_many (one statement; the ids sorted, as the library sends them)."""
    now = utcnow()
    marks = ", ".join(["%s"] * len(event_ids))
    return cur.execute(_PUBLISH.format(where=f"IN ({marks})"),
                       (now, now, *sorted(event_ids), worker))
