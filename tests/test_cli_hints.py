"""What a newcomer met (issue 25): the migrate hint names the database the user gave, the
Python API says a database or table is missing in a typed error, and a mistyped flag or
command gets the closest one suggested."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from outbox_lite import Inbox, OutboxRepository, SchemaError
from outbox_lite import inbox as inbox_module
from outbox_lite.cli import main
from outbox_lite.relay import Relay

from _helpers import (FAMILY, TEST_URL, as_admin, create_login, drop_login, login_name,
                      url_as)

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "Hint-Pass-2609"


def _cli(*args, env=None):
    environ = {k: v for k, v in os.environ.items() if k != "OUTBOX_DATABASE_URL"}
    return subprocess.run([sys.executable, "-m", "outbox_lite.cli", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**environ, **(env or {})})


def _tables(url):
    database = url.database()
    try:
        return FAMILY.tables(database)
    finally:
        database.close()


@pytest.fixture
def fresh_url():
    """A database name nothing has made yet (dropped afterwards, whatever made it)."""
    url = TEST_URL.with_name(f"{TEST_URL.name}_hint_{os.getpid()}")
    url.drop_database()
    yield url
    url.drop_database()


@pytest.fixture
def password_url(fresh_url):
    """``fresh_url`` for a user with a password and every right on that database only (on
    PostgreSQL, whose rights on a database come from owning it: CREATEDB, so that the
    database it creates is its own)."""
    user = f"ol_hint_{os.getpid()}"
    create_login(user, PASSWORD)
    if FAMILY.name == "mysql":
        as_admin(None, f"GRANT ALL ON {FAMILY.quote(fresh_url.name)}.* TO {login_name(user)}")
    else:
        as_admin(None, f"ALTER ROLE {login_name(user)} CREATEDB")
    yield type(fresh_url).parse(url_as(fresh_url, user, PASSWORD))
    drop_login(user, fresh_url)


# ---------------------------------------------------------------------------
# The migrate hint names the database given with --database-url
# ---------------------------------------------------------------------------

COMMANDS = [["stats"], ["dead-letters"], ["purge", "--older-than", "1d"],
            ["inbox", "purge", "--older-than", "1d"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_the_migrate_hint_names_the_database_given_and_migrates_it(password_url, command):
    """The bare `outbox-lite migrate` would migrate $OUTBOX_DATABASE_URL's database or the
    default one; the hint's command, password put back, migrates the one that is missing."""
    masked = shlex.quote(str(password_url))
    assert "***" in masked and PASSWORD not in masked
    name = " ".join(word for word in command[:2] if not word.startswith("-"))
    missing_database = _cli(*command, "--database-url", password_url.secret_text())
    assert missing_database.returncode == 1
    assert missing_database.stderr == (
        f"outbox-lite {name}: error: database {password_url.name} does not exist"
        f" (run: outbox-lite migrate --database-url {masked})\n")

    password_url.create_database()
    table = "inbox_message" if command[0] == "inbox" else "outbox_event"
    missing_table = _cli(*command, "--database-url", password_url.secret_text())
    assert missing_table.returncode == 1
    assert missing_table.stderr == (
        f"outbox-lite {name}: error: table {table} is missing in {password_url.name}"
        f" (run: outbox-lite migrate --database-url {masked})\n")
    assert PASSWORD not in missing_database.stderr + missing_table.stderr

    hint = missing_table.stderr.split("(run: ", 1)[1].rstrip(")\n")
    program, subcommand, *flags = shlex.split(hint.replace("***", PASSWORD))
    assert (program, subcommand) == ("outbox-lite", "migrate")
    migrated = _cli(subcommand, *flags)
    assert migrated.returncode == 0, migrated.stderr
    assert {"outbox_event", "inbox_message"} <= set(_tables(password_url))
    assert _cli(*command, "--database-url", password_url.secret_text()).returncode == 0


def test_the_hint_stays_bare_when_the_url_comes_from_the_environment(fresh_url):
    """`outbox-lite migrate` reads the same $OUTBOX_DATABASE_URL: the bare command is right."""
    result = _cli("stats", env={"OUTBOX_DATABASE_URL": fresh_url.secret_text()})
    assert result.returncode == 1
    assert result.stderr == (f"outbox-lite stats: error: database {fresh_url.name} does not"
                             f" exist (run: outbox-lite migrate); on {fresh_url.location}"
                             " (from OUTBOX_DATABASE_URL)\n")


