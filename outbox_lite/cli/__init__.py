"""The ``outbox-lite`` command: flags and ``OUTBOX_*`` variables mapped onto the library.

The root parser, ``migrate`` and ``contention`` (the main job) are here; the other command
groups each have a module: :mod:`.events` (stats, dead letters, purge), :mod:`.relay`,
:mod:`.inbox`; :mod:`._args` holds what they share.

Every failure ends as one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import re
import signal
import sys
import textwrap
import traceback
from typing import Any, Callable, NoReturn, Sequence

import peewee as pw

from .. import __version__, _signals
from .._db import tls_failure
from .._families import driver_errors
from .._families.url import DatabaseExistsError, DatabaseUrl, DatabaseUrlError
from ..errors import (ConnectionLostError, DuplicateEventError, IsolationLevelError,
                      LockConflictError, OutboxError, SchemaError)
from ..models import HISTORY_TABLE
from . import events, inbox, relay
from ._args import (EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError, DatabaseCommandError,
                    SuggestingParser, add_database_flag, database_url, describe_error,
                    naming_the_database, naming_the_server, open_database, parse_positive,
                    suggestion)

__all__ = ["build_parser", "main", "version_line"]

EXIT_BROKEN_PIPE = 141  # what a shell reports for a command ended by SIGPIPE (128 + 13)

#: Our errors that are the database's (a broker's, a flag's are not).
_DATABASE_ERRORS = (DatabaseCommandError, ConnectionLostError, SchemaError, LockConflictError,
                    DuplicateEventError, IsolationLevelError, DatabaseExistsError)


def _about_the_database(exc: BaseException, url: DatabaseUrl) -> bool:
    """Whether ``exc`` is an error of the command's database (the server, its login, TLS,
    the URL's files, a missing database or table), whose line must say where it went."""
    if isinstance(exc, _DATABASE_ERRORS) or isinstance(exc, (pw.PeeweeException,
                                                               *driver_errors())):
        return True
    return isinstance(exc, OSError) and (tls_failure(exc) is not None
                                         or bool(url.unreadable_files()))


def _contention_database(url: DatabaseUrl) -> DatabaseUrl:
    """The database the contention suite makes (and drops) beside ``url``'s."""
    return url.with_name(f"{url.name}_contention")


# ---------------------------------------------------------------------------
# The main job: migrate, contention
# ---------------------------------------------------------------------------

def _cmd_migrate(args: argparse.Namespace, url: DatabaseUrl) -> int:
    from .. import migrate as schema  # peewee-migrate: only this command pays its import

    if args.rollback:
        if not url.exists():  # never create anything to undo nothing
            print(f"nothing to roll back: database {url.name} does not exist")
            return EXIT_OK
        with open_database(url) as database:
            name = schema.rollback(database)
        print(f"rolled back {name}" if name else "nothing to roll back")
        return EXIT_OK
    # Each line names the server (no credentials): a forgotten URL that went to the default
    # server shows itself here, before a service looks for its schema elsewhere.
    where = f" ({url.location})"
    if url.create_database():
        print(f"created database {url.name}{where}")
    with open_database(url) as database:
        applied = schema.migrate(database)
    print(("applied " + ", ".join(applied) if applied else f"{url.name} is up to date") + where)
    return EXIT_OK


def _cmd_contention(args: argparse.Namespace, url: DatabaseUrl) -> int:
    from ..contention import ContentionSuite, format_table

    def progress(message: str) -> None:
        if not args.json:
            print(f"... {message}", file=sys.stderr, flush=True)

    target = _contention_database(url)
    suite = ContentionSuite(target, workers=args.workers, events=args.events,
                            batch_size=args.batch_size, max_attempts=args.max_attempts,
                            keep=args.keep, force=args.force, progress=progress)
    try:
        with _signals.interrupt_on(signal.SIGTERM):  # like Ctrl-C: the suite drops its database
            results = suite.run(args.scenario or _all_scenarios())
    except DatabaseExistsError:
        raise DatabaseCommandError(
            f"database {target.name} exists already and the suite would replace it: drop "
            "it yourself, or pass --force to let the suite drop and re-create it") from None
    if args.json:
        print(json.dumps({"database": str(target), "workers": args.workers,
                          "events": args.events, "batch_size": args.batch_size,
                          "ok": all(r.ok for r in results),
                          "scenarios": [r.as_dict() for r in results]}, indent=2))
    else:
        print(format_table(results))
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


