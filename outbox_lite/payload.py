"""The payload guard: JSON only, bounded in size and depth, and free of clear-text credentials.

:func:`encode_payload` turns a caller's payload into the exact JSON text that is stored, or
raises a :class:`~outbox_lite.errors.PayloadError` before any SQL runs. :func:`redact` masks the
same credential shapes in free text (stored error messages).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
from typing import Any, Callable, Collection, Iterable, NamedTuple

from .errors import CredentialInPayloadError, PayloadError

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: MariaDB's JSON_VALID refuses documents nested 32 levels deep or more (MySQL allows 100).
MAX_DEPTH = 31
_MASK = "***"
_CONTAINERS = (dict, list, tuple)
# Built once: json.dumps() with any non-default option builds a new encoder on every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# ---------------------------------------------------------------------------
# Sensitive keys
# ---------------------------------------------------------------------------

# A key is sensitive when its last word, or its last two words, name a credential:
# "password", "db_password", "clientSecret", "X-Api-Key" are; "tokenCount",
# "passwordChangedAt", "max_tokens", "secret_name" are not.
_SENSITIVE_LAST_WORDS = frozenset({
    "password", "passwd", "pass", "pwd", "passphrase", "secret", "token", "authorization",
    "cookie", "cookies", "credential", "credentials", "apikey", "privatekey", "secretkey",
    "accesskey", "sessionid", "bearer", "jwt", "dsn",
})
_SENSITIVE_LAST_PAIRS = frozenset({
    ("api", "key"), ("api", "keys"), ("private", "key"), ("private", "keys"),
    ("secret", "key"), ("access", "key"), ("signing", "key"), ("encryption", "key"),
    ("master", "key"), ("session", "id"), ("session", "key"), ("auth", "header"),
    ("connection", "string"), ("conn", "str"),
})
_WORD_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def _key_words(key: str) -> list[str]:
    return [w.lower() for w in _WORD_RE.findall(key)]


@functools.lru_cache(maxsize=4096)
def _normalise_key(key: str) -> str:
    return "".join(_key_words(key))


@functools.lru_cache(maxsize=4096)
def is_sensitive_key(key: str) -> bool:
    """True when ``key`` names a credential (its last word or last two words do)."""
    words = _key_words(key)
    if not words:
        return False
    if words[-1] in _SENSITIVE_LAST_WORDS:
        return True
    return len(words) >= 2 and (words[-2], words[-1]) in _SENSITIVE_LAST_PAIRS


# ---------------------------------------------------------------------------
# Credential-shaped values
# ---------------------------------------------------------------------------

def _has_digit_and_letter(token: str) -> bool:
    return any(c.isdigit() for c in token) and any(c.isalpha() for c in token)


def _is_basic_credential(token: str) -> bool:
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
        text = decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    user, sep, password = text.partition(":")
    return bool(sep and user and password and text.isprintable())


class _Shape(NamedTuple):
    reason: str
    triggers: tuple[str, ...]  # lower-case; the pattern can only match text holding one
    pattern: re.Pattern[str]
    check: Callable[[str], bool] | None = None  # applied to the "secret" group


_SHAPES = (
    _Shape("PEM private key", ("private key",), re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?P<secret>[\s\S]*?)"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|$)")),
    _Shape("URL with a password", ("://",), re.compile(
        r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s/:@]*:(?P<secret>[^\s/@]+)@")),
    _Shape("bearer token", ("bearer",), re.compile(
        r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)"), _has_digit_and_letter),
    _Shape("basic auth header", ("basic",), re.compile(
        r"(?i)\bbasic\s+(?P<secret>[A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])"),
        _is_basic_credential),
    _Shape("JWT", ("eyj",), re.compile(
        r"\b(?P<secret>eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{10,})")),
    _Shape("cloud access key",
           ("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa"), re.compile(
               r"\b(?P<secret>(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16})\b")),
    _Shape("Google API key", ("aiza",), re.compile(r"\b(?P<secret>AIza[0-9A-Za-z_\-]{35})")),
    _Shape("GitHub token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"), re.compile(
        r"\b(?P<secret>gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})")),
    _Shape("GitLab token", ("glpat-",), re.compile(r"\b(?P<secret>glpat-[A-Za-z0-9_\-]{20,})")),
    _Shape("Slack token", ("xox",), re.compile(r"\b(?P<secret>xox[abposr]-[A-Za-z0-9\-]{10,})")),
    _Shape("Slack webhook", ("hooks.slack.com",), re.compile(
        r"hooks\.slack\.com/services/(?P<secret>[A-Za-z0-9]+/[A-Za-z0-9]+/[A-Za-z0-9]+)")),
    _Shape("Stripe key", ("k_live_", "k_test_"), re.compile(
        r"\b(?P<secret>[sr]k_(?:live|test)_[A-Za-z0-9]{16,})")),
    _Shape("API secret key", ("sk-",), re.compile(r"\b(?P<secret>sk-[A-Za-z0-9_\-]{20,})"),
           _has_digit_and_letter),
    _Shape("npm token", ("npm_",), re.compile(r"\b(?P<secret>npm_[A-Za-z0-9]{36})\b")),
    _Shape("SendGrid key", ("sg.",), re.compile(
        r"\b(?P<secret>SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,})")),
    _Shape("Azure account key", ("accountkey=", "sharedaccesskey="), re.compile(
        r"(?i)\b(?:AccountKey|SharedAccessKey)=(?P<secret>[A-Za-z0-9+/=]{16,})")),
    # key=value inside text: a query string, a connection string, a log line.
    _Shape("key=value secret", ("pass", "pwd", "secret", "token", "key=", "key:"), re.compile(
        r"(?i)\b(?:password|passwd|pwd|secret|token|api[_\-]?key|access[_\-]?key|"
        r"client[_\-]?secret)(?:=|:(?=\S))(?P<secret>[^\s&;,'\"]{3,})")),
)
_SHORTEST_SHAPE = 7  # "pwd=abc", "a://:b@": nothing shorter can hold a credential
_TRIGGERS = tuple(dict.fromkeys(t for shape in _SHAPES for t in shape.triggers))


def _may_hold_credential(text: str) -> bool:
    """False when no shape can match ``text``: a cheap test of literal triggers."""
    lowered = text.lower()
    for trigger in _TRIGGERS:  # a plain loop: cheaper than any() over a generator
        if trigger in lowered:
            return True
    return False


def _credential_in_text(text: str) -> str | None:
    if len(text) < _SHORTEST_SHAPE:
        return None
    lowered = text.lower()
    for shape in _SHAPES:
        if any(t in lowered for t in shape.triggers):
            for match in shape.pattern.finditer(text):
                if shape.check is None or shape.check(match.group("secret")):
                    return shape.reason
    return None


def redact(text: str) -> str:
    """Return ``text`` with every credential-shaped part replaced by ``***``."""
    for shape in _SHAPES:
        def mask(match: re.Match[str], shape: _Shape = shape) -> str:
            secret = match.group("secret")
            if shape.check is not None and not shape.check(secret):
                return match.group(0)
            start, end = match.span("secret")
            offset = match.start()
            whole = match.group(0)
            return whole[: start - offset] + _MASK + whole[end - offset:]
        text = shape.pattern.sub(mask, text)
    return text


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------

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


def _check(value: Any, trail: list[str | int], sensitive: bool,
           allowed: Collection[str], scan: bool) -> None:
    """Raise PayloadError for a non-JSON shape, CredentialInPayloadError for a credential.

    ``trail`` is the list of keys down to ``value``, turned into a path only on error;
    ``scan`` False means no string can hold a credential-shaped value (see encode_payload).
    """
    if isinstance(value, str):
        if sensitive and value.strip():
            raise CredentialInPayloadError(_format_path(trail), "sensitive key")
        reason = scan and _credential_in_text(value)
        if reason:
            raise CredentialInPayloadError(_format_path(trail), reason)
    elif isinstance(value, _CONTAINERS):
        if len(trail) >= MAX_DEPTH:
            raise PayloadError(
                f"payload is nested deeper than {MAX_DEPTH} levels at {_format_path(trail)}")
        is_dict = isinstance(value, dict)
        items: Iterable[tuple[Any, Any]] = (
            value.items() if isinstance(value, dict) else enumerate(value))
        for key, item in items:
            child_sensitive = sensitive
            if is_dict:
                if not isinstance(key, str):
                    raise PayloadError(f"payload keys must be strings; {_format_path(trail)} "
                                       f"has a {type(key).__name__} key")
                trail.append(key)
                reason = scan and _credential_in_text(key)
                if reason:
                    raise CredentialInPayloadError(_format_path(trail), reason)
                child_sensitive = is_sensitive_key(key) and _normalise_key(key) not in allowed
            else:
                trail.append(key)
            _check(item, trail, child_sensitive, allowed, scan)
            trail.pop()
    elif value is None or isinstance(value, bool):
        return
    elif isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise PayloadError("payload has a non-finite number (NaN or Infinity) at "
                               + _format_path(trail))
        if sensitive:
            raise CredentialInPayloadError(_format_path(trail), "sensitive key")
    else:
        raise PayloadError(f"payload value at {_format_path(trail)} is a "
                           f"{type(value).__name__}, which is not JSON")


def _plain_keys(payload: Any) -> bool:
    """True when every dict key in ``payload`` is a str that names no credential."""
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key in value:  # a str subclass takes the exact walk, which accepts it
                if type(key) is not str or is_sensitive_key(key):
                    return False
            value = value.values()
        for item in value:
            if isinstance(item, _CONTAINERS):
                stack.append(item)
    return True


def encode_payload(payload: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                   allowed_keys: Collection[str] = ()) -> str:
    """Return ``payload`` as compact JSON text, or raise a PayloadError.

    The payload must be a dict or a list of JSON values (str keys; no NaN/Infinity), at most
    :data:`MAX_DEPTH` levels deep and ``max_bytes`` of UTF-8 JSON, and carry no credential:
    :class:`CredentialInPayloadError` names the first one's JSON path. ``allowed_keys`` are key
    names the caller knows are safe (compared without case, ``_`` or ``-``).
    """
    if not isinstance(payload, _CONTAINERS):
        raise PayloadError(
            f"payload must be a JSON object (dict) or array (list), not {type(payload).__name__}")
    allowed = frozenset(map(_normalise_key, allowed_keys)) if allowed_keys else frozenset()
    try:
        text = _ENCODER.encode(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        _check(payload, [], False, allowed, True)  # names the offending path
        raise PayloadError(f"payload is not JSON: {exc}") from exc
    # Without a backslash the JSON text holds every key and string exactly as given, so one
    # look at it tells whether any of them may hold a credential-shaped value; and it cannot
    # nest deeper than its brackets. Payloads that pass both need only their keys checked;
    # any doubt takes the exact walk, which also names the path.
    scan = "\\" in text or _may_hold_credential(text)
    shallow = text.count("{") + text.count("[") <= MAX_DEPTH
    if scan or not shallow or not _plain_keys(payload):
        _check(payload, [], False, allowed, scan)
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise PayloadError("payload has a string that is not valid Unicode "
                           "(a lone surrogate)") from exc
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes of JSON; the limit is {max_bytes}")
    return text
