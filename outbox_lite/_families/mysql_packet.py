"""MySQL's ``max_allowed_packet``: the largest statement it takes and, on MySQL, the largest
JSON text it gives back. Read once per connection, with the session question
(:func:`.mysql_sql.session_question`; else ``SELECT @@SESSION.max_allowed_packet``), cached on
the connection object, so a reconnect reads it again.

What each server does with a payload past it (measured on MariaDB 10.11 and MySQL 9.7 with
``max_allowed_packet`` 64 KiB):

* **Writing**, both: the server refuses a statement longer than the limit with 1153 and drops
  the connection; PyMySQL then reports ``2006 server has gone away``, a connection error that a
  retry loop retries for ever. :func:`check_insert` refuses such a payload before any SQL.
* **Storing**, MySQL: a JSON value whose binary form is longer than the limit is refused with
  1301 (``json_binary::serialize()``), the statement alone undone: the family's
  ``payload_refused`` (:func:`outbox_lite._families.mysql.refused`) makes that a PayloadError
  too (the one case found only once the INSERT is sent).
* **Reading**, MySQL: a JSON value whose text (MySQL's own, with a space after each ``:`` and
  ``,``) is longer than the limit comes back as an empty string with warning 1301. MariaDB
  keeps JSON as LONGTEXT and sends it whole whatever the limit. So on MySQL a payload is also
  refused when its text as MySQL writes it would not fit; a row stored before the limit was
  lowered is dead-lettered on reading (``payload_too_large``, see the repository).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple, Sequence

import peewee as pw
from pymysql.converters import escape_item

from ..errors import PayloadError
from . import mysql_sql as sql

_ATTRIBUTE = "_outbox_lite_packet"
#: Everything in an INSERT of an event besides its payload: the statement's text and its other
#: parameters (five names of at most 255 characters, 4 bytes each, each escape doubling a
#: byte, four instants, and headers of at most 8 KiB as JSON) take less than this.
_OTHERS_BOUND = 40 * 1024
_RENDERED_SEPARATORS = (", ", ": ")


class PacketLimit(NamedTuple):
    """One connection's ``max_allowed_packet`` (bytes), and whether the server gives JSON
    back in text of its own (MySQL) that must fit in it too."""

    max_allowed_packet: int
    renders_json: bool


def packet_limit(database: pw.Database, execute: Any) -> PacketLimit:
    """The limit of the calling thread's connection to ``database``, read at its first use
    (``execute(statement, params)`` runs the read)."""
    if not database.is_closed():
        cached = getattr(database.connection(), _ATTRIBUTE, None)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
    size, version = execute(sql.PACKET, ()).fetchone()
    return remember(database.connection(), int(size), str(version))


def remember(conn: Any, max_allowed_packet: int, version: str) -> PacketLimit:
    """Keep the limit of ``conn`` (its ``max_allowed_packet`` and ``VERSION()``, as
    :data:`~.mysql_sql.PACKET` or the session question read them) on it; return it."""
    limit = PacketLimit(max_allowed_packet, "mariadb" not in version.lower())
    setattr(conn, _ATTRIBUTE, limit)
    return limit


def _escaped_size(value: Any) -> int:
    return len(escape_item(value, "utf8mb4").encode("utf-8"))


def check_insert(limit: PacketLimit, statement: str, payload: Any, body: str,
                 params: Sequence[Any]) -> None:
    """Raise PayloadError unless the INSERT of ``statement`` with ``params`` (``body``, the
    payload's JSON text, among them) fits in the server's packet and, on MySQL, the payload
    can be read back. Costs nothing measurable unless the payload is near the limit."""
    packet = limit.max_allowed_packet
    size = len(body) if body.isascii() else len(body.encode("utf-8"))
    if 2 * size + _OTHERS_BOUND <= packet:  # escaping or MySQL's spaces at most double it
        return
    # What PyMySQL sends: the statement with each parameter escaped and quoted. JSON text
    # holds no raw control character, so only \ " ' are escaped (one byte more each).
    escaped = size + body.count("\\") + body.count('"') + body.count("'") + 2
    others = sum(_escaped_size(value) for value in params if value is not body)
    sent = 1 + len(statement.encode("utf-8")) - 2 * len(params) + escaped + others
    if sent >= packet:  # measured on both servers: a packet of max_allowed_packet is refused
        raise PayloadError(
            f"payload is {size} bytes of JSON, and the INSERT carrying it would be {sent} "
            f"bytes: more than the server's max_allowed_packet ({packet} bytes), so the "
            "server would refuse it; send a smaller payload (or a reference to the data), or "
            "raise max_allowed_packet on the server")
    if not limit.renders_json or size + body.count(",") + body.count(":") <= packet:
        return
    rendered = json.dumps(payload, ensure_ascii=False, separators=_RENDERED_SEPARATORS)
    rendered_size = len(rendered.encode("utf-8"))
    if rendered_size > packet:
        raise PayloadError(
            f"payload is {size} bytes of JSON, which MySQL gives back as {rendered_size} "
            f"bytes of text: more than the server's max_allowed_packet ({packet} bytes), so "
            "it could be stored but never read back; send a smaller payload, or raise "
            "max_allowed_packet on the server")
