"""OutboxRepository: record events in the caller's transaction, hand them out, record outcomes.

The statements and the locking rules they follow are the database's family's
(:mod:`outbox_lite._families`, chosen once per database); this module checks arguments, runs
them by name and reads the results. ``claim_batch`` locks candidates by primary
key with ``FOR UPDATE SKIP LOCKED``, so workers skip each other's rows instead of waiting.

The repository never begins, commits or rolls back anything: the caller owns the transaction.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import operator
import os
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

import peewee as pw

from . import _checks, _schema, _session, tracing as _tracing, wake as _wake
from ._clock import server_clock
from ._credentials import redact
from ._db import execute
from ._families import family_of
from ._families.contract import Statement
from .backoff import Backoff
from .errors import (
    InvalidEventError,
    IsolationLevelError,
    TransactionRequiredError,
)
from .models import (
    COLUMNS,
    MAX_ERROR_CODE_LENGTH,
    MAX_ERROR_MESSAGE_BYTES,
    OutboxEvent,
    TABLE_NAME,
    OutboxStatus,
    UTCDateTimeField,
    aware,
    bind_model,
)
from .payload import DEFAULT_MAX_PAYLOAD_BYTES, check_headers, encode_headers, encode_payload

logger = logging.getLogger(__name__)

Clock = Callable[[], dt.datetime]

_CHUNK = 500  # ids per IN (…) list
_AVAILABLE_AT = operator.itemgetter(COLUMNS.index("available_at"))
_PENDING, _PROCESSING = OutboxStatus.PENDING.value, OutboxStatus.PROCESSING.value
_UTC = dt.timezone.utc


@dataclass(frozen=True)
class OutboxStats:
    """A snapshot of the outbox for operators (see :meth:`OutboxRepository.stats`)."""

    counts: dict[str, int]
    oldest_pending_age: dt.timedelta | None
    expired_claims: int | None
    dead_letters_by_code: dict[str, int]
    #: Pending events behind a dead letter of their aggregate (ordered claims skip them).
    held_back: int = 0
    #: Since the publish of the published event that became available first (None: none):
    #: what retention keeps below its age.
    oldest_published_age: dt.timedelta | None = None

    def as_dict(self) -> dict[str, Any]:
        age, published = self.oldest_pending_age, self.oldest_published_age
        return {"counts": self.counts,
                "oldest_pending_age_seconds": None if age is None else age.total_seconds(),
                "expired_claims": self.expired_claims,
                "dead_letters_by_code": self.dead_letters_by_code,
                "held_back": self.held_back,
                "oldest_published_age_seconds": (None if published is None
                                                 else published.total_seconds())}


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start:start + _CHUNK]


class _Unreadable(Exception):
    """A stored payload that does not read as JSON: (code, message) of its dead letter."""


def _decode_payload(text: Any) -> Any:
    """A stored payload as Python values, or _Unreadable.

    MySQL gives a JSON value longer than ``max_allowed_packet`` back as an empty string
    (warning 1301; a JSON column never holds an empty one); any other text that is not JSON
    was written around outbox_lite (MariaDB's JSON is LONGTEXT with a CHECK a table made by
    hand may lack).
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if not text:
        raise _Unreadable("payload_too_large", (
            "the server sent the payload back empty: it is larger than the server's "
            "max_allowed_packet (MySQL warning 1301); raise max_allowed_packet, then requeue "
            "this event"))
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _Unreadable("payload_not_json", (
            f"the stored payload is not JSON ({exc}); correct it and requeue this event, or "
            "delete it")) from None


def _decode_headers(text: Any) -> dict[str, str]:
    """Stored headers as a dict ({} for NULL)."""
    if text is None:
        return {}
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    return json.loads(text) if isinstance(text, str) else dict(text)


