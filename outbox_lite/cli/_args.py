"""What the commands share: exit statuses, the two errors a command reports, the flags'
value types, the database flag and the command's connection. The one place where flags and
``OUTBOX_*`` variables become the library's arguments is here and in each command group's
``add_commands``."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import difflib
import math
import os
import re
import shlex
import sys
from typing import Any, Iterator, NamedTuple

import peewee as pw

from .. import _checks, _schema
from .._credentials import redact
from .._db import DEFAULT_URL, tls_failure
from .._families.url import DatabaseUrl
from ..errors import OutboxError
from ..models import HISTORY_TABLE, TABLE_NAME
from ..repository import OutboxRepository

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a command ended by SIGPIPE (128 + 13)


class CommandError(Exception):
    """A failure the command reports in one line."""


class DatabaseCommandError(CommandError):
    """A failure of the command's database (a table missing, say): the line names it."""


class UsageError(ValueError):
    """Flags that do not fit together (exit status 2, like argparse's own errors)."""


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser that keeps the arguments it was given (``given``), so that a usage
    error can name the flag or choice closest to a mistyped one (:func:`suggestion`): Python
    3.14's ``suggest_on_error`` covers choices only, and 3.11-3.13 have nothing of the kind."""

    given: list[str] | None = None

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("args")
        self.given = list(sys.argv[1:] if given is None else given)
        return super().parse_known_args(*args, **kwargs)


_NUMBER = re.compile(r"-\.?\d")
_CHOICE = re.compile(r"invalid choice: '([^']*)'")