# ---------------------------------------------------------------------------
# A forgotten URL (issue 37): the line names the server it went to, and says it was the default
# ---------------------------------------------------------------------------

DEFAULT = "(the default: no --database-url or OUTBOX_DATABASE_URL given)"


def test_without_a_url_the_line_names_the_default_server(fresh_url, monkeypatch, capsys):
    """The default URL made one that names the test server's missing database, so the line
    is exact on every server: where it went, that it was the default, no password."""
    from outbox_lite.cli import _args

    monkeypatch.delenv("OUTBOX_DATABASE_URL", raising=False)
    monkeypatch.setattr(_args, "DEFAULT_URL", fresh_url.secret_text())
    assert main(["stats"]) == 1
    err = capsys.readouterr().err
    assert err == (f"outbox-lite stats: error: database {fresh_url.name} does not exist"
                   f" (run: outbox-lite migrate); on {fresh_url.location} {DEFAULT}\n")
    assert f"{fresh_url.host}:{fresh_url.port}/{fresh_url.name}" in fresh_url.location
    assert "@" not in err and (not fresh_url.password or fresh_url.password not in err)
    assert not fresh_url.exists()


def _default_server_says() -> str:
    """What the real default URL, mysql://root@127.0.0.1:3306/outbox_lite, finds, asked
    directly: whatever the test server is (CI's PostgreSQL job has the default still MySQL
    on 3306, which may not run there), the command must say the same."""
    import pymysql

    try:
        conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", connect_timeout=5)
    except pymysql.err.OperationalError as exc:
        return ("cannot reach the MySQL server at 127.0.0.1:3306" if exc.args[0] == 2003
                else f"errno {exc.args[0]}")
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW DATABASES LIKE 'outbox\\_lite'")
            if cur.fetchone() is None:
                return "database outbox_lite does not exist (run: outbox-lite migrate)"
            cur.execute("SELECT 1 FROM information_schema.tables WHERE"
                        " table_schema = 'outbox_lite' AND table_name = 'outbox_event'")
            if cur.fetchone() is None:
                return "table outbox_event is missing in outbox_lite (run: outbox-lite migrate)"
            return ""  # migrated there: stats works, there is no error to read
    finally:
        conn.close()


def test_a_forgotten_url_says_the_command_went_to_the_default_server():
    """Issue 37: with OUTBOX_DATABASE_URL forgotten, `stats` said only "database outbox_lite
    does not exist", about MySQL on 3306, while the user's database was on PostgreSQL."""
    expected = _default_server_says()
    result = _cli("stats")  # no --database-url, OUTBOX_DATABASE_URL removed
    if not expected:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 1
    assert result.stderr == (f"outbox-lite stats: error: {expected};"
                             f" on mysql://127.0.0.1:3306/outbox_lite {DEFAULT}\n")


# ---------------------------------------------------------------------------
# The Python API before migrate: SchemaError, nothing made
# ---------------------------------------------------------------------------

class _Publisher:
    def publish(self, events):
        return {}

    def close(self):
        pass


CALLS = {
    "find_dispatchable": lambda db: OutboxRepository(db).find_dispatchable(),
    "mark_published": lambda db: OutboxRepository(db).mark_published(1, "w"),
    "stats": lambda db: OutboxRepository(db).stats(),
    "release_expired_locks": lambda db: OutboxRepository(db).release_expired_locks(60),
    "Relay.run_once": lambda db: Relay(OutboxRepository(db), _Publisher()).run_once(),
    "Inbox.purge": lambda db: Inbox(db, "billing").purge(60),
    "inbox.count_older_than": lambda db: inbox_module.count_older_than(db, 60),
}


@pytest.mark.parametrize("call", CALLS)
def test_the_python_api_before_migrate_raises_schema_error_and_makes_nothing(fresh_url, call):
    database = fresh_url.database()
    try:
        with pytest.raises(SchemaError) as missing_database:
            CALLS[call](database)
        assert str(missing_database.value) == (
            f"database {fresh_url.name} does not exist (run: outbox-lite migrate)")
        cause = missing_database.value.__cause__  # the driver's, chained: MySQL's 1049;
        # PostgreSQL's drivers give no SQLSTATE at connect, only libpq's text
        assert {"mysql": FAMILY.error_code(cause) == 1049,
                "postgresql": f'database "{fresh_url.name}" does not exist' in str(cause),
                }[FAMILY.name], repr(cause)
        assert not fresh_url.exists()

        fresh_url.create_database()
        database.close()
        table = "inbox_message" if "nbox" in call else "outbox_event"
        with pytest.raises(SchemaError) as missing_table:
            CALLS[call](database)
        assert str(missing_table.value) == (
            f"table {table} is missing in {fresh_url.name} (run: outbox-lite migrate)")
        assert _tables(fresh_url) == []
    finally:
        database.close()