def _all_scenarios() -> tuple[str, ...]:
    from ..contention import SCENARIOS
    return SCENARIOS


# ---------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------

class _HelpFormatter(argparse.HelpFormatter):
    """Help wrapped between words only: a URL or ``Percent-encode`` stays whole, so that what
    a reader copies from ``--help`` works."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False,
                             break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent,
                             subsequent_indent=indent, break_long_words=False,
                             break_on_hyphens=False)


class _Parser(SuggestingParser):
    """Usage errors in one line too (argparse prints the whole usage first), naming the
    closest flag or choice to a mistyped one, and the subcommand an unrecognized argument was
    given to; help wrapped between words (every subcommand's parser is one of these)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        chosen, hint = suggestion(self, message)
        prog = chosen.prog if message.startswith("unrecognized arguments") else self.prog
        self.exit(EXIT_USAGE, f"{prog}: error: {message}{hint} (see {prog} --help)\n")


#: The drivers ``--version`` names when installed: (shown as, distribution names).
DRIVER_DISTRIBUTIONS = (("PyMySQL", ("PyMySQL",)), ("psycopg", ("psycopg",)),
                        ("psycopg2", ("psycopg2", "psycopg2-binary")))


def version_line() -> str:
    """outbox_lite's version and those of the Peewee line and the drivers installed."""
    from importlib import metadata  # only here: it costs every other command's start-up

    def installed(names: Sequence[str]) -> str | None:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    drivers = [f"{shown} {version}" for shown, names in DRIVER_DISTRIBUTIONS
               if (version := installed(names)) is not None]
    return (f"outbox-lite {__version__} (Peewee {metadata.version('peewee')}, "
            f"peewee-migrate {metadata.version('peewee-migrate')}, {', '.join(drivers)}, "
            f"Python {platform.python_version()})")


class _Version(argparse.Action):
    """``--version``: prints :func:`version_line` (looked up only when asked) and exits."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()



def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outbox-lite",
        description="Transactional outbox tools for MySQL/MariaDB and PostgreSQL.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.add_argument("--version", action=_Version,
                        help="show the versions of outbox-lite, Peewee, peewee-migrate, "
                             "the drivers installed and Python, then exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "migrate", help="apply pending schema migrations (creates the database if missing)",
        description="Apply pending migrations; a second run is a no-op (a user with SELECT "
                    f"on {HISTORY_TABLE} and no DDL rights can run it to check). "
                    "--rollback undoes the last applied migration instead, and changes "
                    "nothing on a database never migrated.")
    add_database_flag(p)
    p.add_argument("--rollback", action="store_true", help="undo the last applied migration")
    p.set_defaults(handler=_cmd_migrate)

    p = commands.add_parser(
        "contention", help="run the multi-worker lock contention suite",
        description="Worker threads, each on its own connection, race over an outbox seeded "
                    "in a database of its own, <database>_contention, which it creates and "
                    "drops afterwards (unless --keep). When that database exists already it "
                    "refuses to run, unless --force lets it drop and re-create it. Each "
                    "scenario checks its invariants against the database; the exit status "
                    "is 1 when one breaks.")
    add_database_flag(p)
    p.add_argument("--scenario", action="append", choices=_all_scenarios(),
                   help="run only this scenario (repeatable; default: all, in order)")
    p.add_argument("--workers", type=parse_positive, default=8,
                   help="worker threads, each with its own connection (default: 8)")
    p.add_argument("--events", type=parse_positive, default=2000,
                   help="events seeded per scenario (default: 2000)")
    p.add_argument("--batch-size", type=parse_positive, default=50,
                   help="claim_batch limit per claim (default: 50)")
    p.add_argument("--max-attempts", type=parse_positive, default=3,
                   help="attempts before a dead letter, for crash/retry (default: 3)")
    p.add_argument("--keep", action="store_true", help="keep the contention database")
    p.add_argument("--force", action="store_true",
                   help="drop and re-create <database>_contention when it exists already")
    p.add_argument("--json", action="store_true", help="print one JSON document, no table")
    p.set_defaults(handler=_cmd_contention)

    events.add_commands(commands)
    relay.add_commands(commands)
    inbox.add_commands(commands)
    return parser


def _quiet_stdout() -> None:
    """After a broken pipe: send what is left to /dev/null, so the interpreter's last flush
    at exit finds nothing to complain about."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor
        pass


def _reported() -> tuple[type[BaseException], ...]:
    """What a command reports in one line: ours, Peewee's, the drivers' own (PyMySQL's
    MySQLError, psycopg's Error), the system's. Asked only once something was raised."""
    return (CommandError, OutboxError, pw.PeeweeException, OSError, RuntimeError,
            *driver_errors())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # Their own lines would repeat what our one line says (aiormq: "error when creating
        # transport" before the publisher reports the broker unreachable).
        for name in ("peewee_migrate", "aiormq", "nats"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    url: DatabaseUrl | None = None
    handler: Callable[[argparse.Namespace, DatabaseUrl | None], int] = args.handler
    try:
        url = database_url(args)
        status = handler(args, url)
        sys.stdout.flush()  # a broken pipe surfaces here, not at the interpreter's exit
        return status
    except BrokenPipeError:  # the reader went away (stats | head -1): nothing to say
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except (DatabaseUrlError, ValueError) as exc:
        if (interrupt := _signals.interruption(exc)) is not None:
            return _interrupted(args.command, interrupt, exc)
        print(f"outbox-lite {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except _reported() as exc:
        if (interrupt := _signals.interruption(exc)) is not None:
            return _interrupted(args.command, interrupt, exc)
        message = naming_the_database(describe_error(exc, url, args.command), args, url)
        if url is not None and _about_the_database(exc, url):
            where = _contention_database(url) if args.command == "contention" else url
            if str(where) not in message:  # not named already by its migrate hint
                message = naming_the_server(message, args, where)
        print(f"outbox-lite {args.command}: error: {message}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:  # Ctrl-C, or a signal that stops at once (_signals)
        return _interrupted(args.command, exc, exc)


def run() -> NoReturn:
    """The ``outbox-lite`` command (and ``python -m outbox_lite.cli``): :func:`main`, then exit
    with its status.

    Once ``main`` has returned, the command is done and only the interpreter's shutdown is
    left, so SIGINT is ignored from then on. Python resets its signal handlers to the system
    default while it shuts down, and a Ctrl-C there (the second of a graceful stop, pressed as
    the relay finished) killed a process that had ended cleanly: exit status -2 instead of
    its own (seen in CI). Every thread left then is a daemon thread, so nothing can wait for
    a Ctrl-C to end it."""
    status = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status)


def _interrupted(command: str, exc: KeyboardInterrupt, caught: BaseException) -> int:
    """Report a stop at once; the exit status a shell gives for the signal (130, 143).

    What the interrupt cut short (a driver's half-made result object, say) is finalized here,
    as its frames are cleared, with the finalizers' complaints unshown: a ``__del__`` of an
    object whose ``__init__`` never finished raises (PyMySQL's MySQLResult: no attribute
    'unbuffered_active'), and Python would print that traceback after our one line."""
    signum = exc.signum if isinstance(exc, _signals.Interrupted) else signal.SIGINT
    print(f"outbox-lite {command}: interrupted by {signal.Signals(signum).name}",
          file=sys.stderr)
    hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None
    try:
        seen: set[int] = set()
        error: BaseException | None = caught
        while error is not None and id(error) not in seen:  # the whole chain
            seen.add(id(error))
            traceback.clear_frames(error.__traceback__)
            error = error.__context__
        gc.collect()
    finally:
        sys.unraisablehook = hook
    return 128 + signum  # what a shell reports for a command the signal ended: 130, 143
