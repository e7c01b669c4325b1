"""``stats``, ``dead-letters`` (the listing, ``--requeue``, ``--delete``), ``requeue`` and
``purge``: looking after the outbox table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._families.url import DatabaseUrl
from .._credentials import redact
from ..repository import OutboxRepository
from ._args import (EXIT_OK, Age, UsageError, add_age_flags, add_database_flag,
                    open_repository, parse_event_id, parse_positive, parse_seconds, plural,
                    say_purged)


def add_commands(commands: Any) -> None:
    """Add stats, dead-letters, requeue and purge to the ``outbox-lite`` subcommands."""
    p = commands.add_parser(
        "stats", help="counts per status, lag, stuck claims, dead letters",
        description="Read the outbox's state in one go, changing nothing: events per status, "
                    "how long the oldest dispatchable event has waited, claims older than "
                    "--lock-timeout (a relay that died holding them), dead letters per error "
                    "code, and events held back behind a dead letter of their aggregate.")
    add_database_flag(p)
    p.add_argument("--lock-timeout", type=parse_seconds, default=300.0, metavar="SECONDS",
                   help="count claims older than this as expired (default: 300)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_cmd_stats)

    p = commands.add_parser(
        "dead-letters", help="list, requeue or delete dead letters (failed events)",
        description="Without an action, lists the dead letters (id, event type, aggregate, "
                    "error code, attempts, how long ago they failed, the stored message with "
                    "credentials masked; never the payload), at most --limit, oldest id "
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

    p = commands.add_parser(
        "purge", help="delete old published events in bounded batches",
        description="Delete published events whose published_at is older than AGE, "
                    "--batch-size rows per DELETE, each committed alone, so that no long "
                    "lock holds up the relays. Pending, processing and failed events are "
                    "never touched.")
    add_database_flag(p)
    add_age_flags(p, "events published")
    p.add_argument("--batch-size", type=parse_positive, default=1000,
                   help="rows per DELETE statement, each committed alone (default: 1000)")
    p.set_defaults(handler=_cmd_purge)


def _cmd_stats(args: argparse.Namespace, url: DatabaseUrl) -> int:
    with open_repository(url) as repo:
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
    with open_repository(url) as repo:
        if args.dry_run:
            changed = repo.count_dead_letters(ids, error_code=code)
        elif args.action == "requeue":
            changed = repo.requeue_failed(ids, error_code=code)
        else:
            changed = repo.delete_failed(ids, error_code=code)
    done = {"requeue": "requeued", "delete": "deleted"}[args.action]
    line = (f"would {args.action} " if args.dry_run else f"{done} ") + plural(changed,
                                                                             "dead letter")
    with_code = "" if code is None else f" with last_error_code {code}"
    if ids is not None and changed < len(ids):
        missing = len(ids) - changed
        line += (f"; {missing} of the {plural(len(ids), 'given id')} "
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
    with open_repository(url) as repo:
        total = repo.count_dead_letters(ids, error_code=code)
        rows = repo.list_dead_letters(ids, error_code=code, limit=limit)
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
    shown = (f"{plural(total, 'dead letter')}" if len(letters) == total
             else f"{len(letters):,} of {plural(total, 'dead letter')} (--limit {limit})")
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
    with open_repository(url) as repo:
        if args.dry_run:
            deleted = repo.count_purgeable(age.delta)
        else:
            deleted = repo.purge_published(age.delta, batch_size=args.batch_size)
    say_purged(plural(deleted, "published event"), age, args.dry_run)
    return EXIT_OK


def _add_dead_letter_flags(parser: argparse.ArgumentParser, *, action: str | None) -> None:
    add_database_flag(parser)
    if action is None:
        what = parser.add_mutually_exclusive_group()
        what.add_argument("--requeue", dest="action", action="store_const", const="requeue",
                          help="move them back to pending with attempt_count 0")
        what.add_argument("--delete", dest="action", action="store_const", const="delete",
                          help="delete them for good (they are never published)")
        parser.add_argument("--limit", type=parse_positive, metavar="N",
                            help="list at most N dead letters, oldest id first (default: "
                                 f"{DEFAULT_LIST_LIMIT}; without --requeue or --delete)")
        parser.add_argument("--json", action="store_true",
                            help="list them as one JSON document, each message in full")
    else:
        parser.set_defaults(action=action)
    parser.add_argument("--id", type=parse_event_id, action="extend", nargs="+", metavar="EVENT_ID",
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
