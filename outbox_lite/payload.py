"""The payload guard: JSON only, bounded in size and depth, and free of clear-text credentials.

:func:`encode_payload` turns a caller's payload into the exact JSON text that is stored, or
raises a :class:`~outbox_lite.errors.PayloadError` before any SQL runs. :func:`redact` masks, in
free text (stored error messages, printed errors), the same credential shapes that the guard
refuses in payload values: one table of rules, :data:`_SHAPES`, serves both.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import functools
import json
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any, Callable, Collection, Iterator, NamedTuple

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
_LONG_DIGITS = re.compile(r"[0-9]{19}")
_MASK = "***"
#: Stands in the error's JSON path for an object key that is itself a credential.
_REDACTED_KEY = "[<redacted key>]"
_CONTAINERS = (dict, list, tuple)
# Built once: json.dumps() with any non-default option builds a new encoder on every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# ---------------------------------------------------------------------------
# Sensitive key names
# ---------------------------------------------------------------------------

# A key is read as words ("X-Api-Key": x api key; "clientSecret": client secret; "DB_PASS":
# db pass). Its last word, or its last two, say whether it names a credential: "password",
# "db_password" and "X-Api-Key" do; "tokenCount", "passwordChangedAt" and "secret_name" do not.
# The same reading judges NAME=value and "name: value" in free text.

# What a sensitive key refuses below it, as bits.
_STRINGS = 1  # a non-blank string
_NUMBERS = 2  # a number
_SUBTREE = 4  # every key below it is sensitive too (a map of secrets)
_NAMED_PAIR = 8  # (in the walk) this 2-list is a [name, value] pair of a list of pairs
_INHERIT = 16  # (a key of same-value words only: "new", "value") as sensitive as its parent
_STRONG = _STRINGS | _NUMBERS

_CREDENTIAL_WORDS = {
    **dict.fromkeys((
        "password", "passwd", "pwd", "passphrase", "secret", "token", "authorization",
        "cookie", "credential", "apikey", "privatekey", "secretkey", "accesskey", "sshkey",
        "sessionid", "sessid", "bearer", "jwt", "dsn", "sig"), _STRONG),
    # Plurals name collections of credentials: everything below them is refused.
    **dict.fromkeys((
        "passwords", "secrets", "credentials", "cookies", "apikeys", "privatekeys",
        "secretkeys", "accesskeys"), _STRONG | _SUBTREE),
    # "pass" is also a ticket or a test count: strings only, and see _INNOCENT_BEFORE.
    "pass": _STRINGS,
}
_KEY_QUALIFIERS = frozenset({
    "api", "private", "secret", "access", "signing", "encryption", "master", "session", "ssh",
    "ssl", "tls", "hmac", "shared", "account", "deploy", "auth", "sas"})
#: Last two words that name a credential together: {last word: {word before it: bits}}.
_CREDENTIAL_PAIRS = {
    "key": dict.fromkeys(_KEY_QUALIFIERS, _STRONG),
    "keys": dict.fromkeys(_KEY_QUALIFIERS, _STRONG | _SUBTREE),
    "id": {"session": _STRONG},
    "header": {"auth": _STRONG},
    "string": {"connection": _STRONG},
    "str": {"conn": _STRONG},
}
#: Words before a credential word that give it an innocent sense: a pagination or tokenizer
#: token, a boarding or season pass.
_INNOCENT_BEFORE = {
    "token": frozenset({
        "page", "pagination", "next", "prev", "previous", "continuation", "cursor", "sync",
        "resume", "max", "min", "num", "total", "eos", "bos", "pad", "unk", "sep", "cls", "mask",
        "stop", "start", "end", "special"}),
    "pass": frozenset({
        "boarding", "bus", "day", "season", "hall", "ski", "travel", "transit", "train", "rail",
        "metro", "event", "guest", "visitor", "vip", "press", "backstage", "gym", "museum",
        "park", "parking", "festival", "weekly", "monthly", "annual", "yearly", "first",
        "second", "third", "final", "last", "single", "multi", "render", "test", "free"}),
}
#: Trailing words that keep the sense of the words before them: "password_confirmation",
#: "token_v2", "secret_value" are as sensitive as "password", "token", "secret".
_SAME_VALUE_WORDS = frozenset({
    "confirmation", "confirm", "again", "repeat", "retype", "verify", "new", "old", "current",
    "plain", "plaintext", "clear", "cleartext", "raw", "value", "val", "b64", "base64",
    "encoded", "input", "str", "string", "text", "v"})
#: One-word keys that end in a credential word: "newpassword", "PGPASSWORD", "csrftoken",
#: "JSESSIONID".
_COMPOUND_ENDINGS = ("password", "passwd", "passphrase", "secret", "token", "apikey",
                     "sessionid", "sessid")
_WORD_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def _key_words(key: str) -> list[str]:
    return [w.lower() for w in _WORD_RE.findall(key)]


@functools.lru_cache(maxsize=4096)
def _normalise_key(key: str) -> str:
    return "".join(_key_words(key))


def _words_kind(words: list[str]) -> int:
    last = words[-1]
    before = words[-2] if len(words) > 1 else ""
    if last not in _CREDENTIAL_WORDS:
        for ending in _COMPOUND_ENDINGS:
            if last.endswith(ending) and last != ending:
                before, last = last[: -len(ending)], ending
                break
    if before in _INNOCENT_BEFORE.get(last, ()):
        return 0
    return _CREDENTIAL_WORDS.get(last) or _CREDENTIAL_PAIRS.get(last, {}).get(before, 0)


@functools.lru_cache(maxsize=4096)
def _key_kind(key: str) -> int:
    """What ``key`` refuses below it (the bits above); 0 for an ordinary key."""
    words = _key_words(key)
    while words:
        kind = _words_kind(words)
        if kind or not (words[-1] in _SAME_VALUE_WORDS or words[-1].isdigit()):
            return kind
        words.pop()
    return _INHERIT if _WORD_RE.search(key) else 0


def is_sensitive_key(key: str) -> bool:
    """True when ``key`` names a credential (its last word or last two words do)."""
    return bool(_key_kind(key) & _STRINGS)


_PLACEHOLDER = re.compile(
    r"\*+|x{3,}|X{3,}|\$\{[^}]*\}|\$[A-Z_][A-Z0-9_]*|\{\{[^}]*\}\}|<[^<>]*>|%\([^)]*\)s"
    r"|(?i:\[?(?:redacted|masked|hidden|null|none|nil|undefined|empty|true|false)\]?)")


def _is_placeholder(value: str) -> bool:
    """A mask or a reference in place of a secret: ``***``, ``${DB_PASSWORD}``, ``<password>``."""
    return _PLACEHOLDER.fullmatch(value) is not None


# ---------------------------------------------------------------------------
# Credential-shaped text
# ---------------------------------------------------------------------------

Span = tuple[int, int]


class _Shape(NamedTuple):
    reason: str
    #: Lower-case literals: text (lower-cased) that holds none of them cannot match the shape.
    anchors: tuple[str, ...]
    #: The spans of ``text`` that hold a credential of this shape (the parts redact() masks).
    spans: Callable[[str], Iterator[Span]]
    #: A regex for the lower-cased text, run when an anchor is there: where it finds nothing,
    #: the shape cannot match either (it spares common anchors such as "://" the full rule).
    trigger: str | None = None
    #: The trigger for JSON text without a backslash, when it differs (see encode_payload).
    json_trigger: str | None = None


def _regex(pattern: str, check: Callable[[re.Match[str]], bool] | None = None
           ) -> Callable[[str], Iterator[Span]]:
    """Spans of the group ``secret`` of each match of ``pattern`` that passes ``check``."""
    compiled = re.compile(pattern)

    def spans(text: str) -> Iterator[Span]:
        for match in compiled.finditer(text):
            if check is None or check(match):
                yield match.span("secret")
    return spans


def _has_digit_and_letter(match: re.Match[str]) -> bool:
    token = match.group("secret")
    return any(c.isdigit() for c in token) and any(c.isalpha() for c in token)


def _is_basic_credential(match: re.Match[str]) -> bool:
    token = match.group("secret")
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
        text = decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    user, sep, password = text.partition(":")
    return bool(sep and user and password and text.isprintable())


def _is_not_a_port(match: re.Match[str]) -> bool:
    # "https://host:8080/@user" is a port and a path, not a password up to the "@".
    return re.match(r"\d{1,5}/", match.group("secret")) is None


# Access key ids (long-term, temporary, bearer, context); other prefixes (AIDA, AROA, ...) are
# the unique ids of users and roles, which events such as CloudTrail's carry: not credentials.
_AWS_ANCHORS = ("akia", "asia", "abia", "acca")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b")
_AWS_SECRET_KEY = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")


def _aws_key_spans(text: str) -> Iterator[Span]:
    """An access key id, and a secret key written near it: forty base64 characters mixed like
    random bytes (alone, they could be a SHA-1 in hex or any identifier)."""
    for key_id in _AWS_KEY_ID.finditer(text):
        yield key_id.span()
        for secret in _AWS_SECRET_KEY.finditer(text, max(0, key_id.start() - 200)):
            if secret.start() > key_id.end() + 200:
                break
            token = secret.group()
            if (any(c.isupper() for c in token) and any(c.islower() for c in token)
                    and any(c.isdigit() for c in token)):
                yield secret.span()


# --- NAME=value and "name: value" -----------------------------------------

# A name, then "=", "=>" or ":" (not "==", not "://"); the value is read by _assignment_spans.
# A name starts a word and does not follow ":" (the segments of an ARN or URN are not names).
_ASSIGNMENT = re.compile(
    r"(?<![\w.\-:])-{0,2}(?P<name>[A-Za-z_][\w.\-]{0,63}+)(?P<quote>\\?[\"'])?[ \t]*"
    r"(?P<op>=>|=(?!=)|:(?!//))[ \t]*")
# Every sensitive name holds one of these roots: the cheap first look for _ASSIGNMENT.
_NAME_ROOTS = ("pass", "pwd", "secret", "token", "auth", "cookie", "credential", "key",
               "sess", "bearer", "jwt", "dsn", "sig", "conn")
_ASSIGNMENT_TRIGGER = r"(?:" + "|".join(_NAME_ROOTS) + r")[\w.\-]{0,63}+(?:{quote})?[ \t]*+[:=]"
_QUOTED_VALUE = re.compile(r"\\?(?:\"(?P<dq>[^\"\\\r\n]+)|'(?P<sq>[^'\\\r\n]+))")
_BARE_VALUE = re.compile(r"[^\s\"'\\&;,<>()\[\]{}]+")
_AUTH_SCHEME = re.compile(
    r"(?i:bearer|basic|token|bot|digest|apikey|api-key|key|negotiate|ntlm|oauth|jwt|hmac|sso"
    r"|ssws|splunk|sharedkey|aws4-hmac-sha256)[ \t]+(?P<cred>[^\s\"'\\,;]+)")
_LINE_REST = re.compile(r"[^\r\n\"']*")
_NOT_A_PLAIN_WORD = re.compile(r"[\d_]|[^\w\-]")
_FIELD_STARTS = frozenset("\n\r{[(,;&?|>:-*")
_FIELD_ENDS = frozenset("\r\n,;&)}]\"'|")


def _looks_random(value: str) -> bool:
    """A digit, a symbol or mixed case: not a plain word such as "expired" or "Recipe"."""
    return _NOT_A_PLAIN_WORD.search(value) is not None or not (
        value.islower() or value.isupper() or value.istitle())


def _starts_field(text: str, start: int) -> bool:
    """The name at ``start`` opens the text, a line or a field (after "{", ",", ";", ...)."""
    i = start - 1
    while i >= 0 and start - i < 64 and text[i] in " \t\"'\\":
        i -= 1
    return i < 0 or text[i] in _FIELD_STARTS


def _ends_field(text: str, end: int) -> bool:
    while end < len(text) and text[end] in " \t":
        end += 1
    return end == len(text) or text[end] in _FIELD_ENDS


def _assigned_secret(text: str, match: re.Match[str], kind: int, name_start: int
                     ) -> Span | None:
    """The span of the value assigned to a sensitive name when it is a credential."""
    start = match.end()
    name = match.group("name").lower()
    quoted = _QUOTED_VALUE.match(text, start)
    if quoted:  # a quoted value is meant as a value: '"password": "a b"', "PASS='x'"
        group = "dq" if quoted.group("dq") is not None else "sq"
        value = quoted.group(group)
        if _is_placeholder(value) or (not kind & _NUMBERS and value.isdigit()):
            return None
        return quoted.span(group)
    if name.endswith("authorization"):
        scheme = _AUTH_SCHEME.match(text, start)
        if scheme and len(scheme.group("cred")) >= 3 and not _is_placeholder(scheme.group("cred")):
            return scheme.span("cred")
    bare = _BARE_VALUE.match(text, start)
    if bare is None:
        return None
    value = bare.group()
    core = value.rstrip(".,!?:")
    if len(core) < 3 or _is_placeholder(core) or (not kind & _NUMBERS and core.isdigit()):
        return None
    if match.group("op") == ":" and not _looks_random(core) and (
            name.endswith("authorization")
            or not (_starts_field(text, name_start) and _ends_field(text, bare.end()))):
        # "Please reset your password: click the link", "refresh token:expired"
        return None
    if name.endswith(("cookie", "cookies")):  # the whole header value: every cookie in it
        rest = _LINE_REST.match(text, start)
        return start, rest.end() if rest else bare.end()
    return bare.span()


def _assignment_spans(text: str) -> Iterator[Span]:
    pos = 0
    while (match := _ASSIGNMENT.search(text, pos)) is not None:
        pos = match.end()
        name = match.group("name")
        kind = _key_kind(name)
        start = match.start()
        if not kind and name.lower() in _CREDENTIAL_PAIRS:  # "API key: ...", two words
            end = start - 1
            begin = end
            while begin > 0 and start - begin < 32 and text[begin - 1].isalpha():
                begin -= 1
            if begin < end and text[end] in " \t":
                kind = _key_kind(f"{text[begin:end]}_{name}")
                start = begin
        if kind & _STRINGS:
            span = _assigned_secret(text, match, kind, start)
            if span is not None:
                yield span
                pos = max(pos, span[1])  # each value is read once, however long the text


# --- the table --------------------------------------------------------------

_PEM_LABEL = r"(?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"

#: Every credential shape, for payload values and keys (refused) and free text (masked).
_SHAPES = (
    _Shape("PEM private key", ("private key",), _regex(
        r"-----BEGIN " + _PEM_LABEL + r"(?P<secret>[\s\S]*?)(?:-----END " + _PEM_LABEL + "|$)")),
    # The password runs to the last "@" that a host follows: it may hold "/" or "@" itself.
    _Shape("URL with a password", ("://",), _regex(
        r"://[^\s/:@\"'<>]{0,256}:(?!//)(?P<secret>[^\s\"'<>]{1,256})"
        r"@(?=[\w.\-\[\]:%]+(?:[/?#\s\"'<>),;]|$))", _is_not_a_port),
        trigger=r"://[^\s/:@\"'<>]{0,256}+:(?!//)[^\s\"'<>@]{0,256}+@"),
    _Shape("bearer token", ("bearer",), _regex(
        r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)", _has_digit_and_letter),
        trigger=r"bearer\s+[a-z0-9\-._~+/]{16}"),
    _Shape("basic auth header", ("basic",), _regex(
        r"(?i)\bbasic\s+(?P<secret>[A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])",
        _is_basic_credential), trigger=r"basic\s+[a-z0-9+/]{6}"),
    _Shape("JWT", ("eyj",), _regex(
        r"\b(?P<secret>eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{10,})"),
        trigger=r"\beyj[a-z0-9_\-]{5,}\.eyj"),
    _Shape("cloud access key", _AWS_ANCHORS, _aws_key_spans,
        trigger=r"(?:" + "|".join(_AWS_ANCHORS) + r")[a-z0-9]{16}"),
    _Shape("Google API key", ("aiza",), _regex(r"\b(?P<secret>AIza[0-9A-Za-z_\-]{35})")),
    _Shape("GitHub token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"), _regex(
        r"\b(?P<secret>gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})")),
    _Shape("GitLab token", ("glpat-",), _regex(r"\b(?P<secret>glpat-[A-Za-z0-9_\-]{20,})")),
    _Shape("Slack token", ("xox",), _regex(r"\b(?P<secret>xox[abposr]-[A-Za-z0-9\-]{10,})")),
    _Shape("webhook URL", ("hooks.slack.com/", "/api/webhooks/"), _regex(
        r"(?:hooks\.slack\.com/(?:services|workflows|triggers)/"
        r"|discord(?:app)?\.com/api/webhooks/)(?P<secret>[A-Za-z0-9_\-/]{8,})")),
    _Shape("Stripe key", ("k_live_", "k_test_"), _regex(
        r"\b(?P<secret>[sr]k_(?:live|test)_[A-Za-z0-9]{16,})")),
    _Shape("API secret key", ("sk-",), _regex(
        r"\b(?P<secret>sk-[A-Za-z0-9_\-]{20,})", _has_digit_and_letter),
        trigger=r"sk-[a-z0-9_\-]{20}"),
    _Shape("npm token", ("npm_",), _regex(r"\b(?P<secret>npm_[A-Za-z0-9]{36})\b")),
    _Shape("SendGrid key", ("sg.",), _regex(
        r"\b(?P<secret>SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,})"),
        trigger=r"sg\.[a-z0-9_\-]{16}"),
    _Shape("mysql -p password", ("mysql", "mariadb"), _regex(
        r"\b(?i:mysql|mariadb)[^\r\n]{0,256}?[ \t]-p"
        r"(?P<secret>'[^'\r\n]*'|\"[^\"\r\n]*\"|[^\s'\"]+)"),
        trigger=r"(?:mysql|mariadb)[^\r\n]{0,256}?[ \t]-p"),
    # NAME=value, "name: value", "name": "value": a sensitive name (judged as keys are) and a
    # value that is a credential. In JSON text without a backslash, '"' only ends a key.
    _Shape("key=value secret", _NAME_ROOTS, _assignment_spans,
           trigger=_ASSIGNMENT_TRIGGER.replace("{quote}", r"\\?[\"']"),
           json_trigger=_ASSIGNMENT_TRIGGER.replace("{quote}", "'")),
)
_SHORTEST_SHAPE = 7  # "pwd=abc", "a://:b@": nothing shorter can hold a credential


_Looks = dict[str, tuple[tuple[int, "re.Pattern[str] | None"], ...]]


def _looks(json: bool) -> _Looks:
    """For each anchor: the shapes (index, compiled trigger) to look further at."""
    looks: dict[str, list[tuple[int, re.Pattern[str] | None]]] = {}
    for index, shape in enumerate(_SHAPES):
        trigger = shape.json_trigger or shape.trigger if json else shape.trigger
        compiled = re.compile(trigger) if trigger else None
        for anchor in shape.anchors:
            looks.setdefault(anchor, []).append((index, compiled))
    return {anchor: tuple(shapes) for anchor, shapes in looks.items()}


_TEXT_LOOKS = _looks(json=False)
_JSON_LOOKS = _looks(json=True)
_ANCHORS = tuple(_TEXT_LOOKS)


def _live_shapes(lowered: str, looks: _Looks) -> Iterator[int]:
    """The shapes that may match the lower-cased text: an anchor is there, and its trigger."""
    tried: set[int] = set()
    for anchor in _ANCHORS:  # a plain loop over a tuple: the cheapest look at the text
        if anchor in lowered:
            for index, trigger in looks[anchor]:
                if index not in tried:  # one look per shape, whichever anchor is there
                    tried.add(index)
                    if trigger is None or trigger.search(lowered):
                        yield index


def _json_may_hold_credential(lowered: str) -> bool:
    """encode_payload's first look at its JSON text: most payloads hold no anchor at all."""
    for anchor in _ANCHORS:
        if anchor in lowered:
            return next(_live_shapes(lowered, _JSON_LOOKS), None) is not None
    return False


def _shape_spans(text: str, lowered: str) -> Iterator[tuple[_Shape, Span]]:
    for index in sorted(_live_shapes(lowered, _TEXT_LOOKS)):
        for span in _SHAPES[index].spans(text):
            yield _SHAPES[index], span


def _credential_in_text(text: str) -> str | None:
    """The reason of the first credential shape in ``text``, or None."""
    if len(text) < _SHORTEST_SHAPE:
        return None
    lowered = text.lower()
    for shape, _ in _shape_spans(text, lowered):
        return shape.reason
    return None


def redact(text: str) -> str:
    """Return ``text`` with every credential-shaped part replaced by ``***``.

    The shapes are those the payload guard refuses in values; the text around them is kept.
    """
    spans = sorted(span for _, span in _shape_spans(text, text.lower()))
    if not spans:
        return text
    parts = []
    pos = 0
    for start, end in spans:
        if end <= pos:
            continue
        if start >= pos:
            parts.append(text[pos:start])
            parts.append(_MASK)
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


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
        text = _ENCODER.encode(payload)
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
    return _ENCODER.encode(headers) if headers else None
