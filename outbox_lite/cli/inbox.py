"""``outbox-lite inbox purge``: the consumers' inbox (:mod:`outbox_lite.inbox`)."""

from __future__ import annotations

import argparse
from typing import Any

import peewee as pw

from .. import _checks
from .._families.url import DatabaseUrl
from ..errors import OutboxError
from ._args import (EXIT_OK, Age, DatabaseCommandError, add_age_flags, add_database_flag,
                    open_database, parse_positive, plural, say_purged)


def _consumer_name(text: str) -> str:
    from ..inbox import MAX_CONSUMER_LENGTH
    try:
        return _checks.name("consumer", text, MAX_CONSUMER_LENGTH)
    except OutboxError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_inbox_purge(args: argparse.Namespace, url: DatabaseUrl) -> int:
    from .. import inbox

    age: Age = args.older_than
    with open_database(url) as database:
        try:
            if args.dry_run:
                count = inbox.count_older_than(database, age.delta, consumer=args.consumer)
            else:
                count = inbox.purge(database, age.delta, consumer=args.consumer,
                                    batch_size=args.batch_size)
        except pw.ProgrammingError as exc:
            if url.family.missing_table(exc):  # the family's own line names outbox_event
                raise DatabaseCommandError(f"table {inbox.TABLE_NAME} is missing in {url.name}"
                                   " (run: outbox-lite migrate)") from None
            raise
    whose = "" if args.consumer is None else f" of consumer {args.consumer}"
    say_purged(plural(count, "inbox record") + whose, age, args.dry_run)
    return EXIT_OK


def add_commands(commands: Any) -> None:
    """Add inbox (and its purge) to the ``outbox-lite`` subcommands."""
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
    add_database_flag(p)
    add_age_flags(p, "records received")
    p.add_argument("--consumer", type=_consumer_name, metavar="NAME",
                   help="only this consumer's records (default: every consumer's)")
    p.add_argument("--batch-size", type=parse_positive, default=1000,
                   help="rows per page, deleted by primary key and committed alone "
                        "(default: 1000)")
    p.set_defaults(handler=_cmd_inbox_purge, command="inbox purge")
