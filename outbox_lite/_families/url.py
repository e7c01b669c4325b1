"""Database URLs, ``scheme://user[:password]@host[:port]/database[?option=value&...]``: the
grammar every family shares, the scheme picking the family (whose subclass of
:class:`DatabaseUrl` knows its options, its default port and how to connect).

A URL may list several hosts, ``host1:port1,host2:port2,host3:port3`` (a cluster's nodes, a
primary and its standby): the first is :attr:`DatabaseUrl.host` and :attr:`~DatabaseUrl.port`,
all of them in order :attr:`DatabaseUrl.hosts`, and the family's database connects to the first
that answers and can take writes (SPEC §12).

A URL's password is never shown: errors about a URL quote none of its text, and ``str()``
masks the password (and any secret option).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar
from urllib.parse import quote, unquote

from ..errors import OutboxError


class DatabaseUrlError(ValueError):
    """The URL is not ``scheme://user[:password]@host[:port]/database[?options]``."""


class DatabaseExistsError(OutboxError):
    """The database to create for a run exists already (and may hold someone's data)."""


# Everything after the userinfo: what a password cannot be confused with, since the
# userinfo is taken up to the last '@' that leaves such a tail.
# The hosts before the last one (``host[:port],`` each) are ``others``.
_ADDRESS = r"(?:\[[0-9A-Fa-f:.]*\]|[^:/?#@\[\],]*)(?::[^/?#@,]*)?"
_ADDRESS_RE = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]*\]|[^:/?#@\[\],]*)(?::(?P<port>[^/?#@,]*))?")
_TAIL_RE = re.compile(
    rf"(?P<others>(?:{_ADDRESS},)*)"
    r"(?P<host>\[[0-9A-Fa-f:.]*\]|[^:/?#@\[\],]*)"
    r"(?::(?P<port>[^/?#@,]*))?"
    r"(?:/(?P<name>[^/?#@]*))?"
    r"(?:\?(?P<query>[^#]*))?")
_HOST_RE = re.compile(r"[A-Za-z0-9._-]{1,255}|\[[0-9A-Fa-f:.]{2,45}\]")
_BAD_PERCENT_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")
OPTION_NAME_RE = re.compile(r"[A-Za-z_]{1,40}")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def text_option(name: str, value: str) -> str:
    if not value:
        raise DatabaseUrlError(f"URL parameter {name} must not be empty")
    return value


def flag_option(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise DatabaseUrlError(f"URL parameter {name} must be true or false")


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed database URL; ``str()`` never shows the password. ``DatabaseUrl.parse`` gives
    the subclass of the URL's family (``MySQLUrl`` for ``mysql://``)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    name: str
    #: (name, value) pairs of the URL's query parameters, the driver's connection arguments.
    options: tuple[tuple[str, Any], ...] = ()
    #: Every (host, port) of a URL listing several, in the URL's order (the first is ``host``
    #: and ``port``); empty for a URL of one host.
    hosts: tuple[tuple[str, int], ...] = ()

    #: The scheme ``str()`` writes, the port and user a URL may leave out, what a database
    #: name may be, the form an error shows, the options and which of them are secret or name
    #: files: each family's subclass says.
    scheme: ClassVar[str] = ""
    default_port: ClassVar[int] = 0
    default_user: ClassVar[str] = ""
    name_re: ClassVar[re.Pattern[str]] = re.compile(r"[A-Za-z0-9_$]{1,64}")
    name_rule: ClassVar[str] = "1-64 letters, digits, _ or $"
    form: ClassVar[str] = ""
    OPTIONS: ClassVar[dict[str, Callable[[str, str], Any]]] = {}
    secret_options: ClassVar[frozenset[str]] = frozenset()
    file_options: ClassVar[tuple[str, ...]] = ()

    #: The family of this URL's server (:mod:`outbox_lite._families`), set by each family's
    #: module on its subclass.
    family: ClassVar[Any] = None
    #: Each family's subclass by the URL schemes it reads (``mysql``, ``postgresql`` …): the
    #: table of families (:mod:`outbox_lite._families`) fills it, this grammar never names one.
    kinds: ClassVar[dict[str, type["DatabaseUrl"]]] = {}
    #: The scheme of a URL made directly from its parts, as every URL was before the families.
    DEFAULT_SCHEME: ClassVar[str] = "mysql"

    def __new__(cls, *args: Any, **kwargs: Any) -> "DatabaseUrl":
        """``DatabaseUrl(host, port, …)`` made directly, with no scheme, is a ``mysql://``
        one, as every URL was before the families (a subclass is made as itself)."""
        if cls is DatabaseUrl:
            cls = DatabaseUrl.kinds[DatabaseUrl.DEFAULT_SCHEME]
        return super().__new__(cls)

    @classmethod
    def parse(cls, url: str) -> "DatabaseUrl":
        """Read ``scheme://user[:password]@host[:port]/database[?option=value&...]``.

        Raises DatabaseUrlError, whose message quotes no part of ``url``.
        """
        scheme, sep, rest = url.partition("://")
        kind = DatabaseUrl.kinds.get(scheme.lower()) if sep else None
        if kind is None:
            shown = f" {scheme!r}" if sep and OPTION_NAME_RE.fullmatch(scheme) else ""
            raise DatabaseUrlError(f"unsupported URL scheme{shown}: {url_form()}")
        return kind._parse(rest)

    @classmethod
    def _parse(cls, rest: str) -> "DatabaseUrl":
        form = cls.form
        userinfo, match = cls._split(rest)
        if match is None:
            raise DatabaseUrlError(f"bad database URL; {form}")
        name = match["name"]
        listed = _addresses(match)
        if len(listed) > 1 and not all(host for host, _ in listed):
            raise DatabaseUrlError(f"bad database URL: a host of the list is empty; {form}")
        addresses = [cls._address(host, port) for host, port in listed]
        if not name or not cls.name_re.fullmatch(name):
            raise DatabaseUrlError(f"the database name must be {cls.name_rule}; {form}")
        user, password = "", ""
        if userinfo is not None:
            raw_user, _, raw_password = userinfo.partition(":")
            user = _decode(raw_user, "user name", form)
            password = _decode(raw_password, "password", form)
        if len(set(addresses)) < len(addresses):
            raise DatabaseUrlError(f"bad database URL: a host is listed twice; {form}")
        (host, port), *_ = addresses
        return cls(host=host, port=port, user=user or cls.default_user, password=password,
                   name=name, options=cls._options(match["query"] or ""),
                   hosts=tuple(addresses) if len(addresses) > 1 else ())

    @classmethod
    def _address(cls, host: str, port_text: str | None) -> tuple[str, int]:
        """One ``host[:port]`` of the URL, checked (the default port when none is given)."""
        form = cls.form
        if port_text and not (port_text.isdigit() and 1 <= int(port_text) <= 65535):
            raise DatabaseUrlError(f"bad database URL: the port must be a number from 1 to "
                                   f"65535; {form}")
        if host and not _HOST_RE.fullmatch(host):
            raise DatabaseUrlError(f"bad database URL: the host is not a host name or an IP "
                                   f"address; {form}")
        return host.strip("[]") or "127.0.0.1", int(port_text or cls.default_port)

    @classmethod
    def _split(cls, rest: str) -> tuple[str | None, re.Match[str] | None]:
        """The userinfo (None when absent) and the tail's match: the userinfo runs to the last
        '@' that leaves a well-formed tail naming a valid database, so a password may hold
        unencoded / # ? @ characters."""
        candidates = [i for i, char in enumerate(rest) if char == "@"][::-1]
        first: tuple[str | None, re.Match[str] | None] = (None, None)
        for at in [*candidates, -1]:
            match = _TAIL_RE.fullmatch(rest[at + 1:])
            if match is None:
                continue
            userinfo = rest[:at] if at >= 0 else None
            if first[1] is None:
                first = (userinfo, match)
            name = match["name"]
            if name and cls.name_re.fullmatch(name) and all(
                    (not port or port.isdigit()) and (not host or _HOST_RE.fullmatch(host))
                    for host, port in _addresses(match)):
                return userinfo, match
        return first

    @classmethod
    def _options(cls, query: str) -> tuple[tuple[str, Any], ...]:
        options: dict[str, Any] = {}
        for item in filter(None, query.split("&")):
            raw_name, has_value, raw_value = item.partition("=")
            name = _decode(raw_name, "URL parameter's name", cls.form)
            if name not in cls.OPTIONS:
                shown = name if OPTION_NAME_RE.fullmatch(name) else "(not a parameter name)"
                raise DatabaseUrlError(
                    f"unknown URL parameter {shown}; supported: {', '.join(cls.OPTIONS)}")
            if name in options:
                raise DatabaseUrlError(f"URL parameter {name} is given twice")
            if not has_value:
                raise DatabaseUrlError(f"URL parameter {name} needs a value ({name}=...)")
            options[name] = cls.OPTIONS[name](name, _decode(raw_value, f"value of {name}",
                                                            cls.form))
        cls._check_options(options)
        return tuple(sorted(options.items()))

    @classmethod
    def _check_options(cls, options: dict[str, Any]) -> None:
        """Refuse options that do not go together (each family's rules)."""

    def with_name(self, name: str) -> "DatabaseUrl":
        if not self.name_re.fullmatch(name):
            raise DatabaseUrlError(f"bad database name {name!r}")
        return dataclasses.replace(self, name=name)

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """Every (host, port) the URL lists, in order: ``hosts``, or the one ``host``."""
        return self.hosts or ((self.host, self.port),)

    @property
    def netloc(self) -> str:
        """``host:port`` (``host1:port1,host2:port2`` … for several), as a URL writes it."""
        return ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                        for host, port in self.addresses)

    def __str__(self) -> str:  # never shows the password
        auth = self.user + (":***" if self.password else "")
        query = "&".join(f"{k}={'***' if k in self.secret_options else v}"
                         for k, v in self.options)
        return f"{self.scheme}://{auth}@{self.netloc}/{self.name}" + (
            f"?{query}" if query else "")

    @property
    def location(self) -> str:
        """Which server and database: ``scheme://host:port/name``, no user, password or
        options (for an error that must say where it went)."""
        return f"{self.scheme}://{self.netloc}/{self.name}"

    def secret_text(self) -> str:
        """The URL in full, password included (percent-encoded): for handing to a child
        process, never for showing. ``DatabaseUrl.parse`` reads it back to an equal URL."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}"
                                            if self.password else "")
        query = "&".join(f"{k}={str(v).lower() if isinstance(v, bool) else quote(str(v))}"
                         for k, v in self.options)
        return f"{self.scheme}://{auth}@{self.netloc}/{self.name}" + (
            f"?{query}" if query else "")

    def unreadable_files(self) -> list[str]:
        """The options naming a file (``ssl_ca`` …) whose file this process cannot read (the
        driver's own error names neither the option nor the file)."""
        options = dict(self.options)
        return [name for name in self.file_options
                if name in options and not os.access(options[name], os.R_OK)]

    # -- what each family's subclass provides ------------------------------------------------

    def database(self, database_class: Any = None, **kwargs: Any) -> Any:
        """A Peewee database for this URL (connects lazily), of ``database_class`` (default:
        the family's own); ``kwargs`` add to or override the URL's connection options."""
        raise NotImplementedError

    def server_connection(self) -> Any:
        """A plain driver connection to the server, in autocommit (MySQL: no database
        selected; PostgreSQL: the maintenance database)."""
        raise NotImplementedError

    #: Whether the database named ``%s`` is listed: a row or none (a server connection's).
    LISTED_SQL: ClassVar[str]
    #: The statements that create (with the library's encoding) and drop the database
    #: ``{name}`` (a name the grammar has checked, quoted as the family quotes it).
    CREATE_SQL: ClassVar[str]
    DROP_SQL: ClassVar[str]

    def exists(self) -> bool:
        """Whether the database exists on the server."""
        conn = self.server_connection()
        try:
            return self._listed(conn.cursor())
        finally:
            conn.close()

    def _listed(self, cur: Any) -> bool:
        cur.execute(self.LISTED_SQL, (self.name,))
        return cur.fetchone() is not None

    def created_meanwhile(self, error: Exception) -> bool:
        """Whether the driver's ``error`` from CREATE_SQL says the database exists."""
        raise NotImplementedError

    def create_database(self, *, exclusive: bool = False) -> bool:
        """Create the database when missing; True when it was created. With ``exclusive``
        an existing database raises DatabaseExistsError instead. (A user without the right
        to create databases can still use one that exists.)"""
        conn = self.server_connection()
        try:
            cur = conn.cursor()
            if not self._listed(cur):
                try:  # no IF NOT EXISTS: of two runs racing, only one creates it
                    cur.execute(self.CREATE_SQL.format(name=self.name))
                    return True
                except Exception as exc:  # noqa: BLE001 - the driver's own error class
                    if not self.created_meanwhile(exc):
                        raise
            if exclusive:
                raise DatabaseExistsError(f"database {self.name} exists already")
            return False
        finally:
            conn.close()

    def drop_database(self) -> None:
        """Drop the database if it exists (PostgreSQL: ending its sessions first)."""
        conn = self.server_connection()
        try:
            conn.cursor().execute(self.DROP_SQL.format(name=self.name))
        finally:
            conn.close()


def url_form() -> str:
    """What a database URL starts with, for an error about its scheme: one short clause
    (each family's whole form is for an error about the rest of its URL)."""
    schemes = [f"{scheme}://" for scheme in DatabaseUrl.kinds]
    listed = ", ".join(schemes[:-1]) + f" or {schemes[-1]}" if len(schemes) > 1 else schemes[0]
    return f"expected {listed}, e.g. mysql://user:password@host:3306/database"


def _addresses(match: re.Match[str]) -> list[tuple[str, str | None]]:
    """(host, port text) of every address a tail's match lists, in order."""
    others = [_ADDRESS_RE.fullmatch(part) for part in match["others"].split(",")[:-1]]
    return [(found["host"], found["port"]) for found in others if found is not None] + [
        (match["host"], match["port"])]


def _decode(part: str, what: str, form: str) -> str:
    if _BAD_PERCENT_RE.search(part):
        raise DatabaseUrlError(
            f"the {what} holds a % that does not start a percent-escape: write % as %25; "
            f"{form}")
    try:
        return unquote(part, errors="strict")
    except UnicodeDecodeError:
        raise DatabaseUrlError(f"the {what}'s percent-escapes are not UTF-8; {form}") from None
