"""The inbox: each message handled once by a consumer (the consumer's half of the outbox).

``Inbox(database, consumer).accept(message_id)`` records, in the consumer's own transaction,
that ``consumer`` has handled ``message_id``, so that a redelivered message changes nothing.
It is one INSERT into ``inbox_message``, whose primary key is (``consumer``, ``message_id``),
and how InnoDB locks that INSERT is the whole design (measured on MariaDB 10.11 and MySQL 9.7,
under READ COMMITTED, REPEATABLE READ and SERIALIZABLE; ``tests/test_inbox_locks.py``):

* **A new id** inserts its row: True. InnoDB takes an insert-intention lock on the gap, which
  waits only for a gap lock, and nothing the inbox runs holds one; the new record's own lock
  makes only a second delivery of the same id wait.
* **An id a committed transaction recorded** fails on the primary key (1062): False. MySQL
  rolls back that statement alone, so the caller's transaction goes on; InnoDB keeps a shared
  lock on that one record (``S,REC_NOT_GAP``, the clustered index's duplicate check, on both
  servers at every isolation level), which other redeliveries of the id share and no other id
  ever meets.
* **An id another open transaction has just inserted** makes the INSERT wait for that
  transaction: False once it commits, True once it rolls back, LockConflictError (1205, 1213)
  when it takes longer than ``innodb_lock_wait_timeout`` or two waiters deadlock. (PostgreSQL:
  55P03 past ``lock_timeout``, which is unlimited by default, or 40P01 on a deadlock.)

No read comes first. A locking read of a missing key (``SELECT … FOR UPDATE``, ``FOR SHARE``,
``SKIP LOCKED`` and ``NOWAIT`` alike) takes a gap lock under REPEATABLE READ, and every insert of
a neighbouring id would wait for the caller's commit; under SERIALIZABLE even a plain SELECT is
such a read. ``INSERT IGNORE`` locks as the INSERT does, and ``ON DUPLICATE KEY UPDATE`` takes
an exclusive lock that makes redeliveries of one id wait for each other.

One case InnoDB makes wait, whatever the statement: when a delivery waited for a racing twin
that then rolled back, the server hands the waiter's lock on to the gap the twin's row leaves
(lock inheritance, at every isolation level): that transaction then holds a gap lock until it
ends, and inserts of ids sorting in that gap wait for it (``README``, "How the inbox locks").

``purge`` deletes old records in autocommit, a page of keys at a time read lock-free through
the ``received_at`` index, each page deleted by primary key in statements that commit alone.
``Inbox(..., retain=AGE)`` makes that a consumer's chore: :meth:`Inbox.retain`, called between
messages, purges the consumer's records older than ``AGE`` when a pass is due, in a bounded
pass, by one process of the consumer at a time (a named lock of the database, never waited
for: :mod:`outbox_lite._named_lock`). ``accept`` never purges.
Nothing here opens, commits or rolls back a transaction.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import logging
import operator
from typing import Any, Callable

import peewee as pw

from . import _checks, _schema
from ._clock import server_clock
from ._db import execute
from ._families import family_of
from ._named_lock import RETAIN_BATCH_SIZE, RETAIN_MAX_BATCHES, Chore, default_retain_every
from .errors import OutboxError, TransactionRequiredError

__all__ = ["Inbox", "MAX_CONSUMER_LENGTH", "MAX_MESSAGE_ID_LENGTH", "TABLE_NAME",
           "count_older_than", "purge"]

logger = logging.getLogger(__name__)

TABLE_NAME = "inbox_message"
#: Lengths in characters. The primary key holds both at up to 4 bytes a character (utf8mb4),
#: and 4 × (64 + 704) is InnoDB's limit for one key, 3,072 bytes.
MAX_CONSUMER_LENGTH = 64
MAX_MESSAGE_ID_LENGTH = 704

_CONSUMER = operator.itemgetter(1)
_DELETE_CHUNK = 500  # keys per DELETE


def _consumer(value: Any) -> str:
    return _checks.name("consumer", value, MAX_CONSUMER_LENGTH)


class Inbox:
    """The inbox of one ``consumer`` on one Peewee ``database`` (the object the consumer opens
    ``atomic()`` on).

    ``consumer`` names the consumer (a service, or one handler of it): 1–64 printable
    characters without leading or trailing white space, compared exactly; two consumers of
    one message each handle it once. ``clock`` gives ``received_at`` and the purge ages: by
    default (None) the database server's clock, as :class:`~outbox_lite.OutboxRepository`'s,
    so hosts whose wall clocks disagree agree on a record's age; a callable returning an
    aware datetime replaces it (tests inject one). ``retain`` (a timedelta or seconds; None,
    the default: keep every record) is the age past which :meth:`retain` deletes this
    consumer's records, at most every ``retain_every`` seconds (default: a tenth of
    ``retain``, from 1 to 60). Raises TypeError for a database that is not MySQL/MariaDB's
    (or not utf8mb4) and InvalidEventError for a bad ``consumer``, before any SQL.
    """

    def __init__(self, database: pw.Database, consumer: str, *,
                 clock: Callable[[], dt.datetime] | None = None,
                 retain: dt.timedelta | float | None = None,
                 retain_every: float | None = None) -> None:
        self.database = _checks.database(database)
        self._family = family_of(self.database)
        self.consumer = _consumer(consumer)
        self._now = _reader(self.database, clock)
        self.clock = server_clock(self.database) if clock is None else clock
        self._schema_checked = False
        #: The age past which :meth:`retain` deletes records (None: records are kept).
        self.retain_age = None if retain is None else _checks.duration("retain", retain)
        self._retention = None if self.retain_age is None else Chore(
            self.database, f"outbox_lite.inbox_retain/{self.consumer}",
            default_retain_every(self.retain_age) if retain_every is None else
            _checks.duration("retain_every", retain_every).total_seconds(),
            functools.partial(purge, self.database, self.retain_age, consumer=self.consumer,
                              batch_size=RETAIN_BATCH_SIZE, max_batches=RETAIN_MAX_BATCHES,
                              clock=self.clock),
            full=RETAIN_BATCH_SIZE * RETAIN_MAX_BATCHES)

    def __repr__(self) -> str:
        return f"<Inbox consumer={self.consumer!r}>"

    def accept(self, message_id: str) -> bool:
        """Record that this consumer handles ``message_id``, in the caller's open transaction.

        True the first time: the record commits or rolls back with the caller's transaction.
        False when a committed transaction recorded it already (or this one did): nothing
        changed, and the caller's transaction stays usable. While another open transaction
        holds the same id, it waits for that one to end: False once it commits, True if it
        rolls back. Raises TransactionRequiredError outside a transaction and
        InvalidEventError for a ``message_id`` that is not 1–704 printable characters without
        leading or trailing white space, both before any SQL; LockConflictError when the
        wait ends in a lock-wait timeout or a deadlock (retry the whole transaction);
        SchemaError at the first call when ``inbox_message`` is missing or not as the
        migrations make it.
        """
        if not self.database.in_transaction():
            raise TransactionRequiredError(
                "accept() must run inside the caller's transaction (with database.atomic():"
                " ...), so that the record commits or rolls back with the consumer's writes")
        message_id = _checks.name("message_id", message_id, MAX_MESSAGE_ID_LENGTH)
        self._family.check_inbox_key(self.consumer, message_id)
        if not self._schema_checked:
            _schema.check(self.database, (TABLE_NAME,))
            self._schema_checked = True
        insert = self._family.sql.INBOX_INSERT
        try:
            cursor = execute(self.database, insert, insert.params(
                {"consumer": self.consumer, "message_id": message_id, "now": self._now()}))
        except pw.IntegrityError as exc:
            if self._family.duplicate_key(exc) is not None:  # the table's one unique key
                return False
            raise
        # PostgreSQL's INSERT … ON CONFLICT DO NOTHING: no row, no error, for a duplicate.
        return bool(cursor.rowcount)

    def purge(self, older_than: dt.timedelta | float, *, batch_size: int = 1000) -> int:
        """Delete this consumer's records received more than ``older_than`` ago (a timedelta
        or seconds), in autocommit; see :func:`purge`. Returns how many were deleted."""
        return purge(self.database, older_than, consumer=self.consumer, batch_size=batch_size,
                     clock=self.clock)

    def retain(self, *, now: bool = False) -> int:
        """Retention's pass, for a consumer to call between messages, outside a transaction:
        when one is due (or ``now``) and no other process of this consumer is doing one (a
        named lock, never waited for), delete this consumer's records older than ``retain``,
        at most 10,000 in 500-row statements. Returns how many were deleted (0 when none was
        due, another process was doing it, or the inbox was made without ``retain``).
        OutboxError inside a transaction, before any SQL."""
        if self._retention is None:
            return 0
        if self.database.in_transaction():
            raise OutboxError("retain() runs outside any transaction, between messages")
        return self._retention.run() if now else self._retention.run_if_due()


def _reader(database: pw.Database,
            clock: Callable[[], dt.datetime] | None) -> Callable[[], dt.datetime]:
    """What reads ``clock`` (None: the server's) as naive UTC."""
    return server_clock(database).naive if clock is None else _checks.clock(clock)


def _cutoff(database: pw.Database, older_than: Any, consumer: Any,
            clock: Callable[[], dt.datetime] | None) -> tuple[dt.datetime, str | None]:
    age = _checks.duration("older_than", older_than)
    consumer = None if consumer is None else _consumer(consumer)
    return _checks.before("older_than", _reader(database, clock)(), age), consumer


def purge(database: pw.Database, older_than: dt.timedelta | float, *,
          consumer: str | None = None, batch_size: int = 1000,
          clock: Callable[[], dt.datetime] | None = None,
          max_batches: int | None = None) -> int:
    """Delete the inbox records of ``consumer`` (None: of every consumer) received more than
    ``older_than`` ago by ``clock`` (None: the database server's), ``batch_size`` rows per
    page, at most ``max_batches`` pages (None: until none is left). Returns how many were
    deleted.

    Runs in autocommit only (OutboxError inside a transaction, before any SQL): each DELETE
    then commits alone and holds its record locks for one statement. Inside a transaction
    every deleted record would stay locked until the caller's commit, and a key deleted by a
    concurrent purge would leave a gap lock that makes new accepts wait. A record a consumer
    holds (a redelivery answered False in a transaction still open) makes its DELETE wait for
    that transaction (LockConflictError after ``innodb_lock_wait_timeout`` on MySQL and MariaDB,
    after ``lock_timeout`` on PostgreSQL, unlimited by default: run it again).
    """
    database = _checks.database(database)
    if database.in_transaction():
        raise OutboxError(
            "purge() runs in autocommit, outside any transaction: each batch commits alone, "
            "so no record stays locked longer than one statement")
    batch_size = _checks.positive_int("batch_size", batch_size, _checks.MAX_LIMIT)
    if max_batches is not None:
        max_batches = _checks.positive_int("max_batches", max_batches)
    cutoff, consumer = _cutoff(database, older_than, consumer, clock)
    _schema.check(database, (TABLE_NAME,))
    family = family_of(database)
    sql = family.sql
    # Pages in received_at order, each starting at the previous page's last instant: the
    # rows of that page are deleted, so a fresh read skips them, and the index is walked once.
    first, later = ((sql.INBOX_OLD, sql.INBOX_OLD_SINCE) if consumer is None else
                    (sql.INBOX_OLD_OF, sql.INBOX_OLD_OF_SINCE))
    values: dict[str, Any] = {"cutoff": cutoff, "consumer": consumer, "size": batch_size}
    deleted = pages = 0
    statement = first
    while True:
        pages += 1
        page = execute(database, statement, statement.params(values)).fetchall()
        for name, rows in itertools.groupby(sorted(page, key=_CONSUMER), key=_CONSUMER):
            keys = [row[2] for row in rows]
            # At most 500 keys a DELETE: MariaDB turns an IN list of 1,000 values or more
            # (in_predicate_conversion_threshold) into a join that scans and locks the table.
            for start in range(0, len(keys), _DELETE_CHUNK):
                ids = family.id_list(keys[start:start + _DELETE_CHUNK])
                delete = sql.INBOX_DELETE
                deleted += execute(database, *delete.bind(
                    {"consumer": name, "ids": ids, "cutoff": cutoff})).rowcount
        if len(page) < batch_size or pages == max_batches:
            break
        statement = later
        values["since"] = page[-1][0]
    if deleted:
        logger.info("purged %s inbox records", deleted)
    return deleted


def count_older_than(database: pw.Database, older_than: dt.timedelta | float, *,
                     consumer: str | None = None,
                     clock: Callable[[], dt.datetime] | None = None) -> int:
    """How many records :func:`purge` would delete now (what a dry run reports); a plain
    read that locks nothing."""
    database = _checks.database(database)
    cutoff, consumer = _cutoff(database, older_than, consumer, clock)
    _schema.check(database, (TABLE_NAME,))
    sql = family_of(database).sql
    statement = sql.INBOX_COUNT_OLD if consumer is None else sql.INBOX_COUNT_OLD_OF
    return int(execute(database, statement, statement.params(
        {"cutoff": cutoff, "consumer": consumer})).fetchone()[0])
