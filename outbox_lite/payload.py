"""The payload guard: JSON only, bounded in size and depth, and free of clear-text credentials.

:func:`encode_payload` turns a caller's payload into the exact JSON text that is stored, or
raises a :class:`~outbox_lite.errors.PayloadError` before any SQL runs; :func:`check_headers`
does the same for an event's headers. What a credential looks like, in a key or in text, is
the credential guard's to say (:mod:`outbox_lite._credentials`, which also redacts free text).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any, Callable, Collection

from ._credentials import (_INHERIT, _NAMED_PAIR, _NUMBERS, _STRINGS, _STRONG, _SUBTREE,
                           _credential_in_text, _is_placeholder, _json_may_hold_credential,
                           _key_kind, _normalise_key)
from .errors import CredentialInHeaderError, CredentialInPayloadError, PayloadError

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: MariaDB's JSON_VALID refuses documents nested 32 levels deep or more (MySQL allows 100).
MAX_DEPTH = 31
#: The integers MySQL's JSON type keeps as integers (int64 and uint64); beyond them it stores a
#: float (18446744073709551617 reads back as 1.8446744073709552e+19). Refused on both servers,
#: so that what one accepts the other keeps too.
MIN_INTEGER = -(2**63)
MAX_INTEGER = 2**64 - 1
#: A run of digits that may spell an integer beyond those (20 digits, or 19 after a minus, each
#: holds 19 in a row): only then does a payload on the fast path need its numbers looked at.
#: ASCII digits, as JSON writes numbers; one plain run is half the cost of the exact pattern.
#: Written as a set then a repeat: a pattern that starts with a set lets ``re`` skip to the next
#: digit in C, where ``[0-9]{19}`` tries the repeat at every character (half the cost again).
_LONG_DIGITS = re.compile(r"[0-9][0-9]{18}")
#: Stands in the error's JSON path for an object key that is itself a credential.
_REDACTED_KEY = "[<redacted key>]"
_CONTAINERS = (dict, list, tuple)
# Built once: json.dumps() with any non-default option builds a new encoder on every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _compact_encoder() -> Callable[[Any], str]:
    """``_ENCODER.encode``, for a dict or a list, without building the C encoder per call.

    ``JSONEncoder.encode`` makes a new C encoder on every call (its options and a fresh
    dict of the containers it is inside, for cycles). Here it is made once, without that
    dict (``check_circular=False``), so it keeps no state between calls and threads can
    share it: a cycle then ends in RecursionError, which :func:`encode_payload` turns into
    the same PayloadError (the exact walk stops at :data:`MAX_DEPTH`). Falls back to
    ``_ENCODER.encode`` where the C encoder is missing or is made differently; either way
    the text is checked against it once here."""
    make = getattr(json.encoder, "c_make_encoder", None)
    try:
        c_encode = make(None, _ENCODER.default, json.encoder.encode_basestring, None,  # type: ignore[misc]
                        _ENCODER.key_separator, _ENCODER.item_separator, False, False, False)

        def encode(payload: Any) -> str:
            return "".join(c_encode(payload, 0))

        probe = {"a": [1, -2.5, "\u00e9\n\"", None, True], "b": {}}
        if encode(probe) == _ENCODER.encode(probe):
            return encode
    except (TypeError, ValueError):  # no C encoder (None), or one with other arguments
        pass
    return _ENCODER.encode


_encode = _compact_encoder()


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------

#: Header-like objects: {"name": "X-Api-Key", "value": ...} (HAR, Postman, Kubernetes env).
_PAIR_NAME_FIELDS = ("name", "Name", "key", "Key", "header", "Header")
_PAIR_VALUE_FIELDS = ("value", "Value")


def _name_kind(name: object, allowed: Collection[str]) -> int:
    """What a key named ``name`` would refuse, unless the caller allowed it."""
    if not isinstance(name, str):
        return 0
    kind = _key_kind(name) & (_STRONG | _SUBTREE)
    if kind and allowed and _normalise_key(name) in allowed:
        return 0
    return kind


def _named_value(obj: dict[Any, Any], allowed: Collection[str]) -> tuple[str, int] | None:
    """For a {"name": ..., "value": ...} object whose name is sensitive: the value's field."""
    for field in _PAIR_VALUE_FIELDS:
        if field in obj:
            for name_field in _PAIR_NAME_FIELDS:
                kind = _name_kind(obj.get(name_field), allowed)
                if kind:
                    return field, kind
            return None
    return None


def _is_pair_list(items: list[Any] | tuple[Any, ...]) -> bool:
    """[["Accept", "json"], ["X-Api-Key", "..."]]: a list of [name, value] pairs."""
    return bool(items) and all(
        isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
        for item in items)


def _format_path(trail: list[str | int]) -> str:
    path = "$"
    for key in trail:
        if isinstance(key, int):
            path += f"[{key}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            path += f".{key}"
        else:
            path += f"[{json.dumps(key, ensure_ascii=False)}]"
    return path