def _chosen(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and the subcommands' parsers its arguments went on to, in order."""
    path = [parser]
    while True:
        commands = [a for a in path[-1]._actions if a.nargs == argparse.PARSER]
        given = getattr(path[-1], "given", None) or []
        if not commands or not isinstance(commands[0].choices, dict):
            return path
        name = next((word for word in given if word in commands[0].choices), None)
        if name is None or getattr(commands[0].choices[name], "given", None) is None:
            return path
        path.append(commands[0].choices[name])


def suggestion(parser: argparse.ArgumentParser,
               message: str) -> tuple[argparse.ArgumentParser, str]:
    """For argparse's error ``message`` raised by ``parser``: the parser of the subcommand the
    arguments went on to (whose flags an unrecognized argument was meant for), and "; did
    you mean X?" naming the flag or choice closest to one the user mistyped ("" if none is
    close)."""
    path = _chosen(parser)
    close: list[str] = []
    choice = _CHOICE.search(message)
    if "maybe you meant" in message:  # argparse's own suggestion (3.14's suggest_on_error)
        pass
    elif choice:
        choices = [str(c) for p in path for a in p._actions if a.choices for c in a.choices]
        close = difflib.get_close_matches(choice[1], choices, n=1)
    else:
        flags = [flag for p in path for a in p._actions for flag in a.option_strings]
        for word in getattr(parser, "given", None) or []:
            name = word.split("=", 1)[0]
            if (name.startswith("-") and name not in ("-", "--") and not _NUMBER.match(name)
                    and not any(flag.startswith(name) for flag in flags)):
                close = difflib.get_close_matches(name, flags, n=1)
                if close:
                    if name not in message:  # "required: --older-than" after --older-then
                        close[0] += f" where you typed {name}"
                    break
    return path[-1], f"; did you mean {close[0]}?" if close else ""


_GRANTS = "see 'Schema, migrations and grants' in the README"
_PRIVILEGE_HINTS = {
    "migrate": "migrate needs SELECT on {history} to see what is applied, and CREATE, "
               "ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE on the database to apply "
               "or roll back migrations; " + _GRANTS,
}



def describe_error(exc: BaseException, url: DatabaseUrl | None, command: str) -> str:
    """The one line that says what ``exc`` (raised by ``command`` on the database at ``url``)
    means, never a password."""
    # Our errors chain the driver's (a ConnectionLostError from 2003, say): read its number.
    driver = exc.__cause__ if isinstance(exc, OutboxError) and exc.__cause__ else exc
    family = url.family if url is not None else None
    hint = _PRIVILEGE_HINTS.get(command, _GRANTS).format(history=HISTORY_TABLE)
    unreadable = url.unreadable_files() if isinstance(exc, OSError) and url else []
    if unreadable:
        return (f"URL parameter {unreadable[0]} names a file that does not exist or cannot "
                "be read")
    tls = tls_failure(exc)  # before "cannot reach": that would hide why
    if url is not None and tls is not None:
        return family.tls_message(url, tls)  # type: ignore[union-attr,no-any-return]
    said = None if family is None else family.describe(driver, url, hint)
    if said is not None:
        return said  # type: ignore[no-any-return]
    orig = getattr(exc, "orig", exc)
    return redact(str(orig) or type(orig).__name__)


def database_url(args: argparse.Namespace) -> DatabaseUrl | None:
    """The command's one database: --database-url, else $OUTBOX_DATABASE_URL, else the
    default. None when ``outbox-lite relay`` is given several databases (its repeated
    --database-url, a NAME=URL, or --databases-file), which it reads itself."""
    raw = args.database_url
    if getattr(args, "databases_file", None):
        return None
    if isinstance(raw, list):  # outbox-lite relay's flag, which may be repeated
        if len(raw) > 1 or split_name(raw[0])[0]:
            return None
        raw = raw[0]
    return DatabaseUrl.parse(raw or os.environ.get("OUTBOX_DATABASE_URL") or DEFAULT_URL)


def split_name(value: str) -> tuple[str | None, str]:
    """``NAME=URL`` as (NAME, URL); a bare URL (whose own ``=`` come after its ``://``) as
    (None, URL)."""
    head, sep, rest = value.partition("=")
    if sep and "://" not in head:
        return head.strip(), rest.strip()
    return None, value.strip()


def naming_the_server(message: str, args: argparse.Namespace, url: DatabaseUrl) -> str:
    """``message`` (an error of the database at ``url``) followed by the server and database
    it went to, and where that URL came from when not from --database-url: without a URL a
    command goes to the default one, which may not be the server the user meant."""
    if getattr(args, "database_url", None):
        source = ""
    elif os.environ.get("OUTBOX_DATABASE_URL"):
        source = " (from OUTBOX_DATABASE_URL)"
    else:
        source = " (the default: no --database-url or OUTBOX_DATABASE_URL given)"
    return f"{message}; on {url.location}{source}"


_MIGRATE = "outbox-lite migrate"


def naming_the_database(message: str, args: argparse.Namespace,
                        url: DatabaseUrl | None) -> str:
    """``message`` with each "outbox-lite migrate" it advises naming the database the user
    gave with --database-url (its password masked): the bare command would migrate
    $OUTBOX_DATABASE_URL's database, or the default one, instead."""
    if url is None or not getattr(args, "database_url", None):
        return message
    return message.replace(_MIGRATE, f"{_MIGRATE} --database-url {shlex.quote(str(url))}")


class Age(NamedTuple):
    """A duration as the user wrote it (``7d``) and as a timedelta."""

    text: str
    delta: dt.timedelta


UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
UNIT_HELP = "s, m, h, d or w (seconds, minutes, hours, days, weeks)"


def parse_age(text: str) -> Age:
    """"90s", "15m", "12h", "7d", "2w": a unit is required (a bare 7 could mean anything)."""
    text = text.strip()
    number, unit = (text[:-1], text[-1].lower()) if text[-1:].lower() in UNITS else (text, "")
    number = number.strip()
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration like 90s, 15m, 12h, 7d or 2w") from None
    if not unit and math.isfinite(value):
        if value <= 0:
            raise argparse.ArgumentTypeError(
                f"{text!r} must be a positive number with a unit: {UNIT_HELP}")
        raise argparse.ArgumentTypeError(
            f"{text!r} needs a unit: {text}s, {text}m, {text}h, {text}d or {text}w")
    return Age(f"{number}{unit}", checked_duration(text, value * UNITS.get(unit, 1)))


def parse_age_or_seconds(text: str) -> Age:
    """:func:`parse_age`, or a bare number of seconds ("3600"), as ``--retain`` takes it."""
    try:
        seconds = float(text)
    except ValueError:
        return parse_age(text)
    return Age(f"{text.strip()}s", checked_duration(text, seconds))


def checked_duration(text: str, seconds: float) -> dt.timedelta:
    """What the library's duration check allows, said in the command's words."""
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite duration")
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    if seconds > _checks.MAX_DURATION_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is longer than the limit, {_checks.MAX_DURATION_TEXT}")
    return dt.timedelta(seconds=seconds)


def parse_seconds(text: str) -> float:
    """A positive number of seconds, e.g. 300 or 0.5."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    checked_duration(text, value)
    return value


def parse_positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parse_event_id(text: str) -> int:
    try:
        return _checks.event_id(int(text))
    except (ValueError, OutboxError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an event id (a whole number from 1)") from None


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


@contextlib.contextmanager
def open_database(url: DatabaseUrl) -> Iterator[pw.Database]:
    """The command's database, closed when the command is done with it."""
    database = url.database()
    try:
        yield database
    finally:
        database.close()


@contextlib.contextmanager
def open_repository(url: DatabaseUrl) -> Iterator[OutboxRepository]:
    """The command's repository, its table checked first (SchemaError: what is wrong and
    the repair, in one line), also for the commands that query the model themselves."""
    with open_database(url) as database:
        _schema.check(database, (TABLE_NAME,))
        yield OutboxRepository(database)



def add_age_flags(parser: argparse.ArgumentParser, rows: str) -> None:
    """``--older-than AGE`` (required, with a unit) and ``--dry-run``, as every purge takes
    them; ``rows`` names what goes, e.g. "events published"."""
    parser.add_argument("--older-than", type=parse_age, required=True, metavar="AGE",
                        help=f"delete {rows} longer ago than AGE, a number with a unit: "
                             f"{UNIT_HELP}, e.g. 90s, 12h, 7d (a bare number is refused)")
    parser.add_argument("--dry-run", action="store_true",
                        help="say how many would be deleted, delete nothing")


def say_purged(what: str, age: Age, dry_run: bool) -> None:
    """A purge's one line: what went (or, in a dry run, would go) and how old it was."""
    if dry_run:
        print(f"would purge {what} older than {age.text} (dry run: nothing changed)")
    else:
        print(f"purged {what} older than {age.text}")


def add_database_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", metavar="URL", help=database_url_help())


def database_url_help() -> str:
    """What --database-url takes, as every command's help says it."""
    return ("mysql://user[:password]@host[:port]/database[?option=value&...] or "
            "postgresql://user[:password]@host[:port]/database[?option=value&...] (also "
            f"postgres://; default: $OUTBOX_DATABASE_URL, else {DEFAULT_URL}). "
            "Percent-encode the user and password (%% as %%25); options: "
            + ", ".join(url_options()) + "; PostgreSQL's: "
            + ", ".join(url_options("postgresql")))


def url_options(scheme: str = "mysql") -> list[str]:
    """The query parameters a URL of ``scheme`` takes."""
    from .._families import family_for_scheme
    return list(family_for_scheme(scheme).url_class.OPTIONS)



def parse_port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is from 0 to 65535, not {value}")
    return value
