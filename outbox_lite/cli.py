"""The ``outbox-lite`` command: flags and ``OUTBOX_*`` variables mapped onto the library.

Every failure ends as one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import sys
from importlib import metadata
from typing import Any, Callable, Iterator, Sequence

import peewee as pw
import pymysql

from . import __version__
from . import migrate as schema
from ._db import DEFAULT_URL, DatabaseUrl, DatabaseUrlError
from .errors import OutboxError, driver_errno
from .payload import redact
from .repository import OutboxRepository

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_SERVER_ERRORS = {
    1044: "access denied to database {url.name} for user {url.user}",
    1045: "access denied for user {url.user} (check the user and password)",
    1698: "access denied for user {url.user} (check the user and password)",
    1049: "database {url.name} does not exist (run: outbox-lite migrate)",
    1146: "table outbox_event is missing in {url.name} (run: outbox-lite migrate)",
    2003: "cannot reach the MySQL server at {url.host}:{url.port}",
    2005: "unknown MySQL server host {url.host}",
}


class CommandError(Exception):
    """A failure the command reports in one line."""


def _describe(exc: BaseException, url: DatabaseUrl | None) -> str:
    errno = driver_errno(exc)
    if url is not None and errno in _SERVER_ERRORS:
        return _SERVER_ERRORS[errno].format(url=url)
    orig = getattr(exc, "orig", exc)
    return redact(str(orig) or type(orig).__name__)


def _url(args: argparse.Namespace) -> DatabaseUrl:
    raw = args.database_url or os.environ.get("OUTBOX_DATABASE_URL") or DEFAULT_URL
    return DatabaseUrl.parse(raw)


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------

def _cmd_migrate(args: argparse.Namespace, url: DatabaseUrl) -> int:
    if args.rollback:
        database = url.database()
        name = schema.rollback(database)
        database.close()
        print(f"rolled back {name}" if name else "nothing to roll back")
        return EXIT_OK
    if url.create_database():
        print(f"created database {url.name}")
    database = url.database()
    applied = schema.migrate(database)
    database.close()
    print("applied " + ", ".join(applied) if applied else f"{url.name} is up to date")
    return EXIT_OK


def _cmd_contention(args: argparse.Namespace, url: DatabaseUrl) -> int:
    from .contention import ContentionSuite, format_table

    def progress(message: str) -> None:
        if not args.json:
            print(f"... {message}", file=sys.stderr, flush=True)

    target = url.with_name(f"{url.name}_contention")
    suite = ContentionSuite(target, workers=args.workers, events=args.events,
                            batch_size=args.batch_size, max_attempts=args.max_attempts,
                            keep=args.keep, progress=progress)
    results = suite.run(args.scenario or _all_scenarios())
    if args.json:
        print(json.dumps({"database": str(target), "workers": args.workers,
                          "events": args.events, "batch_size": args.batch_size,
                          "ok": all(r.ok for r in results),
                          "scenarios": [r.as_dict() for r in results]}, indent=2))
    else:
        print(format_table(results))
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


@contextlib.contextmanager
def _repository(url: DatabaseUrl) -> Iterator[OutboxRepository]:
    repo = OutboxRepository(url.database())
    try:
        yield repo
    finally:
        repo.database.close()


def _cmd_stats(args: argparse.Namespace, url: DatabaseUrl) -> int:
    with _repository(url) as repo:
        stats = repo.stats(lock_timeout=args.lock_timeout)
    if args.json:
        print(json.dumps(stats.as_dict(), indent=2))
        return EXIT_OK
    for status, count in stats.counts.items():
        print(f"{status:<12} {count}")
    age = stats.oldest_pending_age
    print(f"oldest dispatchable event waiting: {'-' if age is None else f'{age.total_seconds():.1f} s'}")
    print(f"claims older than {args.lock_timeout:g} s: {stats.expired_claims}")
    for code, count in sorted(stats.dead_letters_by_code.items()):
        print(f"dead letters with {code or '(no code)'}: {count}")
    return EXIT_OK


def _cmd_requeue(args: argparse.Namespace, url: DatabaseUrl) -> int:
    with _repository(url) as repo:
        moved = repo.requeue_failed(args.id, error_code=args.error_code)
    print(f"requeued {moved} dead letters")
    return EXIT_OK


def _cmd_purge(args: argparse.Namespace, url: DatabaseUrl) -> int:
    with _repository(url) as repo:
        deleted = repo.purge_published(args.older_than, batch_size=args.batch_size)
    print(f"purged {deleted} published events older than {args.older_than}")
    return EXIT_OK


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> dt.timedelta:
    """"90", "90s", "15m", "12h" or "7d"."""
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m, 12h, 7d")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return dt.timedelta(seconds=value * _UNITS[unit])


def _all_scenarios() -> tuple[str, ...]:
    from .contention import SCENARIOS
    return SCENARIOS


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def version_line() -> str:
    """outbox_lite's version and those of the Peewee line and drivers it runs on."""
    return (f"outbox-lite {__version__} (Peewee {metadata.version('peewee')}, "
            f"peewee-migrate {metadata.version('peewee-migrate')}, "
            f"PyMySQL {metadata.version('PyMySQL')}, Python {platform.python_version()})")