def _make_reader(model: type[OutboxEvent], names: Sequence[str], instants: Sequence[str],
                 changed: Sequence[str], counted: bool) -> Callable[..., OutboxEvent]:
    """``read(row, changes)``: the event of a row of :data:`COLUMNS` (fields ``names``),
    read as Peewee's own readers would, with ``changes`` (whose keys are ``changed``)
    applied: ``instants`` (those not changed) as aware UTC, the payload decoded (raises
    _Unreadable), the headers as a dict, and ``attempt_count`` one more when ``counted``.

    A claim builds many events, and each call per field or per event shows: the reader is
    one function written for these columns, one dict display (built at its size) and no
    call but the decoders'. The instance gets the state Peewee's row readers leave behind
    (``__data__``, nothing dirty; ``__rel__`` caches foreign keys: OutboxEvent has none,
    and the class default serves), without its constructor's call per field.
    """
    unknown = set(changed) - set(names)
    assert not unknown, f"changes to no column: {sorted(unknown)}"
    items = []
    for index, name in enumerate(names):
        if name in changed:
            value = f"changes[{name!r}]"
        elif name == "payload":
            value = f"decode_payload(row[{index}])"
        elif name == "headers":
            value = f"({{}} if (v := row[{index}]) is None else decode_headers(v))"
        elif name in instants:
            value = (f"(v if (v := row[{index}]) is None or v.tzinfo is not None"
                     " else combine(v.date(), v.time(), utc))")
        elif name == "attempt_count" and counted:
            value = f"row[{index}] + 1"
        else:
            value = f"row[{index}]"
        items.append(f"        {name!r}: {value},")
    source = "\n".join([
        "def read(row, changes):",
        "    event = new(model)",
        "    event.__data__ = {",
        *items,
        "    }",
        "    event._dirty = set()",
        "    return event"])
    scope: dict[str, Any] = {"new": model.__new__, "model": model, "utc": _UTC,
                             "combine": dt.datetime.combine,
                             "decode_payload": _decode_payload,
                             "decode_headers": _decode_headers}
    exec(compile(source, f"<outbox_lite row reader {model.__name__}>", "exec"), scope)
    return scope["read"]  # type: ignore[no-any-return]


