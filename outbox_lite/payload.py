"""The payload guard: JSON only, bounded in size and depth, and free of clear-text credentials.

:func:`encode_payload` turns a caller's payload into the exact JSON text that is stored, or
raises a :class:`~outbox_lite.errors.PayloadError` before any SQL runs. :func:`redact` masks the
same credential shapes in free text (stored error messages).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Any, Callable, Collection, Iterator, NamedTuple

from .errors import CredentialInPayloadError, PayloadError

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: MariaDB's JSON_VALID refuses documents nested 32 levels deep or more (MySQL allows 100).
MAX_DEPTH = 31
_MASK = "***"


# ---------------------------------------------------------------------------
# Sensitive keys
# ---------------------------------------------------------------------------

# A key is sensitive when its last word, or its last two words, name a credential:
# "password", "db_password", "clientSecret", "X-Api-Key" are; "tokenCount",
# "passwordChangedAt", "max_tokens", "secret_name" are not.
_SENSITIVE_LAST_WORDS = frozenset({
    "password", "passwd", "pwd", "passphrase", "secret", "token", "authorization",
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


def _normalise_key(key: str) -> str:
    return "".join(_key_words(key))


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
    pattern: re.Pattern[str]
    check: Callable[[str], bool] | None = None  # applied to the "secret" group


_SHAPES = (
    _Shape("PEM private key", re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?P<secret>[\s\S]*?)"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|$)")),
    _Shape("URL with a password", re.compile(
        r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s/:@]*:(?P<secret>[^\s/@]+)@")),
    _Shape("bearer token", re.compile(
        r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)"), _has_digit_and_letter),
    _Shape("basic auth header", re.compile(
        r"(?i)\bbasic\s+(?P<secret>[A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])"),
        _is_basic_credential),
    _Shape("JWT", re.compile(
        r"\b(?P<secret>eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{10,})")),
    _Shape("cloud access key", re.compile(
        r"\b(?P<secret>(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16})\b")),
    _Shape("Google API key", re.compile(r"\b(?P<secret>AIza[0-9A-Za-z_\-]{35})")),
    _Shape("GitHub token", re.compile(
        r"\b(?P<secret>gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})")),
    _Shape("GitLab token", re.compile(r"\b(?P<secret>glpat-[A-Za-z0-9_\-]{20,})")),
    _Shape("Slack token", re.compile(r"\b(?P<secret>xox[abposr]-[A-Za-z0-9\-]{10,})")),
    _Shape("Slack webhook", re.compile(
        r"hooks\.slack\.com/services/(?P<secret>[A-Za-z0-9]+/[A-Za-z0-9]+/[A-Za-z0-9]+)")),
    _Shape("Stripe key", re.compile(r"\b(?P<secret>[sr]k_(?:live|test)_[A-Za-z0-9]{16,})")),
    _Shape("API secret key", re.compile(r"\b(?P<secret>sk-[A-Za-z0-9_\-]{20,})"),
           _has_digit_and_letter),
    _Shape("npm token", re.compile(r"\b(?P<secret>npm_[A-Za-z0-9]{36})\b")),
    _Shape("SendGrid key", re.compile(
        r"\b(?P<secret>SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,})")),
    _Shape("Azure account key", re.compile(
        r"(?i)\b(?:AccountKey|SharedAccessKey)=(?P<secret>[A-Za-z0-9+/=]{16,})")),
    # key=value inside text: a query string, a connection string, a log line.
    _Shape("key=value secret", re.compile(
        r"(?i)\b(?:password|passwd|pwd|secret|token|api[_\-]?key|access[_\-]?key|"
        r"client[_\-]?secret)(?:=|:(?=\S))(?P<secret>[^\s&;,'\"]{3,})")),
)


def _credential_in_text(text: str) -> str | None:
    for shape in _SHAPES:
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

def _child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _walk(value: Any, path: str, depth: int, sensitive: bool,
          allowed: Collection[str]) -> Iterator[tuple[str, str]]:
    """Yield (path, reason) for each credential; raise PayloadError for non-JSON shapes."""
    if isinstance(value, dict):
        if depth > MAX_DEPTH:
            raise PayloadError(f"payload is nested deeper than {MAX_DEPTH} levels at {path}")
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(
                    f"payload keys must be strings; {path} has a {type(key).__name__} key")
            child = _child_path(path, key)
            reason = _credential_in_text(key)
            if reason:
                yield child, reason
            key_is_sensitive = (is_sensitive_key(key)
                                and _normalise_key(key) not in allowed)
            yield from _walk(item, child, depth + 1, key_is_sensitive, allowed)
    elif isinstance(value, (list, tuple)):
        if depth > MAX_DEPTH:
            raise PayloadError(f"payload is nested deeper than {MAX_DEPTH} levels at {path}")
        for index, item in enumerate(value):
            yield from _walk(item, _child_path(path, index), depth + 1, sensitive, allowed)
    elif isinstance(value, str):
        if sensitive and value.strip():
            yield path, "sensitive key"
        else:
            reason = _credential_in_text(value)
            if reason:
                yield path, reason
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise PayloadError(f"payload has a non-finite number (NaN or Infinity) at {path}")
        if sensitive:
            yield path, "sensitive key"
    else:
        raise PayloadError(
            f"payload value at {path} is a {type(value).__name__}, which is not JSON")


def encode_payload(payload: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                   allowed_keys: Collection[str] = ()) -> str:
    """Return ``payload`` as compact JSON text, or raise a PayloadError.

    The payload must be a dict or a list of JSON values (str keys; no NaN/Infinity), at most
    :data:`MAX_DEPTH` levels deep and ``max_bytes`` of UTF-8 JSON, and carry no credential:
    :class:`CredentialInPayloadError` names the first one's JSON path. ``allowed_keys`` are key
    names the caller knows are safe (compared without case, ``_`` or ``-``).
    """
    if not isinstance(payload, (dict, list, tuple)):
        raise PayloadError(
            f"payload must be a JSON object (dict) or array (list), not {type(payload).__name__}")
    allowed = frozenset(_normalise_key(k) for k in allowed_keys)
    for path, reason in _walk(payload, "$", 1, False, allowed):
        raise CredentialInPayloadError(path, reason)
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise PayloadError("payload has a string that is not valid Unicode "
                           "(a lone surrogate)") from exc
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes of JSON; the limit is {max_bytes}")
    return text
