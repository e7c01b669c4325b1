"""The library's PostgreSQL claim, record and write protocol written straight against
psycopg 3, with no ORM and nothing of outbox_lite: the raw baseline of ``bench.py protocol``
and the raw twin of ``bench.py relay`` on a ``postgresql://`` server. The statements
are outbox_lite/_families/postgresql_sql.py's, written out here; the benches check
(:func:`check`) that they still are the library's, word for word.

Not a bench of its own: imported by the scripts beside it."""

from __future__ import annotations

import datetime as dt
from typing import Any

#: outbox_event's columns as the PostgreSQL family reads them (payload and headers as text).
SELECT_COLUMNS = ("id, event_type, aggregate_type, aggregate_id, dedupe_key, payload::text,"
                  " status, attempt_count, available_at, locked_at, locked_by, published_at,"
                  " last_error_code, last_error_message, created_at, updated_at, headers::text,"
                  " expires_at")
AVAILABLE_AT = 8
CLAIM_WINDOW = 4

#: The keyset pages of dispatchable ids (lock-free), and a row's key for the next page.
PAGE_FIRST = ("SELECT id FROM outbox_event WHERE status = 'pending' AND available_at <= %(now)s"
              " ORDER BY available_at, id LIMIT %(size)s")
PAGE_NEXT = ("SELECT id FROM outbox_event WHERE status = 'pending' AND available_at <= %(now)s"
             " AND (available_at, id) > (%(after_key)s, %(after_id)s)"
             " ORDER BY available_at, id LIMIT %(size)s")
PAGE_KEY = "SELECT available_at FROM outbox_event WHERE id = %(id)s"
#: The candidates' locking read by primary key, FOR UPDATE SKIP LOCKED; then one UPDATE.
LOCK_CANDIDATES = (
    f"SELECT {SELECT_COLUMNS} FROM outbox_event WHERE id = ANY(%(ids)s)"
    " AND status = 'pending' AND available_at <= %(now)s ORDER BY id LIMIT %(limit)s"
    " FOR UPDATE SKIP LOCKED")
CLAIM = ("UPDATE outbox_event SET status = 'processing', locked_by = %(locked_by)s,"
         " locked_at = %(now)s, attempt_count = attempt_count + 1, updated_at = %(now)s"
         " WHERE id = ANY(%(ids)s)")
MARK_PUBLISHED = (
    "UPDATE outbox_event SET status = 'published', published_at = %(now)s,"
    " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"
    " WHERE id = %(id)s AND status = 'processing' AND locked_by = %(locked_by)s")
MARK_PUBLISHED_MANY = (
    "UPDATE outbox_event SET status = 'published', published_at = %(now)s,"
    " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"
    " WHERE id = ANY(ARRAY(SELECT id FROM outbox_event WHERE id = ANY(%(ids)s)"
    " AND status = 'processing' AND locked_by = %(locked_by)s ORDER BY id FOR UPDATE))")
_INSERT = (
    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
    " status, attempt_count, available_at, created_at, updated_at, headers, expires_at)"
    " VALUES (%(event_type)s, %(aggregate_type)s, %(aggregate_id)s, %(dedupe_key)s,"
    " %(payload)s, 'pending', 0, %(available_at)s, %(created_at)s, %(updated_at)s,"
    " %(headers)s, %(expires_at)s)")
#: An event without the caller's key (the library draws a random one), and with it.
INSERT = _INSERT + " RETURNING id, pg_notify('outbox_event', '')::text"
INSERT_UNLESS_TAKEN = (_INSERT + " ON CONFLICT (dedupe_key) DO NOTHING"
                       " RETURNING id, pg_notify('outbox_event', '')::text")


def check() -> None:
    """AssertionError when the library's PostgreSQL statements are no longer these."""
    from outbox_lite._families import postgresql_sql as sql

    pages = sql.DISPATCHABLE_PAGES
    pairs = {"PAGE_FIRST": (PAGE_FIRST, pages.first), "PAGE_NEXT": (PAGE_NEXT, pages.next),
             "PAGE_KEY": (PAGE_KEY, pages.key_of),
             "LOCK_CANDIDATES": (LOCK_CANDIDATES, sql.LOCK_CANDIDATES),
             "CLAIM": (CLAIM, sql.CLAIM), "MARK_PUBLISHED": (MARK_PUBLISHED, sql.MARK_PUBLISHED),
             "MARK_PUBLISHED_MANY": (MARK_PUBLISHED_MANY, sql.MARK_PUBLISHED_MANY),
             "INSERT": (INSERT, sql.INSERT),
             "INSERT_UNLESS_TAKEN": (INSERT_UNLESS_TAKEN, sql.INSERT_UNLESS_TAKEN)}
    for name, (ours, library) in pairs.items():
        assert ours == library.named, f"bench_raw_pg.{name} is not the library's"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def connect(url: Any, autocommit: bool = True) -> Any:
    """A psycopg 3 connection to ``url``'s database (a DatabaseUrl)."""
    import psycopg

    return psycopg.connect(host=url.host, port=url.port, user=url.user,
                           password=url.password or None, dbname=url.name,
                           autocommit=autocommit)


def claim(cur: Any, worker: str, limit: int, window: int = CLAIM_WINDOW,
          ) -> list[tuple[Any, ...]]:
    """claim_batch in the caller's transaction: candidate ids lock-free by keyset pages,
    their rows locked by id FOR UPDATE SKIP LOCKED, one UPDATE. Rows oldest available_at
    first (payload as stored text)."""
    now = utcnow()
    size = limit * window
    rows: list[tuple[Any, ...]] = []
    values: dict[str, Any] = {"now": now, "size": size}
    statement = PAGE_FIRST
    while True:
        ids = [row[0] for row in cur.execute(statement, values).fetchall()]
        if ids:
            rows += cur.execute(LOCK_CANDIDATES, {"ids": ids, "now": now,
                                                  "limit": limit - len(rows)}).fetchall()
        if len(ids) < size or len(rows) >= limit:
            break
        statement = PAGE_NEXT
        (key,) = cur.execute(PAGE_KEY, {"id": ids[-1]}).fetchone()
        values.update(after_key=key, after_id=ids[-1])
    if rows:
        cur.execute(CLAIM, {"locked_by": worker, "now": now, "ids": [r[0] for r in rows]})
    rows.sort(key=lambda row: row[AVAILABLE_AT])
    return rows


def publish(cur: Any, event_id: int, worker: str) -> bool:
    """mark_published."""
    cur.execute(MARK_PUBLISHED, {"now": utcnow(), "id": event_id, "locked_by": worker})
    return cur.rowcount == 1


def publish_many(cur: Any, event_ids: list[int], worker: str) -> int:
    """mark_published_many (the ids sorted, as the library sends them)."""
    cur.execute(MARK_PUBLISHED_MANY, {"now": utcnow(), "ids": sorted(event_ids),
                                      "locked_by": worker})
    return int(cur.rowcount)


def insert_event(cur: Any, values: dict[str, Any], keyed: bool) -> int | None:
    """The event's INSERT (ON CONFLICT (dedupe_key) DO NOTHING when ``keyed``): its id, or
    None for a duplicate key."""
    row = cur.execute(INSERT_UNLESS_TAKEN if keyed else INSERT, values).fetchone()
    return None if row is None else int(row[0])