def test_writing_before_migrate_raises_schema_error_and_writes_nothing(fresh_url):
    fresh_url.create_database()
    database = fresh_url.database()
    try:
        database.execute_sql("CREATE TABLE job (id INT PRIMARY KEY)")
        outbox, inbox = OutboxRepository(database), Inbox(database, "billing")
        with pytest.raises(SchemaError, match="table outbox_event is missing"):
            with database.atomic():
                database.execute_sql("INSERT INTO job (id) VALUES (1)")
                outbox.create_in_transaction(event_type="job.created", aggregate_type="job",
                                             aggregate_id="1", payload={})
        with pytest.raises(SchemaError, match="table inbox_message is missing"):
            with database.atomic():
                database.execute_sql("INSERT INTO job (id) VALUES (2)")
                inbox.accept("m-1")
        assert database.execute_sql("SELECT COUNT(*) FROM job").fetchone() == (0,)
        assert _tables(fresh_url) == ["job"]
    finally:
        database.close()


# ---------------------------------------------------------------------------
# A mistyped flag or command: the closest one suggested
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv,line", [
    (["relay", "--databse-url", "x"],
     "outbox-lite relay: error: unrecognized arguments: --databse-url x; did you mean"
     " --database-url? (see outbox-lite relay --help)"),
    (["relay", "--subject-prefx=orders"],
     "outbox-lite relay: error: unrecognized arguments: --subject-prefx=orders; did you mean"
     " --subject-prefix? (see outbox-lite relay --help)"),
    (["dead-letters", "--reqeue"],
     "outbox-lite dead-letters: error: unrecognized arguments: --reqeue; did you mean"
     " --requeue? (see outbox-lite dead-letters --help)"),
    (["inbox", "purge", "--older-than", "7d", "--consumr", "billing"],
     "outbox-lite inbox purge: error: unrecognized arguments: --consumr billing; did you mean"
     " --consumer? (see outbox-lite inbox purge --help)"),
    (["inbox", "purge", "--older-then", "7d"],
     "outbox-lite inbox purge: error: the following arguments are required: --older-than;"
     " did you mean --older-than where you typed --older-then? (see outbox-lite inbox purge"
     " --help)"),
    (["stat"],
     "outbox-lite: error: argument COMMAND: invalid choice: 'stat' (choose from 'migrate',"
     " 'contention', 'stats', 'dead-letters', 'requeue', 'purge', 'relay', 'inbox'); did you"
     " mean stats? (see outbox-lite --help)"),
    (["inbox", "purg"],
     "outbox-lite inbox: error: argument ACTION: invalid choice: 'purg' (choose from"
     " 'purge'); did you mean purge? (see outbox-lite inbox --help)"),
    (["contention", "--scenario", "fence"],
     "outbox-lite contention: error: argument --scenario: invalid choice: 'fence' (choose"
     " from 'batch', 'cas', 'crash', 'fencing', 'retry', 'dedupe', 'ordered', 'lease');"
     " did you mean fencing? (see outbox-lite contention --help)"),
    # Nothing close: no guess.
    (["stats", "--zzzzzz"], "outbox-lite stats: error: unrecognized arguments: --zzzzzz"
                            " (see outbox-lite stats --help)"),
    # An abbreviation argparse takes, and a negative number, are not what went wrong.
    (["stats", "--lock", "-5"], "outbox-lite stats: error: argument --lock-timeout: '-5' must"
                                " be positive (see outbox-lite stats --help)"),
    (["contention", "--scenario", "qqq"],
     "outbox-lite contention: error: argument --scenario: invalid choice: 'qqq' (choose"
     " from 'batch', 'cas', 'crash', 'fencing', 'retry', 'dedupe', 'ordered', 'lease')"
     " (see outbox-lite contention --help)"),
])
def test_a_mistyped_flag_or_command_gets_the_closest_one_suggested(argv, line, capsys):
    """...and nothing when nothing is close, or nothing was mistyped."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err == line + "\n"