def _check(value: Any, trail: list[str | int], level: int,
           allowed: Collection[str], scan: bool) -> None:
    """Raise PayloadError for a non-JSON shape, CredentialInPayloadError for a credential.

    ``trail`` is the list of keys down to ``value``, turned into a path only on error;
    ``level`` says what ``value`` may not be (the bits above, from the keys above it);
    ``scan`` False means no string can hold a credential-shaped value (see encode_payload).
    """
    if isinstance(value, str):
        if level & _STRINGS and value.strip() and not _is_placeholder(value.strip()):
            raise CredentialInPayloadError(_format_path(trail), "sensitive key")
        reason = scan and _credential_in_text(value)
        if reason:
            raise CredentialInPayloadError(_format_path(trail), reason)
    elif isinstance(value, dict):
        if len(trail) >= MAX_DEPTH:
            raise PayloadError(
                f"payload is nested deeper than {MAX_DEPTH} levels at {_format_path(trail)}")
        named = _named_value(value, allowed)
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"payload keys must be strings; {_format_path(trail)} "
                                   f"has a {type(key).__name__} key")
            reason = scan and _credential_in_text(key)
            if reason:  # the key is the secret: the path must not show it
                raise CredentialInPayloadError(_format_path(trail) + _REDACTED_KEY, reason)
            kind = _key_kind(key)
            if allowed and kind & _STRINGS and _normalise_key(key) in allowed:
                child = 0
            elif kind == _INHERIT or level & _SUBTREE:  # "new" under "password"; any key
                child = kind & ~_INHERIT | level & ~_NAMED_PAIR  # under "secrets"
            else:
                child = kind
            if named is not None and key == named[0]:
                child |= named[1]
            trail.append(key)
            _check(item, trail, child, allowed, scan)
            trail.pop()
    elif isinstance(value, (list, tuple)):
        if len(trail) >= MAX_DEPTH:
            raise PayloadError(
                f"payload is nested deeper than {MAX_DEPTH} levels at {_format_path(trail)}")
        pairs = _NAMED_PAIR if _is_pair_list(value) else 0
        for index, item in enumerate(value):
            child = level & ~_NAMED_PAIR | pairs
            if level & _NAMED_PAIR and index == 1:
                child |= _name_kind(value[0], allowed)
            trail.append(index)
            _check(item, trail, child, allowed, scan)
            trail.pop()
    elif value is None or isinstance(value, bool):
        return
    elif isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise PayloadError("payload has a non-finite number (NaN or Infinity) at "
                               + _format_path(trail))
        if isinstance(value, int) and not MIN_INTEGER <= value <= MAX_INTEGER:
            raise PayloadError(
                f"payload has an integer at {_format_path(trail)} beyond 64 bits (from -2**63"
                " to 2**64-1), which MySQL stores as an inexact float: send it as a string")
        if level & _NUMBERS:
            raise CredentialInPayloadError(_format_path(trail), "sensitive key")
    else:
        raise PayloadError(f"payload value at {_format_path(trail)} is a "
                           f"{type(value).__name__}, which is not JSON{_instead(value)}")


