"""Argument checks shared by the repository and the inbox: each raises before any SQL (most
with InvalidEventError)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Callable, Iterable

from ._families import family_of
from .errors import InvalidEventError
from .models import MAX_NAME_LENGTH, to_utc

#: DATETIME's range; an instant outside it would be refused or mangled by the server.
_MIN_INSTANT = dt.datetime(1000, 1, 1)
_MAX_INSTANT = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
MAX_LIMIT = 10_000
#: The longest duration (a lock timeout, a purge age) the API takes: 100 years.
MAX_DURATION = dt.timedelta(days=36_500)
MAX_DURATION_SECONDS = MAX_DURATION.total_seconds()
MAX_DURATION_TEXT = "36500 days (100 years)"


def database(value: Any) -> Any:
    """The caller's Peewee database, checked by its family (:func:`~outbox_lite._families.
    family_of`, once per object): TypeError for a database no family takes; ValueError for
    a MySQL connection whose charset is not utf8mb4 (an emoji would be stored as '?')."""
    family_of(value)
    return value


def name(field: str, value: Any, max_length: int = MAX_NAME_LENGTH) -> str:
    """A non-blank identifier-like string of at most ``max_length`` characters.

    Leading or trailing white space is refused: MySQL compares VARCHARs with trailing
    spaces ignored, so "a" and "a " would be the same key.
    """
    if not isinstance(value, str):
        raise InvalidEventError(f"{field} must be a str, not {type(value).__name__}")
    stripped = value.strip()  # once: a write checks four names
    if not stripped:
        raise InvalidEventError(f"{field} must not be empty")
    if len(stripped) != len(value):  # strip() only takes away: same length, same text
        raise InvalidEventError(f"{field} must not start or end with white space")
    if len(value) > max_length:
        raise InvalidEventError(
            f"{field} is {len(value)} characters long; the limit is {max_length}")
    if not value.isprintable():  # also refuses NUL and lone surrogates (not valid UTF-8)
        raise InvalidEventError(
            f"{field} must hold printable characters only (no control characters, no lone "
            "surrogates)")
    return value


def instant(field: str, value: Any) -> dt.datetime:
    """An aware datetime within DATETIME's range, returned as naive UTC."""
    if not isinstance(value, dt.datetime):
        raise InvalidEventError(
            f"{field} must be a timezone-aware datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidEventError(
            f"{field} must be timezone-aware (e.g. datetime.now(timezone.utc)); "
            "a naive datetime is ambiguous")
    try:
        utc = to_utc(value)
    except OverflowError as exc:
        raise InvalidEventError(f"{field} is out of range once converted to UTC") from exc
    if not _MIN_INSTANT <= utc <= _MAX_INSTANT:
        raise InvalidEventError(f"{field} must lie between years 1000 and 9999 (UTC)")
    return utc


def positive_int(field: str, value: Any, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEventError(f"{field} must be an int, not {type(value).__name__}")
    if value < 1:
        raise InvalidEventError(f"{field} must be at least 1, not {value}")
    if maximum is not None and value > maximum:
        raise InvalidEventError(f"{field} must be at most {maximum}, not {value}")
    return value


MAX_EVENT_ID = 2 ** 63 - 1


def event_id(value: Any) -> int:
    return positive_int("event_id", value, MAX_EVENT_ID)


def event_ids(value: Any) -> list[int]:
    """The distinct ids of ``value``, sorted, each checked as :func:`event_id` checks it.
    Ids that are all ints (a relay's batch) are checked as a whole: their types in one set,
    their range by the smallest and the largest; any other id gets ``event_id``'s check and
    its error."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidEventError("event_ids must be an iterable of ints or None")
    values = list(value)
    if set(map(type, values)) == {int}:
        ids = sorted(set(values))
        if ids[0] >= 1 and ids[-1] <= MAX_EVENT_ID:
            return ids
    return sorted({event_id(v) for v in values})


def duration(field: str, value: Any) -> dt.timedelta:
    """A positive timedelta, or a positive finite number of seconds, of at most
    :data:`MAX_DURATION` (longer ones would push instants out of DATETIME's range)."""
    if isinstance(value, dt.timedelta):
        result = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise InvalidEventError(f"{field} must be a finite number of seconds")
        # Both bounds before timedelta(), which overflows on -1e300 as on 1e300.
        if value <= 0:
            raise InvalidEventError(f"{field} must be positive, not {value!r}")
        if value > MAX_DURATION_SECONDS:
            raise InvalidEventError(f"{field} must be at most {MAX_DURATION_TEXT}")
        result = dt.timedelta(seconds=value)
    else:
        raise InvalidEventError(
            f"{field} must be a timedelta or seconds, not {type(value).__name__}")
    if result <= dt.timedelta(0):
        raise InvalidEventError(f"{field} must be positive, not {value!r}")
    if result > MAX_DURATION:
        raise InvalidEventError(f"{field} must be at most {MAX_DURATION_TEXT}")
    return result


def before(field: str, now: dt.datetime, age: dt.timedelta) -> dt.datetime:
    """The instant ``age`` before ``now`` (naive UTC), refused when it falls before DATETIME's
    first year (an injected clock can sit anywhere)."""
    try:
        cutoff = now - age
    except OverflowError:
        cutoff = dt.datetime.min
    if cutoff < _MIN_INSTANT:
        raise InvalidEventError(f"{field} reaches back before the year 1000")
    return cutoff


def flag(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidEventError(f"{field} must be a bool, not {type(value).__name__}")
    return value


def bounded_text(field: str, value: Any, max_bytes: int) -> str:
    """A str cut to at most ``max_bytes`` of UTF-8, never inside a character."""
    if not isinstance(value, str):
        raise InvalidEventError(f"{field} must be a str, not {type(value).__name__}")
    data = value.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    marker = " …[truncated]"
    room = max_bytes - len(marker.encode("utf-8"))
    return data[:room].decode("utf-8", "ignore") + marker


def utc_now() -> dt.datetime:
    """The host's clock, aware, in UTC: only for a caller that passes it as ``clock`` (the
    default is the database server's, :mod:`outbox_lite._clock`)."""
    return dt.datetime.now(dt.timezone.utc)


def _naive_utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def clock(value: Any) -> Callable[[], dt.datetime]:
    """A reader of ``value()`` as naive UTC, the form stored in ``DATETIME(6)``.

    Raises TypeError when ``value`` is not callable. A clock other than :func:`utc_now` is
    called once now and checked on every reading (InvalidEventError unless it returns an
    aware datetime within DATETIME's range), so a test's clock cannot store a wrong instant.
    """
    if not callable(value):
        raise TypeError("clock must be a callable returning an aware datetime")
    if value is utc_now:
        return _naive_utc_now

    def now() -> dt.datetime:
        return instant("clock()", value())

    now()
    return now
