"""The credential guard: whether a key names a credential (:func:`_key_kind`) and whether text
holds one (:func:`_credential_in_text`), and :func:`redact`, which masks in free text (stored
error messages, printed errors, URLs) the same credential shapes: one table of rules,
:data:`_SHAPES`, serves both. The payload's and the headers' checks
(:mod:`outbox_lite.payload`) refuse what this finds; this module imports nothing of ours.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from typing import Callable, Iterator, NamedTuple

_MASK = "***"


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
#: A key's words: "b64" and "base64" are one word each (so "password_b64" is a password), then
#: runs of capitals, capitalised or lower-case words, and numbers.
_WORD_RE = re.compile(r"(?i:b(?:ase)?64)(?![0-9])|[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


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
