"""The ``outbox-lite`` command: flags and ``OUTBOX_*`` variables mapped onto the library.

Every failure ends as one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import os
import importlib
import platform
import re
import signal
import sys
import threading
from typing import Any, Callable, Iterator, NamedTuple, NoReturn, Sequence

import peewee as pw
import pymysql

from . import __version__, _checks, _signals
from ._db import DEFAULT_URL, DatabaseExistsError, DatabaseUrl, DatabaseUrlError, tls_failure
from .errors import OutboxError, driver_errno
from .models import HISTORY_TABLE, MAX_ERROR_CODE_LENGTH, OutboxStatus
from .payload import redact
from .repository import OutboxRepository

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a command ended by SIGPIPE (128 + 13)

_SERVER_ERRORS = {
    1044: "access denied to database {url.name} for user {url.user}",
    1045: "access denied for user {url.user} (check the user and password)",
    1698: "access denied for user {url.user} (check the user and password)",
    1049: "database {url.name} does not exist (run: outbox-lite migrate)",
    1146: "table outbox_event is missing in {url.name} (run: outbox-lite migrate)",
    2003: "cannot reach the MySQL server at {url.host}:{url.port}",
    2005: "unknown MySQL server host {url.host}",
}
#: "CREATE command denied to user 'app'@'host' for table `db`.`t`" (MariaDB; MySQL: 't').
_DENIED_RE = re.compile(r"(\w+) command denied to user '([^']*)'@'[^']*' for table "
                        r"[`']?(?:[^`'.]*[`']?\.[`']?)?([^`'.]+)[`']?")
_GRANTS = "see 'Schema, migrations and grants' in the README"
_PRIVILEGE_HINTS = {
    "migrate": "migrate needs SELECT on {history} to see what is applied, and CREATE, "
               "ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE on the database to apply "
               "or roll back migrations; " + _GRANTS,
}


class CommandError(Exception):
    """A failure the command reports in one line."""


class UsageError(ValueError):
    """Flags that do not fit together (exit status 2, like argparse's own errors)."""


def _describe(exc: BaseException, url: DatabaseUrl | None, command: str) -> str:
    # Our errors chain the driver's (a ConnectionLostError from 2003, say): read its number.
    driver = exc.__cause__ if isinstance(exc, OutboxError) and exc.__cause__ else exc
    errno = driver_errno(driver)
    if errno in (1142, 1143):  # a table (or column) privilege is missing
        denied = _DENIED_RE.search(str(getattr(driver, "orig", driver)))
        if denied:
            what, user, table = denied.groups()
            hint = _PRIVILEGE_HINTS.get(command, _GRANTS).format(history=HISTORY_TABLE)
            return f"user {user} lacks the {what} privilege on table {table}: {hint}"
    unreadable = url.unreadable_files() if isinstance(exc, OSError) and url else []
    if unreadable:
        return (f"URL parameter {unreadable[0]} names a file that does not exist or cannot "
                "be read")
    tls = tls_failure(exc)  # before 2003: "cannot reach" would hide why
    if url is not None and tls is not None:
        return f"TLS with the MySQL server at {url.host}:{url.port} failed: {tls}"
    if url is not None and errno in _SERVER_ERRORS:
        return _SERVER_ERRORS[errno].format(url=url)
    orig = getattr(exc, "orig", exc)
    return redact(str(orig) or type(orig).__name__)


# ---------------------------------------------------------------------------
# Flags and OUTBOX_* variables to the library's arguments: the one place
# ---------------------------------------------------------------------------

def _url(args: argparse.Namespace) -> DatabaseUrl:
    raw = args.database_url or os.environ.get("OUTBOX_DATABASE_URL") or DEFAULT_URL
    return DatabaseUrl.parse(raw)


class Age(NamedTuple):
    """A duration as the user wrote it (``7d``) and as a timedelta."""

    text: str
    delta: dt.timedelta


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_UNIT_HELP = "s, m, h, d or w (seconds, minutes, hours, days, weeks)"


def _age(text: str) -> Age:
    """"90s", "15m", "12h", "7d", "2w": a unit is required (a bare 7 could mean anything)."""
    text = text.strip()
    number, unit = (text[:-1], text[-1].lower()) if text[-1:].lower() in _UNITS else (text, "")
    number = number.strip()
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration like 90s, 15m, 12h, 7d or 2w") from None
    if not unit and math.isfinite(value):
        if value <= 0:
            raise argparse.ArgumentTypeError(
                f"{text!r} must be a positive number with a unit: {_UNIT_HELP}")
        raise argparse.ArgumentTypeError(
            f"{text!r} needs a unit: {text}s, {text}m, {text}h, {text}d or {text}w")
    return Age(f"{number}{unit}", _checked_duration(text, value * _UNITS.get(unit, 1)))


def _checked_duration(text: str, seconds: float) -> dt.timedelta:
    """What the library's duration check allows, said in the command's words."""
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite duration")
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    if seconds > _checks.MAX_DURATION_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is longer than the limit, {_checks.MAX_DURATION_TEXT}")
    return dt.timedelta(seconds=seconds)


def _seconds(text: str) -> float:
    """A positive number of seconds, e.g. 300 or 0.5."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    _checked_duration(text, value)
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _event_id(text: str) -> int:
    try:
        return _checks.event_id(int(text))
    except (ValueError, OutboxError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an event id (a whole number from 1)") from None


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------

def _cmd_migrate(args: argparse.Namespace, url: DatabaseUrl) -> int:
    from . import migrate as schema  # peewee-migrate: only this command pays its import

    if args.rollback:
        if not url.exists():  # never create anything to undo nothing
            print(f"nothing to roll back: database {url.name} does not exist")
            return EXIT_OK
        with _database(url) as database:
            name = schema.rollback(database)
        print(f"rolled back {name}" if name else "nothing to roll back")
        return EXIT_OK
    if url.create_database():
        print(f"created database {url.name}")
    with _database(url) as database:
        applied = schema.migrate(database)
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
                            keep=args.keep, force=args.force, progress=progress)
    try:
        with _signals.interrupt_on(signal.SIGTERM):  # like Ctrl-C: the suite drops its database
            results = suite.run(args.scenario or _all_scenarios())
    except DatabaseExistsError:
        raise CommandError(
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


@contextlib.contextmanager
def _database(url: DatabaseUrl) -> Iterator[pw.MySQLDatabase]:
    """The command's database, closed when the command is done with it."""
    database = url.database()
    try:
        yield database
    finally:
        database.close()


@contextlib.contextmanager
def _repository(url: DatabaseUrl) -> Iterator[OutboxRepository]:
    with _database(url) as database:
        yield OutboxRepository(database)


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
    if stats.held_back:
        print(f"pending behind a dead letter of their aggregate: {stats.held_back}"
              " (ordered claims wait for it to be requeued or deleted)")
    return EXIT_OK


def _dead_letter_count(repo: OutboxRepository, ids: list[int] | None,
                       error_code: str | None) -> int:
    """How many dead letters the selection names (what a dry run reports)."""
    model = repo.model
    query = model.select().where(model.status == OutboxStatus.FAILED.value)
    if ids is not None:
        query = query.where(model.id.in_(_checks.event_ids(ids)))
    if error_code is not None:
        error_code = _checks.name("error_code", error_code, MAX_ERROR_CODE_LENGTH)
        query = query.where(model.last_error_code == error_code)
    return int(query.count())


def _cmd_dead_letters(args: argparse.Namespace, url: DatabaseUrl) -> int:
    ids = sorted(set(args.id)) if args.id else None
    code = args.error_code
    if args.action is None:
        return _list_dead_letters(args, url, ids, code)
    if getattr(args, "limit", None) is not None or getattr(args, "json", False):
        raise UsageError("--limit and --json go with the listing (dead-letters without"
                         " --requeue or --delete)")
    if args.all and (ids or code is not None):
        raise UsageError("--all selects every dead letter: give --all, or --id/--error-code")
    if args.action == "delete" and not (args.all or ids or code is not None):
        raise UsageError("--delete needs the dead letters named: --id N ..., "
                         "--error-code CODE, or --all for every one")
    with _repository(url) as repo:
        if args.dry_run:
            changed = _dead_letter_count(repo, ids, code)
        elif args.action == "requeue":
            changed = repo.requeue_failed(ids, error_code=code)
        else:
            changed = repo.delete_failed(ids, error_code=code)
    done = {"requeue": "requeued", "delete": "deleted"}[args.action]
    line = (f"would {args.action} " if args.dry_run else f"{done} ") + _plural(changed,
                                                                             "dead letter")
    with_code = "" if code is None else f" with last_error_code {code}"
    if ids is not None and changed < len(ids):
        missing = len(ids) - changed
        line += (f"; {missing} of the {_plural(len(ids), 'given id')} "
                 f"{'is not a dead letter' if missing == 1 else 'are not dead letters'}"
                 f"{with_code} (missing, or not failed)")
    elif changed == 0 and code is not None:
        line += f" (no dead letter has last_error_code {code})"
    print(line + (" (dry run: nothing changed)" if args.dry_run else ""))
    return EXIT_OK


# -- the dead-letter listing -----------------------------------------------------------

DEFAULT_LIST_LIMIT = 50
_MESSAGE_WIDTH = 60  # characters of the stored message in the table (--json has it all)


def _list_dead_letters(args: argparse.Namespace, url: DatabaseUrl, ids: list[int] | None,
                       code: str | None) -> int:
    """``dead-letters`` with no action: the dead letters (oldest id first), at most
    ``--limit``, as a table or ``--json``; payloads are never shown."""
    if args.all or args.dry_run:
        raise UsageError("--all and --dry-run go with --requeue or --delete; the listing"
                         " shows at most --limit dead letters")
    limit = DEFAULT_LIST_LIMIT if args.limit is None else args.limit
    with _repository(url) as repo:
        model = repo.model
        total = _dead_letter_count(repo, ids, code)
        query = (model.select(model.id, model.event_type, model.aggregate_type,
                              model.aggregate_id, model.last_error_code,
                              model.last_error_message, model.attempt_count, model.created_at,
                              model.updated_at)
                 .where(model.status == OutboxStatus.FAILED.value))
        if ids is not None:
            query = query.where(model.id.in_(ids))
        if code is not None:
            query = query.where(model.last_error_code == code)
        rows = list(query.order_by(model.id).limit(limit))
        now = repo.clock()
    letters = [{"id": e.id, "event_type": e.event_type, "aggregate_type": e.aggregate_type,
                "aggregate_id": e.aggregate_id, "error_code": e.last_error_code,
                "error_message": redact(e.last_error_message or ""),
                "attempt_count": e.attempt_count, "created_at": e.created_at.isoformat(),
                "failed_at": e.updated_at.isoformat(),
                "age_seconds": round(max(0.0, (now - e.updated_at).total_seconds()), 3)}
               for e in rows]
    if args.json:
        print(json.dumps({"dead_letters": letters, "shown": len(letters), "total": total,
                          "limit": limit}, indent=2))
        return EXIT_OK
    if not letters:
        print("no dead letters" + ("" if ids is None and code is None else " match"))
        return EXIT_OK
    table = [("ID", "EVENT TYPE", "AGGREGATE", "CODE", "ATTEMPTS", "FAILED", "MESSAGE")]
    table += [(str(d["id"]), _printable(d["event_type"]),
               _printable(f"{d['aggregate_type']}:{d['aggregate_id']}"),
               _printable(d["error_code"] or "-"), str(d["attempt_count"]),
               _ago(float(d["age_seconds"])) + " ago",
               _printable(d["error_message"], _MESSAGE_WIDTH)) for d in letters]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    shown = (f"{_plural(total, 'dead letter')}" if len(letters) == total
             else f"{len(letters):,} of {_plural(total, 'dead letter')} (--limit {limit})")
    print(f"{shown}; act on them with: outbox-lite dead-letters --requeue|--delete --id ID ...")
    return EXIT_OK


def _printable(text: str, width: int | None = None) -> str:
    """One line a terminal shows as it is: control characters escaped (a stored message may
    hold anything a broker said), cut to ``width`` characters."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if width is not None and len(text) > width:
        text = text[:width - 1] + "…"
    return text


def _ago(seconds: float) -> str:
    """90 -> "1m 30s", 7200 -> "2h 0m", 200000 -> "2d 7h"."""
    whole = int(seconds)
    for size, unit, smaller, small_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"),
                                            (60, "m", 1, "s")):
        if whole >= size:
            return f"{whole // size}{unit} {whole % size // smaller}{small_unit}"
    return f"{whole}s"


def _cmd_purge(args: argparse.Namespace, url: DatabaseUrl) -> int:
    age: Age = args.older_than
    with _repository(url) as repo:
        if args.dry_run:
            model = repo.model
            cutoff = _checks.before("older_than", _checks.instant("clock()", repo.clock()),
                                    age.delta)
            deleted = int(model.select().where(
                (model.status == OutboxStatus.PUBLISHED.value)
                & (model.published_at < cutoff)).count())
        else:
            deleted = repo.purge_published(age.delta, batch_size=args.batch_size)
    events = _plural(deleted, "published event")
    if args.dry_run:
        print(f"would purge {events} older than {age.text} (dry run: nothing changed)")
    else:
        print(f"purged {events} older than {age.text}")
    return EXIT_OK


def _cmd_relay(args: argparse.Namespace, url: DatabaseUrl) -> int:
    from .relay import Relay

    metrics = _relay_metrics(args)
    publisher = _publisher(args)
    server = None
    try:
        with _repository(url) as repo:
            relay = Relay(repo, publisher, worker_id=args.worker_id,
                          batch_size=args.batch_size, lock_timeout=args.lock_timeout,
                          ordered=args.ordered, max_idle_pause=args.max_idle_pause,
                          progress_every=args.progress_every, metrics=metrics,
                          stuck_after=args.stuck_after)
            repo.stats()  # a wrong URL, a missing grant or table: one line now, not in the loop
            logging.getLogger("outbox_lite.relay").setLevel(logging.INFO)
            if metrics is not None:
                server = _serve_metrics(metrics, args.metrics_host, args.metrics_port)
            stop = threading.Event()
            with _signals.stop_on_signals(stop, _say_stopping):
                print(f"outbox-lite relay {relay.worker_id}: from {url} to {publisher!r}"
                      + (", ordered" if args.ordered else "")
                      + (f"; metrics on {_metrics_url(server)}/metrics" if server else ""),
                      file=sys.stderr, flush=True)
                relay.run(stop, until_empty=args.until_empty)
    finally:
        if server is not None:
            server.close()
        publisher.close()
    return EXIT_OK


def _relay_metrics(args: argparse.Namespace) -> Any:
    """The RelayMetrics that --metrics-port asks for (in prometheus_client's default
    registry, with the process's own metrics), or None."""
    if args.metrics_port is None:
        given = [flag for flag, value in (("--metrics-host", args.metrics_host),
                                          ("--stats-every", args.stats_every),
                                          ("--stuck-after", args.stuck_after))
                 if value is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} go{'es' if len(given) == 1 else ''}"
                             " with --metrics-port")
        return None
    try:
        from .metrics import RelayMetrics
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    return RelayMetrics(stats_every=15.0 if args.stats_every is None else args.stats_every)


def _serve_metrics(metrics: Any, host: str | None, port: int) -> Any:
    host = host or "127.0.0.1"
    try:
        return metrics.serve(port, host)
    except OSError as exc:
        raise CommandError(f"--metrics-port {port}: cannot listen on {host}:{port}"
                           f" ({exc.strerror or exc})") from None


def _metrics_url(server: Any) -> str:
    host = f"[{server.host}]" if ":" in server.host else server.host
    return f"http://{host}:{server.port}"


class _Broker(NamedTuple):
    """A shipped publisher as the relay's flags name it."""

    url_flag: str  # --bullmq-url
    url_env: str  # $OUTBOX_BULLMQ_URL
    target_flags: tuple[str, ...]  # required first, then optional: ("--queue",)
    make: Callable[[str, argparse.Namespace], Any]  # (url, args) -> publisher


def _bullmq(url: str, args: argparse.Namespace) -> Any:
    from .publishers.bullmq import BullMQPublisher
    return BullMQPublisher(url, args.queue)


def _rabbitmq(url: str, args: argparse.Namespace) -> Any:
    from .publishers.rabbitmq import RabbitMQPublisher
    return RabbitMQPublisher(url, args.exchange, routing_key=args.routing_key)


def _nats(url: str, args: argparse.Namespace) -> Any:
    from .publishers.nats import NATSPublisher
    return NATSPublisher(url, args.subject_prefix)


_BROKERS = {
    "BullMQ": _Broker("--bullmq-url", "OUTBOX_BULLMQ_URL", ("--queue",), _bullmq),
    "RabbitMQ": _Broker("--rabbitmq-url", "OUTBOX_RABBITMQ_URL",
                        ("--exchange", "--routing-key"), _rabbitmq),
    "NATS": _Broker("--nats-url", "OUTBOX_NATS_URL", ("--subject-prefix",), _nats),
}
_NAME_A_BROKER = ("name a broker: --bullmq-url REDIS_URL --queue NAME, --rabbitmq-url URL "
                  "--exchange NAME [--routing-key KEY], --nats-url URL --subject-prefix "
                  "PREFIX (each URL also from $OUTBOX_BULLMQ_URL, $OUTBOX_RABBITMQ_URL, "
                  "$OUTBOX_NATS_URL), or --publisher MODULE:FACTORY")


def _flag_value(args: argparse.Namespace, flag: str) -> Any:
    return getattr(args, flag.lstrip("-").replace("-", "_"))


def _publisher(args: argparse.Namespace) -> Any:
    """The publisher the flags name: one shipped broker's, or the one MODULE:FACTORY returns.
    A broker is chosen by its flags on the command line; its URL flag may come from its
    variable. The publisher is pinged before anything is claimed: an unreachable broker, a
    wrong password, a missing exchange or stream is one line, now."""
    given = {name: [f for f in (b.url_flag, *b.target_flags) if _flag_value(args, f)]
             for name, b in _BROKERS.items()}
    chosen = [name for name, flags in given.items() if flags]
    if args.publisher:
        if chosen:
            flag = given[chosen[0]][0]
            raise UsageError(f"{flag} goes with {_BROKERS[chosen[0]].url_flag}, not with"
                             " --publisher")
        return _publisher_from_factory(args.publisher)
    if len(chosen) > 1:
        raise UsageError(f"choose one broker, not {' and '.join(chosen)} "
                         f"({', '.join(f for name in chosen for f in given[name])})")
    if not chosen:
        raise UsageError(_NAME_A_BROKER)
    broker = _BROKERS[chosen[0]]
    url = _flag_value(args, broker.url_flag) or os.environ.get(broker.url_env)
    target = broker.target_flags[0]
    if not url or not _flag_value(args, target):
        missing = target if url else f"{broker.url_flag} (or ${broker.url_env})"
        raise UsageError(f"{_NAME_A_BROKER}; {chosen[0]} also needs {missing}")
    publisher = broker.make(url, args)
    try:
        publisher.ping()
    except BaseException:
        publisher.close()
        raise
    return publisher


def _publisher_from_factory(spec: str) -> Any:
    from .relay import is_publisher

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(
            f"--publisher {spec!r} must be MODULE:FACTORY, e.g. myapp.outbox:publisher")
    if not any(os.path.abspath(entry or os.curdir) == os.getcwd() for entry in sys.path):
        # As `python -m` does: a module beside the user is found (the console script's own
        # sys.path starts at its bin folder instead).
        sys.path.insert(0, os.getcwd())
    try:
        factory: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            factory = getattr(factory, part)
    except ImportError as exc:
        raise UsageError(f"--publisher {spec}: cannot import {module_name} ({exc})") from None
    except AttributeError:
        raise UsageError(f"--publisher {spec}: {module_name} has no {attribute}") from None
    if not callable(factory):
        raise UsageError(f"--publisher {spec} is not callable")
    publisher = factory()
    if not is_publisher(publisher):
        raise UsageError(f"--publisher {spec} returned a {type(publisher).__name__}, which has"
                         " no publish(events) and close()")
    return publisher


def _say_stopping(signum: int, first: bool) -> None:
    """What the signal that arrived does to the relay (said from the signal watcher thread,
    never from the handler: see outbox_lite._signals)."""
    name = signal.Signals(signum).name
    if not first:
        does = "already stopping after the batch in hand is recorded (SIGINT stops at once)"
    elif signum == signal.SIGINT:
        does = "stopping after the batch in hand is recorded (Ctrl-C again stops at once)"
    else:
        does = ("stopping after the batch in hand is recorded (a SIGINT stops at once,"
                " leaving that batch's claims to expire)")
    print(f"outbox-lite relay: {name}: {does}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# outbox-lite inbox purge: the consumers' inbox (outbox_lite.inbox)
# ---------------------------------------------------------------------------

def _consumer_name(text: str) -> str:
    from .inbox import MAX_CONSUMER_LENGTH
    try:
        return _checks.name("consumer", text, MAX_CONSUMER_LENGTH)
    except OutboxError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_inbox_purge(args: argparse.Namespace, url: DatabaseUrl) -> int:
    from . import inbox

    age: Age = args.older_than
    with _database(url) as database:
        try:
            if args.dry_run:
                count = inbox.count_older_than(database, age.delta, consumer=args.consumer)
            else:
                count = inbox.purge(database, age.delta, consumer=args.consumer,
                                    batch_size=args.batch_size)
        except pw.ProgrammingError as exc:
            if driver_errno(exc) == 1146:  # _SERVER_ERRORS names outbox_event's
                raise CommandError(f"table {inbox.TABLE_NAME} is missing in {url.name}"
                                   " (run: outbox-lite migrate)") from None
            raise
    records = _plural(count, "inbox record")
    whose = "" if args.consumer is None else f" of consumer {args.consumer}"
    if args.dry_run:
        print(f"would purge {records}{whose} older than {age.text} (dry run: nothing changed)")
    else:
        print(f"purged {records}{whose} older than {age.text}")
    return EXIT_OK


def _add_inbox_commands(commands: Any) -> None:
    inbox = commands.add_parser(
        "inbox", help="the consumers' inbox: purge old records",
        description="The inbox (outbox_lite.Inbox) keeps one record per message a consumer "
                    "has handled, so that a redelivery changes nothing.")
    actions = inbox.add_subparsers(dest="inbox_command", required=True, metavar="ACTION")
    p = actions.add_parser(
        "purge", help="delete old inbox records in bounded batches",
        description="Delete inbox records received longer ago than AGE (of every consumer, "
                    "or of --consumer NAME), a page at a time, each DELETE committed alone. "
                    "Keep records longer than any message can be redelivered: see the "
                    "README's consumer section.")
    _add_database_flag(p)
    p.add_argument("--older-than", type=_age, required=True, metavar="AGE",
                   help="delete records received longer ago than AGE, a number with a unit: "
                        f"{_UNIT_HELP}, e.g. 90s, 12h, 7d (a bare number is refused)")
    p.add_argument("--consumer", type=_consumer_name, metavar="NAME",
                   help="only this consumer's records (default: every consumer's)")
    p.add_argument("--batch-size", type=_positive, default=1000,
                   help="rows per page, deleted by primary key and committed alone "
                        "(default: 1000)")
    p.add_argument("--dry-run", action="store_true",
                   help="say how many would be deleted, delete nothing")
    p.set_defaults(handler=_cmd_inbox_purge, command="inbox purge")


def _all_scenarios() -> tuple[str, ...]:
    from .contention import SCENARIOS
    return SCENARIOS


# ---------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """Usage errors in one line too (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version_line() -> str:
    """outbox_lite's version and those of the Peewee line and drivers it runs on."""
    from importlib import metadata  # only here: it costs every other command's start-up

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
        help="mysql://user[:password]@host[:port]/database[?option=value&...] "
             f"(default: $OUTBOX_DATABASE_URL, else {DEFAULT_URL}). Percent-encode the user "
             "and password (%% as %%25); options: " + ", ".join(_url_options()))


def _url_options() -> list[str]:
    from ._db import OPTIONS
    return list(OPTIONS)


def _add_dead_letter_flags(parser: argparse.ArgumentParser, *, action: str | None) -> None:
    _add_database_flag(parser)
    if action is None:
        what = parser.add_mutually_exclusive_group()
        what.add_argument("--requeue", dest="action", action="store_const", const="requeue",
                          help="move them back to pending with attempt_count 0")
        what.add_argument("--delete", dest="action", action="store_const", const="delete",
                          help="delete them for good (they are never published)")
        parser.add_argument("--limit", type=_positive, metavar="N",
                            help="list at most N dead letters, oldest id first (default: "
                                 f"{DEFAULT_LIST_LIMIT}; without --requeue or --delete)")
        parser.add_argument("--json", action="store_true",
                            help="list them as one JSON document, each message in full")
    else:
        parser.set_defaults(action=action)
    parser.add_argument("--id", type=_event_id, action="extend", nargs="+", metavar="EVENT_ID",
                        help="only these events (repeatable; ids that are not dead letters "
                             "are left alone and counted in the report)")
    parser.add_argument("--error-code", metavar="CODE",
                        help="only dead letters whose last_error_code is CODE")
    parser.add_argument("--all", action="store_true",
                        help="every dead letter (required for --delete when no --id or "
                             "--error-code is given)" if action is None else
                             "every dead letter (the default when no --id or --error-code "
                             "is given)")
    parser.add_argument("--dry-run", action="store_true",
                        help="say how many would change, change nothing")
    parser.set_defaults(handler=_cmd_dead_letters)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is from 0 to 65535, not {value}")
    return value


def _add_metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=_port, metavar="PORT",
                        help="serve Prometheus metrics at /metrics and a health check at "
                             "/healthz on this port (0: any free one, named at start-up); "
                             "needs outbox-lite[metrics]")
    parser.add_argument("--metrics-host", metavar="HOST",
                        help="the address to serve them on (default: 127.0.0.1; 0.0.0.0 for "
                             "every interface)")
    parser.add_argument("--stats-every", type=_seconds, metavar="SECONDS",
                        help="seconds between the outbox statistics read for the gauges, "
                             "one query set per relay (default: 15)")
    parser.add_argument("--stuck-after", type=_seconds, metavar="SECONDS",
                        help="/healthz answers 503 once the relay's loop has made no progress "
                             "for this long: a database or a publisher that does not return "
                             "(default: the lock timeout, at least 10 s)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outbox-lite", description="Transactional outbox tools for MySQL/MariaDB.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.add_argument("--version", action=_Version,
                        help="show the versions of outbox-lite, Peewee, peewee-migrate, "
                             "PyMySQL and Python, then exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "migrate", help="apply pending schema migrations (creates the database if missing)",
        description="Apply pending migrations; a second run is a no-op (a user with SELECT "
                    f"on {HISTORY_TABLE} and no DDL rights can run it to check). "
                    "--rollback undoes the last applied migration instead, and changes "
                    "nothing on a database never migrated.")
    _add_database_flag(p)
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
    p.add_argument("--force", action="store_true",
                   help="drop and re-create <database>_contention when it exists already")
    p.add_argument("--json", action="store_true", help="print one JSON document, no table")
    p.set_defaults(handler=_cmd_contention)

    p = commands.add_parser("stats", help="counts per status, lag, stuck claims, dead letters")
    _add_database_flag(p)
    p.add_argument("--lock-timeout", type=_seconds, default=300.0, metavar="SECONDS",
                   help="count claims older than this as expired (default: 300)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_cmd_stats)

    p = commands.add_parser(
        "dead-letters", help="list, requeue or delete dead letters (failed events)",
        description="Without an action, lists the dead letters (id, event type, aggregate, "
                    "error code, the stored message with credentials masked, attempts, how "
                    "long ago they failed; never the payload), at most --limit, oldest id "
                    "first, or --json. --requeue moves failed events back to pending with "
                    "attempt_count 0; --delete removes them for good. All act on every dead "
                    "letter, or on those selected by --id and/or --error-code; --delete of "
                    "every one needs --all. --dry-run says how many would change.")
    _add_dead_letter_flags(p, action=None)

    p = commands.add_parser(
        "requeue", help="the same as: dead-letters --requeue",
        description="Move failed events back to pending with attempt_count 0: all of them, "
                    "or those selected by --id and/or --error-code. The same as "
                    "outbox-lite dead-letters --requeue.")
    _add_dead_letter_flags(p, action="requeue")

    p = commands.add_parser("purge", help="delete old published events in bounded batches")
    _add_database_flag(p)
    p.add_argument("--older-than", type=_age, required=True, metavar="AGE",
                   help="delete events published longer ago than AGE, a number with a unit: "
                        f"{_UNIT_HELP}, e.g. 90s, 12h, 7d (a bare number is refused)")
    p.add_argument("--batch-size", type=_positive, default=1000,
                   help="rows per DELETE statement, each committed alone (default: 1000)")
    p.add_argument("--dry-run", action="store_true",
                   help="say how many would be deleted, delete nothing")
    p.set_defaults(handler=_cmd_purge)

    p = commands.add_parser(
        "relay", help="publish events to BullMQ, RabbitMQ, NATS JetStream (or any publisher)"
                      " until stopped",
        description="Runs the worker loop: release expired claims, claim a batch, publish it "
                    "outside any transaction (renewing the claims while a publish runs long), "
                    "record the outcomes. SIGTERM or SIGINT stop it once the batch in hand "
                    "is recorded; a second SIGINT stops it at once. A progress line goes to "
                    "stderr every few seconds; payloads and credentials never do.")
    _add_database_flag(p)
    p.add_argument("--bullmq-url", metavar="REDIS_URL",
                   help="publish to BullMQ on this Redis, redis://[:password@]host:port/db "
                        "(default: $OUTBOX_BULLMQ_URL, which keeps a password out of ps); "
                        "needs outbox-lite[bullmq] and --queue")
    p.add_argument("--queue", metavar="NAME", help="the BullMQ queue to add jobs to")
    p.add_argument("--rabbitmq-url", metavar="URL",
                   help="publish to RabbitMQ with publisher confirms, amqp://user:password@"
                        "host:port/vhost (default: $OUTBOX_RABBITMQ_URL); needs "
                        "outbox-lite[rabbitmq] and --exchange")
    p.add_argument("--exchange", metavar="NAME",
                   help="the RabbitMQ exchange to publish to (it must exist)")
    p.add_argument("--routing-key", metavar="KEY",
                   help="the routing key of every message (default: the event's event_type)")
    p.add_argument("--nats-url", metavar="URL",
                   help="publish to NATS JetStream, nats://[user:password@]host:port, several "
                        "separated by commas (default: $OUTBOX_NATS_URL); needs "
                        "outbox-lite[nats] and --subject-prefix")
    p.add_argument("--subject-prefix", metavar="PREFIX",
                   help="publish each event to PREFIX.<event_type> (a JetStream stream must "
                        "capture PREFIX.>)")
    p.add_argument("--publisher", metavar="MODULE:FACTORY",
                   help="instead of a shipped broker: publish with what this callable returns"
                        " (an object with publish(events) and close()); MODULE is found in "
                        "the current directory too, as with python -m")
    p.add_argument("--batch-size", type=_positive, default=100,
                   help="events per claim and per publish (default: 100)")
    p.add_argument("--lock-timeout", type=_seconds, default=300.0, metavar="SECONDS",
                   help="claims older than this go back to other relays; a publish that runs "
                        "longer renews its claims every third of it (default: 300)")
    p.add_argument("--ordered", action="store_true",
                   help="claim only the head of each aggregate, so its events are published "
                        "one at a time in id order (every relay of the outbox must use it)")
    p.add_argument("--worker-id", metavar="ID",
                   help="the locked_by of this relay's claims (default: host:pid:random)")
    p.add_argument("--until-empty", action="store_true",
                   help="exit 0 once no event is pending or processing (with --ordered: but "
                        "those behind a dead letter of their aggregate)")
    p.add_argument("--max-idle-pause", type=_seconds, default=0.05, metavar="SECONDS",
                   help="the longest wait between polls of an empty outbox, which bounds the "
                        "delay of an event after a quiet spell: a longer one costs the server "
                        "fewer queries (default: 0.05, about 60 queries/s)")
    p.add_argument("--progress-every", type=_seconds, default=5.0, metavar="SECONDS",
                   help="seconds between progress lines (default: 5)")
    _add_metrics_flags(p)
    p.set_defaults(handler=_cmd_relay)

    _add_inbox_commands(commands)
    return parser


def _quiet_stdout() -> None:
    """After a broken pipe: send what is left to /dev/null, so the interpreter's last flush
    at exit finds nothing to complain about."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor
        pass


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
    handler: Callable[[argparse.Namespace, DatabaseUrl], int] = args.handler
    try:
        url = _url(args)
        status = handler(args, url)
        sys.stdout.flush()  # a broken pipe surfaces here, not at the interpreter's exit
        return status
    except BrokenPipeError:  # the reader went away (stats | head -1): nothing to say
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except (DatabaseUrlError, ValueError) as exc:
        if (interrupt := _interruption(exc)) is not None:
            return _interrupted(args.command, interrupt)
        print(f"outbox-lite {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (CommandError, OutboxError, pw.PeeweeException, pymysql.MySQLError, OSError,
            RuntimeError) as exc:
        if (interrupt := _interruption(exc)) is not None:
            return _interrupted(args.command, interrupt)
        print(f"outbox-lite {args.command}: error: {_describe(exc, url, args.command)}",
              file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:  # Ctrl-C, or a signal that stops at once (_signals)
        return _interrupted(args.command, exc)


def _interruption(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt an error was raised while unwinding from (a rollback on the connection
    the interrupt broke, say), if any: that error is the interrupt's consequence."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _interrupted(command: str, exc: KeyboardInterrupt) -> int:
    signum = exc.signum if isinstance(exc, _signals.Interrupted) else signal.SIGINT
    print(f"outbox-lite {command}: interrupted by {signal.Signals(signum).name}",
          file=sys.stderr)
    return 128 + signum  # what a shell reports for a command the signal ended: 130, 143


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