class OutboxRepository:
    """The outbox on one Peewee ``database`` (the object the caller opens ``atomic()`` on).

    Options (keyword-only): ``max_attempts`` claims before an event is dead-lettered;
    ``backoff`` the :class:`Backoff` between retries; ``clock`` the source of every instant
    the repository records or compares (``created_at``, a default ``available_at``,
    ``locked_at``, ``published_at``, the backoff, lock expiry, purge and pending ages): by
    default (None) the database server's clock, ``UTC_TIMESTAMP(6)``, read once and then
    extrapolated with the host's monotonic clock (read again every 10 s and on a new
    connection), so hosts whose wall clocks disagree by any amount agree on every instant;
    a callable returning an aware datetime replaces it (tests inject one to move time;
    a host's own clock there gives up that agreement). ``repository.clock()`` reads the
    clock in use. ``max_payload_bytes`` the JSON size limit;
    ``allowed_payload_keys`` key names the credential guard must let through;
    ``claim_window`` how many candidates per wanted event ``claim_batch`` reads at a time;
    ``wake`` a wake-up URL (``redis://…`` or ``nats://…``, or None): each event created rings
    the relays of this database through it (:mod:`outbox_lite.wake`), and always those in
    this process. A ring goes after the caller's COMMIT on Peewee 4 (none on a rollback), at
    ``create_in_transaction`` on Peewee 3 and in ``manual_commit()``; it never fails a write.
    """

    def __init__(
        self,
        database: pw.Database,
        *,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        allowed_payload_keys: Collection[str] = (),
        claim_window: int = 4,
        wake: str | None = None,
    ) -> None:
        self.database = _checks.database(database)
        self._family = family_of(self.database)
        #: The family's statements, by the names every family gives them.
        self._sql = self._family.sql
        #: The wake-up server's source (None: in-process wake-ups only).
        self.wake = _wake.wake_source(wake, self.database)
        self._wake_key = _wake.database_key(self.database)
        self.max_attempts = _checks.positive_int("max_attempts", max_attempts, 1_000)
        self.backoff = backoff if backoff is not None else Backoff()
        if not isinstance(self.backoff, Backoff):
            raise TypeError("backoff must be an outbox_lite.Backoff")
        self.clock: Clock
        self._read_now: Callable[[], dt.datetime]  # naive UTC, as DATETIME(6) stores it
        if clock is None:
            self.clock = server = server_clock(self.database)
            self._read_now = server.naive
        else:  # checked now, and on every reading
            self._read_now = _checks.clock(clock)
            self.clock = clock
        self.max_payload_bytes = _checks.positive_int("max_payload_bytes", max_payload_bytes)
        if isinstance(allowed_payload_keys, str):
            raise TypeError("allowed_payload_keys must be a collection of key names")
        self.allowed_payload_keys = frozenset(allowed_payload_keys)
        self.claim_window = _checks.positive_int("claim_window", claim_window, 100)
        #: The OutboxEvent model bound to ``database``, for the caller's own queries.
        self.model: type[OutboxEvent] = bind_model(database)
        fields = self.model._meta.sorted_fields
        self._names = [f.name for f in fields]
        self._instants = [f.name for f in fields if isinstance(f, UTCDateTimeField)]
        self._readers: dict[tuple[tuple[str, ...], bool], Callable[..., OutboxEvent]] = {}
        self._schema_checked = False

    # -- plumbing -----------------------------------------------------------------------

    def _require_transaction(self, method: str) -> None:
        if not self.database.in_transaction():
            raise TransactionRequiredError(
                f"{method}() must run inside the caller's transaction "
                "(with database.atomic(): ...)")

    def _execute(self, statement: str, params: Sequence[Any]) -> Any:
        """Run one statement; lock conflicts and lost connections become our errors
        (:func:`outbox_lite._db.execute`, shared with the inbox). The first one checks the
        table first (SchemaError when it is not as the migrations make it)."""
        if not self._schema_checked:
            self._check_schema()
        return execute(self.database, statement, params)

    def _run(self, statement: Statement, **values: Any) -> Any:
        """:meth:`_execute` of one of the family's statements, its parameters by name."""
        return self._execute(*statement.bind(values))

    def _now(self) -> dt.datetime:
        """The clock's reading (naive UTC). The first call checks the table first, so that on
        a new connection the schema check's session question reads the clock too (one round
        trip for both, :mod:`outbox_lite._session`)."""
        if not self._schema_checked:
            self._check_schema()
        return self._read_now()

    def _check_schema(self) -> None:
        if not self._schema_checked:
            _schema.check(self.database, (TABLE_NAME,))
            self._schema_checked = True
            # Checked: read the clock and run statements directly (no check per call).
            self._now = self._read_now  # type: ignore[method-assign]
            self._execute = functools.partial(execute, self.database)  # type: ignore[method-assign]

    def _reader(self, changed: tuple[str, ...], counted: bool) -> Callable[..., OutboxEvent]:
        """The reader of rows of :data:`COLUMNS` into events (made once per ``changed`` and
        ``counted``, see :func:`_make_reader`)."""
        reader = self._readers.get((changed, counted))
        if reader is None:
            reader = self._readers[changed, counted] = _make_reader(
                self.model, self._names, self._instants, changed, counted)
        return reader

    def _instance(self, data: dict[str, Any]) -> OutboxEvent:
        """A model instance over ``data`` (field name -> Python value), nothing dirty.

        Peewee's constructor runs every field's descriptor; a claim builds many instances,
        so this sets the state Peewee's own row readers leave behind directly. (``__rel__``
        caches foreign keys; OutboxEvent has none, and the class default serves.)
        """
        event = self.model.__new__(self.model)
        event.__data__ = data
        event._dirty = set()  # type: ignore[attr-defined]  # Peewee sets it in __init__
        return event

    def _events(self, rows: Sequence[Sequence[Any]], changes: dict[str, Any] | None,
                dead_letter: Statement, *, counted: bool = False,
                **values: Any) -> list[OutboxEvent]:
        """The events of ``rows`` whose payload reads as JSON, with ``changes`` applied (and
        one more attempt counted when ``counted``: a claim's). Each other row becomes its own
        dead letter through ``dead_letter`` (a compare-and-set UPDATE run with ``values``
        and the row's id, code and message), logged as a warning: a row nobody can read
        never stops the rows behind it."""
        events = []
        read = self._reader(tuple(changes or ()), counted)
        for row in rows:
            try:
                events.append(read(row, changes))
            except _Unreadable as unreadable:
                code, message = unreadable.args
                changed = self._run(dead_letter, id=row[0], code=code, message=message,
                                    **values).rowcount
                logger.warning("outbox event %s is a dead letter (%s): %s%s", row[0], code,
                               message, "" if changed else " (it had changed meanwhile)")
        return events

    # -- writing ------------------------------------------------------------------------

    def create_in_transaction(
        self,
        *,
        event_type: str,
        aggregate_type: str,
        aggregate_id: str,
        payload: Any,
        dedupe_key: str | None = None,
        available_at: dt.datetime | None = None,
        headers: Mapping[str, str] | None = None,
        expires_at: dt.datetime | None = None,
    ) -> OutboxEvent:
        """Insert a ``pending`` event in the caller's open transaction and return it.

        Raises TransactionRequiredError outside a transaction, InvalidEventError (or a
        PayloadError) for bad input, both before any SQL (a payload whose INSERT the server's
        ``max_allowed_packet`` would refuse too: the limit is read once per connection, see
        :mod:`outbox_lite._families.mysql_packet`), SchemaError at the first statement when
        the table is not as the migrations make it, and DuplicateEventError when
        ``dedupe_key`` exists (the caller's transaction stays usable, and a duplicate that
        had committed holds up no other writer's event: see "How it locks" in the README).
        On a connection the library has used before (and with the server's clock read in
        the last 10 s, see :mod:`outbox_lite._clock`) it sends one statement (the INSERT),
        with or without a ``dedupe_key``; the one exception is a ``dedupe_key`` on MySQL at
        REPEATABLE READ or SERIALIZABLE, where a lock-free read of the key goes first,
        because there a refused INSERT would hold up every writer. Like Peewee's
        ``Model.create``, the returned event holds ``payload`` as given; the row holds its
        JSON, which reads back as an equal value (a tuple as a list) on both servers: MariaDB
        keeps the text as written, MySQL keeps the value in text of its own (keys sorted, its
        own spacing). Integers beyond 64 bits, which MySQL would turn into floats, are
        refused on both (PayloadError).

        ``headers`` (SPEC §11): str to str, at most 64 entries and 8 KiB, checked by
        :func:`outbox_lite.payload.check_headers` (a credential is a CredentialInPayloadError
        naming the header); with the ``[otel]`` extra and a span current, its
        ``traceparent`` and ``tracestate`` are added unless given
        (:func:`outbox_lite.tracing.capture`). The event's ``headers`` read back as a dict.
        ``expires_at``: an aware datetime past which the relay never publishes the event
        (it becomes a dead letter, ``last_error_code`` ``expired``); None: never.
        """
        self._require_transaction("create_in_transaction")
        event_type = _checks.name("event_type", event_type)
        aggregate_type = _checks.name("aggregate_type", aggregate_type)
        aggregate_id = _checks.name("aggregate_id", aggregate_id)
        given_key = dedupe_key is not None
        if dedupe_key is None:
            dedupe_key = os.urandom(16).hex()  # 128 random bits; uuid4() costs 4x more
        else:
            dedupe_key = _checks.name("dedupe_key", dedupe_key)
        body = encode_payload(payload, max_bytes=self.max_payload_bytes,
                              allowed_keys=self.allowed_payload_keys)
        given_at = None if available_at is None else _checks.instant("available_at",
                                                                      available_at)
        event_headers = _tracing.capture(
            {} if headers is None else check_headers(headers,
                                                      allowed_keys=self.allowed_payload_keys))
        expires = None if expires_at is None else _checks.instant("expires_at", expires_at)
        now = self._now()
        available = now if given_at is None else given_at
        values = {"event_type": event_type, "aggregate_type": aggregate_type,
                  "aggregate_id": aggregate_id, "dedupe_key": dedupe_key, "payload": body,
                  "available_at": available, "created_at": now, "updated_at": now,
                  "headers": encode_headers(event_headers), "expires_at": expires}
        isolation = (_session.transaction_isolation(self.database)
                     if given_key and self._family.write_reads_isolation else "")
        event_id = self._family.write_event(self.database, values, given_key=given_key,
                                            isolation=isolation, payload=payload,
                                            execute=self._execute)
        self._ring()
        created = aware(now)
        return self._instance({
            "id": event_id, "event_type": event_type, "aggregate_type": aggregate_type,
            "aggregate_id": aggregate_id, "dedupe_key": dedupe_key, "payload": payload,
            "status": _PENDING, "attempt_count": 0,
            "available_at": created if available_at is None else aware(available),
            "locked_at": None, "locked_by": None, "published_at": None,
            "last_error_code": None, "last_error_message": None, "created_at": created,
            "updated_at": created, "headers": event_headers,
            "expires_at": None if expires is None else aware(expires)})

    def _ring(self) -> None:
        """Wake the relays once the event commits (Peewee 4's ``after_commit``; dropped on a
        rollback), or now where that hook is missing (Peewee 3) or refused
        (``manual_commit()``)."""
        try:
            self.database.after_commit(self._rang)
        except (AttributeError, ValueError):
            self._rang()

    def _rang(self) -> None:
        # Runs inside Peewee's commit: it must never raise (that would fail a committed write).
        try:
            _wake.ring_locally(self._wake_key)
            if self.wake is not None:
                self.wake.signal()
        except Exception:  # noqa: BLE001 - the poll is the safety net
            logger.exception("waking the relays failed; they will poll")

    # -- claiming -----------------------------------------------------------------------

    def find_dispatchable(self, limit: int = 100) -> list[OutboxEvent]:
        """Pending events whose ``available_at`` has passed, oldest first; the read locks
        nothing. A row whose stored payload cannot be read (on MySQL, one larger than
        ``max_allowed_packet``) is left out and made its own dead letter, by a compare-and-set
        UPDATE (``payload_too_large`` or ``payload_not_json``), logged as a warning."""
        limit = _checks.positive_int("limit", limit, _checks.MAX_LIMIT)
        now = self._now()
        rows = self._run(self._sql.FIND_DISPATCHABLE, now=now, limit=limit).fetchall()
        return self._events(rows, None, self._sql.UNREADABLE_PENDING, now=now)

    def mark_processing(self, event_id: int, locked_by: str) -> bool:
        """Claim one dispatchable event for ``locked_by`` (compare-and-set).

        Returns True for exactly one of many racing callers; False when the event is not
        pending, not yet available, or missing. It ignores aggregate order: a service that
        claims ordered uses ``claim_batch(..., ordered=True)`` everywhere.
        """
        event_id = _checks.event_id(event_id)
        locked_by = _checks.name("locked_by", locked_by)
        now = self._now()
        cursor = self._run(self._sql.MARK_PROCESSING, locked_by=locked_by, now=now,
                           id=event_id)
        return cursor.rowcount == 1

    def claim_batch(self, locked_by: str, limit: int = 100, *,
                    ordered: bool = False) -> list[OutboxEvent]:
        """Claim up to ``limit`` dispatchable events for ``locked_by`` in the caller's
        transaction; concurrent claimers get disjoint sets without waiting on each other.

        With ``ordered`` only the head of each aggregate is claimed: an event whose
        (aggregate_type, aggregate_id) has an older pending, processing or failed event is
        left alone. When every worker claims ordered, an aggregate's events are therefore
        published one at a time in id order, and a dead letter holds back its own aggregate
        only. Returns the claimed events (already ``processing``), oldest ``available_at``
        first. A claimed row whose stored payload cannot be read becomes its own dead letter
        (as in :meth:`find_dispatchable`, the attempt counted) and is not returned.

        The transaction must be READ COMMITTED or REPEATABLE READ (or READ UNCOMMITTED): in a
        SERIALIZABLE one (the session's level, or ``atomic(isolation_level=...)``'s) claimers
        would wait for each other and deadlock, so it raises IsolationLevelError before any
        claim statement; claim in ``database.atomic(isolation_level="REPEATABLE READ")``.
        """
        self._require_transaction("claim_batch")
        locked_by = _checks.name("locked_by", locked_by)
        limit = _checks.positive_int("limit", limit, _checks.MAX_LIMIT)
        ordered = _checks.flag("ordered", ordered)
        isolation = _session.claim_isolation(self.database)
        if isolation in self._family.refused_claim_levels:
            raise IsolationLevelError(isolation, level=self._family.claim_level,
                                      why=self._family.claim_refusal)
        now = self._now()
        wanted = limit * self.claim_window
        pages = (self._heads(now, wanted) if ordered else
                 self._pages(self._sql.DISPATCHABLE_PAGES, wanted, now=now))
        claimed: list[Sequence[Any]] = []
        for ids in pages:
            # No more candidates at once than still wanted: the locking read returns them in
            # id order, so a wider slice could take newer ones before older (available_at).
            while ids and len(claimed) < limit:
                chunk, ids = ids[:limit - len(claimed)], ids[limit - len(claimed):]
                claimed.extend(self._run(self._sql.LOCK_CANDIDATES,
                                         ids=self._family.id_list(chunk), now=now,
                                         limit=len(chunk)).fetchall())
            if len(claimed) >= limit:
                break
        if not claimed:
            return []
        ids = [row[0] for row in claimed]
        self._run(self._sql.CLAIM, locked_by=locked_by, now=now, ids=self._family.id_list(ids))
        # Rows come in id order; a stable sort on available_at makes it (available_at, id).
        claimed.sort(key=_AVAILABLE_AT)
        aware_now = aware(now)
        changes = {"status": _PROCESSING, "locked_by": locked_by, "locked_at": aware_now,
                   "updated_at": aware_now}
        return self._events(claimed, changes, self._sql.FAILED_FOR_GOOD, counted=True,
                            now=now, locked_by=locked_by)

    def _pages(self, pages: Any, size: int, *, caller_changes_rows: bool = False,
               **values: Any) -> Iterator[list[int]]:
        """Ids of the rows ``pages`` (the family's keyset read: first page, next page, a
        row's key) finds with ``values``, in (key, id) order, ``size`` at a time.

        A lock-free read, paged by key set rather than OFFSET, so it ends even when the rows
        it returned stay as they were (a caller's REPEATABLE READ snapshot never changes).
        Only ids travel; the last row's key is read when another page is wanted, or before
        the caller changes that row when ``caller_changes_rows``.
        """
        statement = pages.first
        while True:
            ids = [row[0] for row in self._run(statement, size=size, **values).fetchall()]
            if len(ids) < size:
                if ids:
                    yield ids
                return
            if caller_changes_rows:
                statement = self._resume_after(pages, ids, values)
                yield ids
            else:
                yield ids
                statement = self._resume_after(pages, ids, values)

    def _heads(self, now: dt.datetime, size: int) -> Iterator[list[int]]:
        """Ids of the heads of the aggregates with dispatchable events, in pages: those of
        the first ``size`` such aggregates (oldest dispatchable event first), then, while the
        caller wants more, of the first ``2 * size``, ``4 * size`` … less those given before.
        A lock-free read; a head may be processing, failed or not yet available (the caller's
        locking read keeps only dispatchable ones)."""
        tried: set[int] = set()
        while True:
            rows = self._run(self._sql.HEADS, now=now, size=size).fetchall()
            heads = [head for (head,) in rows if head is not None and head not in tried]
            if heads:
                tried.update(heads)
                yield heads
            if len(rows) < size:
                return
            size *= 2

    def _resume_after(self, pages: Any, ids: list[int], values: dict[str, Any]) -> Any:
        """The statement of the page after ``ids`` (``values`` updated for it): after the last
        of them whose row is still there, as another session may have deleted some meanwhile
        (two purges at once, on two Galera nodes say); the first page again when none is."""
        for event_id in reversed(ids):
            row = self._run(pages.key_of, id=event_id).fetchone()
            if row is not None:
                values.update(after_key=row[0], after_id=event_id)
                return pages.next
        return pages.first

    # -- outcomes -----------------------------------------------------------------------

    def mark_published(self, event_id: int, locked_by: str) -> bool:
        """Record that ``locked_by`` published the event it holds; clears the lock.

        False (and nothing changed) unless the event is ``processing`` and held by
        ``locked_by``: a worker whose claim expired and was taken over is fenced off.
        """
        event_id = _checks.event_id(event_id)
        locked_by = _checks.name("locked_by", locked_by)
        now = self._now()
        return self._run(self._sql.MARK_PUBLISHED, now=now, id=event_id,
                         locked_by=locked_by).rowcount == 1

    def mark_published_many(self, event_ids: Iterable[int], locked_by: str) -> int:
        """:meth:`mark_published` for many events in one statement (per 500 ids), with the
        same fencing for each: an event that is not ``processing`` and held by
        ``locked_by`` is left as it is. Returns how many were recorded; fewer than given
        means some claims had expired and been taken over.
        """
        ids = _checks.event_ids(event_ids)
        locked_by = _checks.name("locked_by", locked_by)
        now = self._now()
        return sum(self._run(self._sql.MARK_PUBLISHED_MANY, now=now, locked_by=locked_by,
                             ids=self._family.id_list(chunk)).rowcount
                   for chunk in _chunks(ids))

    def mark_failed(self, event_id: int, locked_by: str, error_code: str, error_message: str,
                    *, retryable: bool = True) -> bool:
        """Record a failed publish by ``locked_by`` (same fencing as :meth:`mark_published`).

        Retryable with attempts left: back to ``pending``, ``available_at`` pushed out by the
        backoff. Otherwise ``failed`` (a dead letter). The message is stored with credentials
        redacted and cut to the column's 65,535 bytes.
        """
        event_id = _checks.event_id(event_id)
        locked_by = _checks.name("locked_by", locked_by)
        error_code = _checks.name("error_code", error_code, MAX_ERROR_CODE_LENGTH)
        if not isinstance(error_message, str):
            raise InvalidEventError(
                f"error_message must be a str, not {type(error_message).__name__}")
        message = self._family.stored_text(_checks.bounded_text(
            "error_message", redact(error_message), MAX_ERROR_MESSAGE_BYTES))
        retryable = _checks.flag("retryable", retryable)
        now = self._now()
        values = {"code": error_code, "message": message, "now": now, "id": event_id,
                  "locked_by": locked_by}
        if not retryable or self.max_attempts == 1:
            return self._run(self._sql.FAILED_FOR_GOOD, **values).rowcount == 1
        # The retry instant depends on attempt_count, which only the row knows: precompute
        # one instant per attempt (each with its own jitter) and let the row pick.
        steps = min(self.max_attempts - 1, self.backoff.uncapped_attempts())
        for n in range(1, steps + 1):
            values[f"retry_{n}"] = now + self.backoff.delay(n)
        values["retry_later"] = now + self.backoff.delay(steps + 1)
        return self._run(self._sql.retry_or_fail(steps), max_attempts=self.max_attempts,
                         **values).rowcount == 1

    def extend_locks(self, event_ids: Iterable[int], locked_by: str) -> int:
        """Renew the claims ``locked_by`` still holds on ``event_ids``: ``locked_at`` becomes
        now, so :meth:`release_expired_locks` counts their age from here.

        Fenced like :meth:`mark_published`: events that are not ``processing`` and held by
        ``locked_by`` are left alone. Returns how many were renewed; fewer than given means
        those claims were lost (expired and released, or taken over). One statement per
        500 ids.
        """
        ids = _checks.event_ids(event_ids)
        locked_by = _checks.name("locked_by", locked_by)
        now = self._now()
        # The family counts what matched (MySQL's row count says what changed).
        return sum(self._family.extend_locks(
            {"now": now, "locked_by": locked_by, "ids": self._family.id_list(chunk)},
            len(chunk), self._execute) for chunk in _chunks(ids))

    def held_by(self, locked_by: str,
                event_ids: Iterable[int] | None = None) -> list[OutboxEvent]:
        """The events ``locked_by`` holds now (``processing`` and claimed by it), in id
        order; only those among ``event_ids`` when given. A consistent read that locks
        nothing: after a COMMIT whose answer was lost, it tells a worker what it holds. A
        held row whose payload cannot be read becomes its dead letter, as in
        :meth:`claim_batch`, and is not returned."""
        locked_by = _checks.name("locked_by", locked_by)
        if event_ids is None:
            rows = list(self._run(self._sql.HELD_BY, locked_by=locked_by).fetchall())
        else:
            rows = [row for chunk in _chunks(_checks.event_ids(event_ids))
                    for row in self._run(self._sql.HELD_AMONG, locked_by=locked_by,
                                         ids=self._family.id_list(chunk)).fetchall()]
        now = self._now()
        return self._events(rows, None, self._sql.FAILED_FOR_GOOD, now=now,
                            locked_by=locked_by)

    # -- recovery -----------------------------------------------------------------------

    def release_expired_locks(self, lock_timeout: dt.timedelta | float) -> int:
        """Return ``processing`` events claimed longer than ``lock_timeout`` ago to ``pending``
        (or ``failed`` once attempts are exhausted), with ``last_error_code='lock_expired'``.

        Returns how many were released. Works in autocommit and in a caller's transaction.
        """
        timeout = _checks.duration("lock_timeout", lock_timeout)
        now = self._now()
        cutoff = _checks.before("lock_timeout", now, timeout)
        released = 0
        for ids in self._pages(self._sql.EXPIRED_PAGES, _CHUNK, caller_changes_rows=True,
                               cutoff=cutoff):
            released += self._run(self._sql.RELEASE_EXPIRED, max_attempts=self.max_attempts,
                                  now=now, ids=self._family.id_list(ids),
                                  cutoff=cutoff).rowcount
        if released:
            logger.info("released %s expired outbox claims", released)
        return released

    def _dead_letters(self, event_ids: Iterable[int] | None,
                      error_code: str | None) -> tuple[Iterable[list[int]], dict[str, Any]]:
        """Pages of candidate ids for the dead-letter operations, and the code filter's
        value (``code``, when one is given) each statement must repeat."""
        values: dict[str, Any] = {}
        if error_code is not None:
            values["code"] = _checks.name("error_code", error_code, MAX_ERROR_CODE_LENGTH)
        if event_ids is not None:
            return _chunks(_checks.event_ids(event_ids)), values
        pages = self._pages(self._sql.DEAD_PAGES if error_code is None else
                            self._sql.DEAD_WITH_CODE_PAGES, _CHUNK, caller_changes_rows=True,
                            **values)
        return pages, values

    def requeue_failed(self, event_ids: Iterable[int] | None = None, *,
                       error_code: str | None = None) -> int:
        """Move ``failed`` events (all, those in ``event_ids``, and/or those whose
        ``last_error_code`` is ``error_code``) back to ``pending`` with ``attempt_count = 0``,
        dispatchable now. Returns how many moved."""
        pages, values = self._dead_letters(event_ids, error_code)
        statement = (self._sql.REQUEUE_FAILED if error_code is None else
                     self._sql.REQUEUE_FAILED_WITH_CODE)
        now = self._now()
        return sum(self._run(statement, now=now, ids=self._family.id_list(ids),
                             **values).rowcount
                   for ids in pages)

    def delete_failed(self, event_ids: Iterable[int] | None, *,
                      error_code: str | None = None) -> int:
        """Delete dead letters an operator decided must never be published: the ``failed``
        events among ``event_ids`` (``None``: every dead letter), only those whose
        ``last_error_code`` is ``error_code`` when it is given. Events in any other state are
        left alone. Deleting an aggregate's dead letter lets its ordered claims go on.
        Returns how many were deleted."""
        pages, values = self._dead_letters(event_ids, error_code)
        statement = (self._sql.DELETE_FAILED if error_code is None else
                     self._sql.DELETE_FAILED_WITH_CODE)
        deleted = sum(self._run(statement, ids=self._family.id_list(ids), **values).rowcount
                      for ids in pages)
        if deleted:
            logger.info("deleted %s dead letters", deleted)
        return deleted

    def count_dead_letters(self, event_ids: Iterable[int] | None = None, *,
                           error_code: str | None = None) -> int:
        """How many dead letters the selection names (all, those in ``event_ids``, and/or
        those whose ``last_error_code`` is ``error_code``): what a dry run of
        :meth:`requeue_failed` or :meth:`delete_failed` reports. A plain read."""
        return int(self._dead_letter_query(event_ids, error_code).count())

    def list_dead_letters(self, event_ids: Iterable[int] | None = None, *,
                          error_code: str | None = None,
                          limit: int = 50) -> list[OutboxEvent]:
        """The dead letters the selection names (as :meth:`count_dead_letters`), at most
        ``limit``, oldest id first, without their payloads (``payload`` is None). A plain
        read that locks nothing."""
        limit = _checks.positive_int("limit", limit)
        model = self.model
        query = (self._dead_letter_query(event_ids, error_code)
                 .select(model.id, model.event_type, model.aggregate_type, model.aggregate_id,
                         model.last_error_code, model.last_error_message,
                         model.attempt_count, model.created_at, model.updated_at))
        return list(query.order_by(model.id).limit(limit))

    def _dead_letter_query(self, event_ids: Iterable[int] | None,
                           error_code: str | None) -> Any:
        model = self.model
        query = model.select().where(model.status == OutboxStatus.FAILED.value)
        if event_ids is not None:
            query = query.where(model.id.in_(_checks.event_ids(event_ids)))
        if error_code is not None:
            error_code = _checks.name("error_code", error_code, MAX_ERROR_CODE_LENGTH)
            query = query.where(model.last_error_code == error_code)
        return query

    # -- operations ---------------------------------------------------------------------

    def purge_published(self, older_than: dt.timedelta | float, *,
                        batch_size: int = 1000, max_batches: int | None = None) -> int:
        """Delete ``published`` events published more than ``older_than`` ago, in batches of
        ``batch_size`` rows (each DELETE at most 500 of them, by primary key), at most
        ``max_batches`` batches (None: until none is left). Returns how many were deleted.

        Run it in autocommit: then each batch commits alone and no lock is held for long.
        """
        age = _checks.duration("older_than", older_than)
        batch_size = _checks.positive_int("batch_size", batch_size, _checks.MAX_LIMIT)
        if max_batches is not None:
            max_batches = _checks.positive_int("max_batches", max_batches)
        cutoff = _checks.before("older_than", self._now(), age)
        deleted = 0
        for batch, ids in enumerate(self._pages(self._sql.OLD_PUBLISHED_PAGES, batch_size,
                                                caller_changes_rows=True, cutoff=cutoff), 1):
            # At most 500 ids a DELETE, whatever the batch: MariaDB turns an IN list of
            # in_predicate_conversion_threshold (1,000) values or more into a join that scans
            # the whole table, locking every row and gap it passes (writers would wait).
            for chunk in _chunks(ids):
                deleted += self._run(self._sql.PURGE_PUBLISHED,
                                     ids=self._family.id_list(chunk), cutoff=cutoff).rowcount
            if batch == max_batches:
                break
        if deleted:
            logger.info("purged %s published outbox events", deleted)
        return deleted

    def count_purgeable(self, older_than: dt.timedelta | float) -> int:
        """How many events :meth:`purge_published` would delete now (what a dry run
        reports); a plain read that locks nothing."""
        age = _checks.duration("older_than", older_than)
        cutoff = _checks.before("older_than", self._now(), age)
        model = self.model
        return int(model.select().where((model.status == OutboxStatus.PUBLISHED.value)
                                        & (model.published_at < cutoff)).count())

    def stats(self, lock_timeout: dt.timedelta | float | None = None) -> OutboxStats:
        """Counts per status, the oldest dispatchable event's wait, claims older than
        ``lock_timeout`` (None when not given), dead letters per ``last_error_code``, how
        many pending events wait behind a dead letter of their aggregate, and the age of the
        oldest publish (of the published event that became available first)."""
        timeout = None if lock_timeout is None else _checks.duration("lock_timeout",
                                                                      lock_timeout)
        now = self._now()
        expired_before = None if timeout is None else _checks.before("lock_timeout", now,
                                                                      timeout)
        counts = {status.value: 0 for status in OutboxStatus}
        counts.update(self._run(self._sql.COUNT_BY_STATUS).fetchall())
        oldest = self._run(self._sql.OLDEST_DISPATCHABLE, now=now).fetchone()[0]
        expired = None
        if expired_before is not None:
            expired = self._run(self._sql.COUNT_EXPIRED, cutoff=expired_before).fetchone()[0]
        dead = dict(self._run(self._sql.DEAD_BY_CODE).fetchall())
        held_back = self._run(self._sql.HELD_BACK).fetchone()[0] if dead else 0
        row = self._run(self._sql.OLDEST_PUBLISHED).fetchone() if counts["published"] else None
        published = None if row is None or row[0] is None else max(dt.timedelta(0),
                                                                   now - row[0])
        return OutboxStats(counts=counts,
                           oldest_pending_age=None if oldest is None else now - oldest,
                           expired_claims=expired, dead_letters_by_code=dead,
                           held_back=held_back, oldest_published_age=published)