def _instead(value: Any) -> str:
    """What to send instead of ``value`` (a type JSON has no place for), or ""."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return ": send an ISO 8601 string (value.isoformat())"
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return ": send it as a string (str(value))"
    if isinstance(value, (set, frozenset)):
        return ": send a list"
    return ""


def _plain_keys(payload: Any) -> bool:
    """True when no key, [name, value] pair or name/value object in ``payload`` is sensitive.

    The cheap walk of encode_payload's fast path: any doubt (False) takes the exact walk.
    """
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key in value:  # a str subclass takes the exact walk, which accepts it
                if type(key) is not str or _key_kind(key) & _STRINGS:
                    return False
            if ("value" in value or "Value" in value) and _named_value(value, ()):
                return False
            value = value.values()
        elif len(value) == 2 and type(value[0]) is str and _key_kind(value[0]) & _STRINGS:
            return False
        for item in value:
            if isinstance(item, _CONTAINERS):
                stack.append(item)
    return True


def encode_payload(payload: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                   allowed_keys: Collection[str] = ()) -> str:
    """Return ``payload`` as compact JSON text, or raise a PayloadError.

    The payload must be a dict or a list of JSON values (str keys; no NaN/Infinity; integers
    from -2**63 to 2**64-1), at most :data:`MAX_DEPTH` levels deep and ``max_bytes`` of UTF-8
    JSON, and carry no credential:
    :class:`CredentialInPayloadError` names the first one's JSON path (with a key that is
    itself a credential masked). ``allowed_keys`` are key names the caller knows are safe
    (compared without case, ``_`` or ``-``).
    """
    if not isinstance(payload, _CONTAINERS):
        raise PayloadError(
            f"payload must be a JSON object (dict) or array (list), not {type(payload).__name__}")
    allowed = frozenset(map(_normalise_key, allowed_keys)) if allowed_keys else frozenset()
    try:
        text = _encode(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        _check(payload, [], 0, allowed, True)  # names the offending path
        raise PayloadError(f"payload is not JSON: {exc}") from exc
    # Without a backslash the JSON text holds every key and string exactly as given, so one
    # look at it tells whether any of them may hold a credential-shaped value; and it cannot
    # nest deeper than its brackets. Payloads that pass both need only their keys checked;
    # any doubt takes the exact walk, which also names the path.
    scan = "\\" in text or _json_may_hold_credential(text.lower())
    shallow = text.count("{") + text.count("[") <= MAX_DEPTH
    if scan or not shallow or _LONG_DIGITS.search(text) or not _plain_keys(payload):
        _check(payload, [], 0, allowed, scan)
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise PayloadError("payload has a string that is not valid Unicode "
                           "(a lone surrogate)") from exc
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes of JSON; the limit is {max_bytes}")
    return text


# ---------------------------------------------------------------------------
# Headers (SPEC §11)
# ---------------------------------------------------------------------------

MAX_HEADERS = 64
#: Names and values together, UTF-8.
MAX_HEADERS_BYTES = 8 * 1024
MAX_HEADER_NAME_LENGTH = 128
_HEADER_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: Names the publishers give meanings of their own (compared without case): outbox_lite's own
#: message headers, the NATS server's (``Nats-Msg-Id``, ``Nats-Expected-Stream`` …), the
#: CloudEvents attributes of both bindings (and the NATS binding's ``content-type``), and
#: RabbitMQ's sender-selected distribution (``CC``/``BCC`` route a message to more queues).
_RESERVED_PREFIXES = ("outbox-", "nats-", "ce-", "ce_", "cloudevents:", "cloudevents_")
_RESERVED_NAMES = frozenset({"cc", "bcc", "content-type"})
#: Control characters break NATS and HTTP-style headers (a CR/LF ends one).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def check_headers(headers: Any, *, allowed_keys: Collection[str] = ()) -> dict[str, str]:
    """Return ``headers`` as a plain dict of str to str, or raise before any SQL.

    At most :data:`MAX_HEADERS` entries and :data:`MAX_HEADERS_BYTES` of UTF-8 names and
    values in all; names of 1-128 letters, digits and ``-_.:``, none reserved by a publisher
    (``outbox-*``, ``nats-*``, ``ce-*``, ``cloudEvents_*``, ``content-type``, ``cc``, ``bcc``);
    values without control characters or white space at either end (NATS trims it). A credential is a
    :class:`~outbox_lite.errors.CredentialInHeaderError` (a CredentialInPayloadError) that
    names the header, never its value: a name that names one (``Authorization``,
    ``Cookie``, ``X-Api-Key``; unless in ``allowed_keys``) or a value shaped like one.
    """
    if not isinstance(headers, Mapping):
        raise PayloadError(f"headers must be a mapping of str to str, not "
                           f"{type(headers).__name__}")
    if len(headers) > MAX_HEADERS:
        raise PayloadError(f"headers has {len(headers)} entries; the limit is {MAX_HEADERS}")
    allowed = frozenset(map(_normalise_key, allowed_keys)) if allowed_keys else frozenset()
    checked: dict[str, str] = {}
    size = 0
    for name, value in headers.items():
        if not isinstance(name, str):
            raise PayloadError(f"header names must be str, not {type(name).__name__}")
        if _credential_in_text(name):  # the name is the secret: it must not be shown
            raise CredentialInHeaderError("<redacted>", "a header name shaped like a credential")
        if not _HEADER_NAME.fullmatch(name):
            raise PayloadError(
                f"header name {name[:MAX_HEADER_NAME_LENGTH]!r} must be 1-"
                f"{MAX_HEADER_NAME_LENGTH} letters, digits and -_.:")
        lowered = name.lower()
        if lowered in _RESERVED_NAMES or lowered.startswith(_RESERVED_PREFIXES):
            raise PayloadError(f"header name {name!r} is reserved (outbox-*, nats-*, ce-*, "
                               "cloudEvents_*, content-type, cc and bcc mean something to "
                               "the publishers)")
        if not isinstance(value, str):
            raise PayloadError(f"header {name!r} must be a str, not {type(value).__name__}")
        if _key_kind(name) & _STRINGS and _normalise_key(name) not in allowed:
            raise CredentialInHeaderError(name, "sensitive header name")
        if _CONTROL.search(value):
            raise PayloadError(f"header {name!r} has a control character")
        if value != value.strip(" \t"):
            raise PayloadError(f"header {name!r} starts or ends with white space")
        reason = _credential_in_text(value)
        if reason:
            raise CredentialInHeaderError(name, reason)
        try:
            size += len(name) + len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise PayloadError(f"header {name!r} is not valid Unicode (a lone "
                               "surrogate)") from None
        checked[name] = value
    if size > MAX_HEADERS_BYTES:
        raise PayloadError(f"headers are {size} bytes of names and values; the limit is "
                           f"{MAX_HEADERS_BYTES}")
    return checked


def headers_size(headers: dict[str, str]) -> int:
    """Bytes of names and values (UTF-8), as :func:`check_headers` counts them."""
    return sum(len(name) + len(value.encode("utf-8")) for name, value in headers.items())


def encode_headers(headers: dict[str, str]) -> str | None:
    """Checked headers as the JSON text stored in column ``headers`` (None when empty)."""
    return _encode(headers) if headers else None
