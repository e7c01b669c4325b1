"""Broker URLs safe to show: the password masked, for reprs, errors and log lines."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from .._credentials import redact


def password_of(url: Any) -> str:
    """The password in ``url`` (percent-decoded), or ``""``: what error texts must not show."""
    try:
        return unquote(urlsplit(url).password or "")
    except (TypeError, ValueError):
        return ""


def mask_url(url: str, kind: str = "broker") -> str:
    """``url`` without its password (``***``), query or fragment: safe for errors and logs.
    ``kind`` names the URL when it cannot be parsed (``<unparsable Redis URL>``)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return f"<unparsable {kind} URL>"
    auth = ""
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        user, has_password, _ = userinfo.partition(":")
        # Without ':' the user part may well be a password put in the wrong place (or a
        # NATS token): masked whole.
        auth = f"{user}:***@" if has_password else "***@"
    if ":" in host:
        host = f"[{host}]"
    netloc = auth + host + (f":{port}" if port is not None else "")
    return redact(f"{parts.scheme}://{netloc}{parts.path}")


def scrub(text: str, *passwords: str) -> str:
    """``text`` with each of ``passwords`` replaced by ``***``, then redacted."""
    for password in passwords:
        if password:
            text = text.replace(password, "***")
    return redact(text)