class _Version(argparse.Action):
    """``--version``: prints :func:`version_line` (looked up only when asked) and exits."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()


def _add_database_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url", metavar="URL",
        help="mysql://user[:password]@host[:port]/database "
             f"(default: $OUTBOX_DATABASE_URL, else {DEFAULT_URL})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox-lite", description="Transactional outbox tools for MySQL/MariaDB.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.add_argument("--version", action=_Version,
                        help="show the versions of outbox-lite, Peewee, peewee-migrate, "
                             "PyMySQL and Python, then exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "migrate", help="apply pending schema migrations (creates the database if missing)",
        description="Apply pending migrations; a second run is a no-op. "
                    "--rollback undoes the last applied migration instead.")
    _add_database_flag(p)
    p.add_argument("--rollback", action="store_true", help="undo the last applied migration")
    p.set_defaults(handler=_cmd_migrate)

    p = commands.add_parser(
        "contention", help="run the multi-worker lock contention suite",
        description="Worker threads, each on its own connection, race over an outbox seeded "
                    "in a fresh database named <database>_contention (dropped afterwards "
                    "unless --keep). Each scenario checks its invariants against the "
                    "database; the exit status is 1 when one breaks.")
    _add_database_flag(p)
    p.add_argument("--scenario", action="append", choices=_all_scenarios(),
                   help="run only this scenario (repeatable; default: all, in order)")
    p.add_argument("--workers", type=_positive, default=8,
                   help="worker threads, each with its own connection (default: 8)")
    p.add_argument("--events", type=_positive, default=2000,
                   help="events seeded per scenario (default: 2000)")
    p.add_argument("--batch-size", type=_positive, default=50,
                   help="claim_batch limit per claim (default: 50)")
    p.add_argument("--max-attempts", type=_positive, default=3,
                   help="attempts before a dead letter, for crash/retry (default: 3)")
    p.add_argument("--keep", action="store_true", help="keep the contention database")
    p.add_argument("--json", action="store_true", help="print one JSON document, no table")
    p.set_defaults(handler=_cmd_contention)

    p = commands.add_parser("stats", help="counts per status, lag, stuck claims, dead letters")
    _add_database_flag(p)
    p.add_argument("--lock-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="count claims older than this as expired (default: 300)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_cmd_stats)

    p = commands.add_parser("requeue", help="move dead letters back to pending",
                            description="Move failed events back to pending with "
                                        "attempt_count 0: all of them, or those selected by "
                                        "--id and/or --error-code.")
    _add_database_flag(p)
    p.add_argument("--id", type=_positive, action="append", metavar="EVENT_ID",
                   help="requeue this event (repeatable)")
    p.add_argument("--error-code", metavar="CODE",
                   help="requeue only dead letters whose last_error_code is CODE")
    p.set_defaults(handler=_cmd_requeue)

    p = commands.add_parser("purge", help="delete old published events in bounded batches")
    _add_database_flag(p)
    p.add_argument("--older-than", type=_duration, required=True, metavar="AGE",
                   help="delete events published longer ago than AGE (90s, 15m, 12h, 7d)")
    p.add_argument("--batch-size", type=_positive, default=1000,
                   help="rows per DELETE statement, each committed alone (default: 1000)")
    p.set_defaults(handler=_cmd_purge)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("peewee_migrate").setLevel(logging.CRITICAL)
    url: DatabaseUrl | None = None
    handler: Callable[[argparse.Namespace, DatabaseUrl], int] = args.handler
    try:
        url = _url(args)
        return handler(args, url)
    except DatabaseUrlError as exc:
        print(f"outbox-lite: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"outbox-lite: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (CommandError, OutboxError, pw.PeeweeException, pymysql.MySQLError, OSError,
            RuntimeError) as exc:
        print(f"outbox-lite: error: {_describe(exc, url)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("outbox-lite: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
