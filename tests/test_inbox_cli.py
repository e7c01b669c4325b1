"""`outbox-lite inbox purge`: the rules `outbox-lite purge` follows (a unit is required, a dry
run counts, one-line errors, exit codes), and the grants the README gives the inbox."""

from __future__ import annotations

import dataclasses
import os
import shlex

import pytest

from outbox_lite import Inbox
from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.cli import main

from _helpers import FAMILY, create_login, drop_login, grant


def _url_of(url, user=None, password=None):
    """``url`` in full (its options too, such as PostgreSQL's driver=), as ``user``."""
    password = url.password if password is None else password
    return dataclasses.replace(url, user=user or url.user, password=password).secret_text()


@pytest.fixture
def records(fetch):
    """Records of two consumers, received 10 days, 3 days and a minute ago (set through SQL:
    the command reads the real clock)."""
    for consumer, message_id, age in [("billing", "a", "10 DAY"), ("billing", "b", "3 DAY"),
                                      ("billing", "c", "1 MINUTE"), ("shipping", "a", "10 DAY"),
                                      ("shipping", "d", "3 DAY")]:
        fetch(f"INSERT INTO inbox_message VALUES (%s, %s, {FAMILY.UTC_NOW}"
              f" - {FAMILY.interval(age)})", consumer, message_id)


def _left(fetch):
    return [(r["consumer"], r["message_id"]) for r in fetch(
        "SELECT consumer, message_id FROM inbox_message ORDER BY consumer, message_id")]


def test_purge_deletes_every_consumers_old_records(db_url, records, fetch, capsys):
    assert main(["inbox", "purge", "--older-than", "7d", "--database-url",
                 _url_of(db_url)]) == 0
    assert capsys.readouterr().out == "purged 2 inbox records older than 7d\n"
    assert _left(fetch) == [("billing", "b"), ("billing", "c"), ("shipping", "d")]


def test_purge_of_one_consumer_in_small_batches(db_url, records, fetch, capsys):
    assert main(["inbox", "purge", "--older-than", "2d", "--consumer", "billing",
                 "--batch-size", "1", "--database-url", _url_of(db_url)]) == 0
    assert capsys.readouterr().out == (
        "purged 2 inbox records of consumer billing older than 2d\n")
    assert _left(fetch) == [("billing", "c"), ("shipping", "a"), ("shipping", "d")]


def test_a_dry_run_counts_and_changes_nothing(db_url, records, fetch, capsys):
    before = _left(fetch)
    assert main(["inbox", "purge", "--older-than", "48h", "--dry-run", "--database-url",
                 _url_of(db_url)]) == 0
    assert capsys.readouterr().out == (
        "would purge 4 inbox records older than 48h (dry run: nothing changed)\n")
    assert main(["inbox", "purge", "--older-than=1w", "--consumer=shipping", "--dry-run",
                 "--database-url", _url_of(db_url)]) == 0
    assert capsys.readouterr().out == ("would purge 1 inbox record of consumer shipping older"
                                       " than 1w (dry run: nothing changed)\n")
    assert _left(fetch) == before


@pytest.mark.parametrize("args,words", [
    (["--older-than", "7"], "'7' needs a unit: 7s, 7m, 7h, 7d or 7w"),
    (["--older-than", "0"], "'0' must be a positive number with a unit"),
    (["--older-than=-3d"], "must be positive"),
    (["--older-than=infd"], "not a finite duration"),
    (["--older-than", "99999999d"], "longer than the limit, 36500 days"),
    (["--older-than", "7y"], "not a duration like 90s"),
    ([], "the following arguments are required: --older-than"),
    (["--older-than", "7d", "--consumer", " billing"], "must not start or end with white"),
    (["--older-than", "7d", "--consumer", "x" * 65], "the limit is 64"),
    (["--older-than", "7d", "--batch-size", "0"], "must be at least 1"),
])
def test_bad_flags_are_one_line_naming_the_command(args, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(["inbox", "purge", *args, "--database-url", f"{FAMILY.SCHEME}://root@127.0.0.1:1/x"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("outbox-lite inbox purge: error: ") and words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_inbox_without_an_action_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["inbox"])
    assert info.value.code == 2
    assert "required: ACTION" in capsys.readouterr().err


def test_server_errors_are_one_line_with_exit_1(db_url, capsys):
    assert main(["inbox", "purge", "--older-than", "7d", "--database-url",
                 f"{FAMILY.SCHEME}://root@127.0.0.1:1/outbox_x"]) == 1
    assert capsys.readouterr().err == (
        f"outbox-lite inbox purge: error: cannot reach the {FAMILY.SERVER_NAME} server at"
        f" 127.0.0.1:1; on {FAMILY.SCHEME}://127.0.0.1:1/outbox_x\n")
    database = db_url.database()
    assert schema.rollback(database) == "006_headers_and_expiry"
    assert schema.rollback(database) == "005_exact_aggregate_ids"
    assert schema.rollback(database) == "004_create_inbox_message"
    database.close()
    for extra in ([], ["--dry-run"]):
        assert main(["inbox", "purge", "--older-than", "7d", *extra, "--database-url",
                     _url_of(db_url)]) == 1
        assert capsys.readouterr().err == (
            f"outbox-lite inbox purge: error: table inbox_message is missing in {db_url.name}"
            f" (run: outbox-lite migrate --database-url {shlex.quote(str(db_url))})\n")


@pytest.fixture
def inbox_user(db_url, fetch):
    user, password = f"ol_inbox_{os.getpid()}", "inbox-Pass-123"
    create_login(user, password)
    yield user, password
    drop_login(user, db_url)


def test_the_documented_grants_are_enough_and_a_missing_one_is_named(
        db_url, fetch, inbox_user, capsys):
    user, password = inbox_user
    grant("SELECT, INSERT", db_url, "inbox_message", user)
    raw = _url_of(db_url, user, password)
    database = DatabaseUrl.parse(raw).database()
    with database.atomic():
        assert Inbox(database, "billing").accept("m") is True
    with database.atomic():
        assert Inbox(database, "billing").accept("m") is False
    database.close()
    fetch(f"UPDATE inbox_message SET received_at = received_at - {FAMILY.interval('30 DAY')}")
    assert main(["inbox", "purge", "--older-than", "7d", "--database-url", raw]) == 1
    err = capsys.readouterr().err
    # MySQL's refusal names the privilege; PostgreSQL's only the table.
    lacks = {"mysql": "the DELETE privilege", "postgresql": "a privilege"}[FAMILY.name]
    assert err == (f"outbox-lite inbox purge: error: user {user} lacks {lacks} on table"
                   " inbox_message: see 'Schema, migrations and grants' in the README;"
                   f" on {DatabaseUrl.parse(raw).location}\n"), err
    assert password not in err
    grant("DELETE", db_url, "inbox_message", user)
    assert main(["inbox", "purge", "--older-than", "7d", "--database-url", raw]) == 0
    assert capsys.readouterr().out == "purged 1 inbox record older than 7d\n"
    assert fetch("SELECT COUNT(*) AS n FROM inbox_message") == [{"n": 0}]
