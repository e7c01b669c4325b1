"""The command line: migrate end to end, and one-line errors with a non-zero exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl, DatabaseUrlError
from outbox_lite.cli import main

from _helpers import (FAMILY, TEST_URL, as_admin, create_login, drop_login, grant, rows_of,
                      url_as)

ROOT = Path(__file__).resolve().parent.parent


def _run(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "migrate.py"), *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def fresh_url():
    url = TEST_URL.with_name(f"{TEST_URL.name}_cli_{os.getpid()}")
    url.drop_database()
    yield url
    url.drop_database()


def test_migrate_creates_the_database_then_is_a_no_op_then_rolls_back(fresh_url, capsys):
    raw = _url_of(fresh_url)
    assert main(["migrate", "--database-url", raw]) == 0
    out = capsys.readouterr().out
    assert f"created database {fresh_url.name} ({fresh_url.location})" in out  # the server
    assert ("applied 001_create_outbox_event, 002_aggregate_index_published_at,"
            " 003_status_index_covers_aggregate") in out
    assert main(["migrate", "--database-url", raw]) == 0
    assert capsys.readouterr().out == f"{fresh_url.name} is up to date ({fresh_url.location})\n"
    assert "outbox_event" in _schemas_and_tables(fresh_url)[1]
    for name in ("006_headers_and_expiry", "005_exact_aggregate_ids", "004_create_inbox_message",
                 "003_status_index_covers_aggregate", "002_aggregate_index_published_at",
                 "001_create_outbox_event"):
        assert main(["migrate", "--rollback", "--database-url", raw]) == 0
        assert f"rolled back {name}" in capsys.readouterr().out
    assert "outbox_event" not in _schemas_and_tables(fresh_url)[1]


def test_the_script_reads_the_url_from_the_environment(fresh_url):
    raw = _url_of(fresh_url)
    result = _run(env={"OUTBOX_DATABASE_URL": raw})
    assert result.returncode == 0, result.stderr
    assert "applied 001_create_outbox_event" in result.stdout


@pytest.mark.parametrize("url,code,words", [
    ("oracle://u@h/db", 2, "unsupported URL scheme"),
    ("mysql://root@127.0.0.1/bad-name", 2, "database name"),
    ("mysql://root@127.0.0.1:notaport/db", 2, "bad database URL"),
    # The test server's family: nothing listens on port 1; no user nobody on the test server
    # (PostgreSQL's trusts every login from 127.0.0.1, and refuses a role that does not exist).
    (f"{FAMILY.SCHEME}://root@127.0.0.1:1/outbox_x", 1,
     f"cannot reach the {FAMILY.SERVER_NAME} server at 127.0.0.1:1"),
    (f"{FAMILY.SCHEME}://nobody:Sup3rSecret@{TEST_URL.host}:{TEST_URL.port}/outbox_x", 1,
     "access denied for user nobody"),
])
def test_bad_urls_and_servers_give_one_line_and_no_traceback(url, code, words):
    result = _run("--database-url", url)
    assert result.returncode == code
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert "Sup3rSecret" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_bad_scheme_is_one_short_line_naming_each_scheme_once():
    """Issue 37: it was ~400 characters, each family's whole form, saying the same twice."""
    result = _run("--database-url", "mysq://app:Sup3rSecret@db.example:3306/app")
    assert result.returncode == 2
    assert result.stderr == (
        "outbox-lite migrate: error: unsupported URL scheme 'mysq': expected mysql://,"
        " postgresql:// or postgres://, e.g. mysql://user:password@host:3306/database\n")


def test_help_explains_every_flag():
    result = _run("--help")
    assert result.returncode == 0
    for flag in ("--database-url", "--rollback"):
        assert flag in result.stdout


# ---------------------------------------------------------------------------
# URLs: no error shows any part of a password; query parameters
# ---------------------------------------------------------------------------

PASSWORDS = ["S3cr/3tPass", "S3cr#3tPass", "S3cr?3tPass", "S3cr@3tPass", "S3cr:3tPass",
             "S3cr%3tPass", "a/b#c?d@e:f%g", "p@ss/w0rd?ssl_ca=x#frag"]


def _fragments(password):
    """Every piece of the password a leaky message could show (4+ characters)."""
    pieces = re.split(r"[/#?@:%]", password) + [password]
    return [p for p in pieces if len(p) >= 4]


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("tail", ["127.0.0.1:1/outbox_x", "127.0.0.1:notaport/outbox_x",
                                  "127.0.0.1/bad-name", "127.0.0.1/outbox_x?nope=1",
                                  "127.0.0.1/outbox_x?connect_timeout=abc", "[zz/outbox_x"])
def test_no_url_error_shows_any_part_of_the_password(password, tail):
    result = _run("--database-url", f"mysql://app:{password}@{tail}")
    assert result.returncode in (1, 2)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for piece in _fragments(password):
        assert piece not in result.stderr + result.stdout, (piece, result.stderr)


@pytest.mark.parametrize("password", PASSWORDS)
def test_unencoded_and_percent_encoded_passwords_both_parse(password):
    from urllib.parse import quote
    encoded = DatabaseUrl.parse(f"mysql://app:{quote(password, safe='')}@db.example:3307/app")
    assert (encoded.user, encoded.password, encoded.host, encoded.port, encoded.name) == (
        "app", password, "db.example", 3307, "app")
    if "%" not in password:  # a bare % must be written %25; the rest may stay as they are
        assert DatabaseUrl.parse(f"mysql://app:{password}@db.example:3307/app") == encoded
    for text in (str(encoded), repr(encoded)):
        assert all(piece not in text for piece in _fragments(password)), text


def test_a_bare_percent_in_the_password_is_refused_without_showing_it():
    with pytest.raises(DatabaseUrlError, match="write % as %25") as info:
        DatabaseUrl.parse("mysql://app:S3cr%zzPass@h/db")
    assert "S3cr" not in str(info.value) and "zzPass" not in str(info.value)


def test_url_options_are_pymysql_connection_arguments():
    url = DatabaseUrl.parse(
        "mysql://app:pw@db:3306/app?ssl_ca=/etc/ssl/ca.pem&ssl_verify_cert=true"
        "&ssl_verify_identity=1&ssl_cert=/c.pem&ssl_key=/k.pem&ssl_key_password=K3yPass"
        "&charset=utf8mb4&connect_timeout=3&read_timeout=30&write_timeout=2.5")
    database = url.database()
    params = database.connect_params
    assert params["ssl_ca"] == "/etc/ssl/ca.pem" and params["ssl_verify_cert"] is True
    assert params["ssl_verify_identity"] is True and params["ssl_key_password"] == "K3yPass"
    assert params["connect_timeout"] == 3 and params["write_timeout"] == 2.5
    assert params["charset"] == "utf8mb4"
    assert "K3yPass" not in str(url) and "ssl_key_password=***" in str(url)
    assert url.with_name("other").options == url.options  # the contention suite keeps them


def test_identity_verification_verifies_the_certificate_too():
    # MySQL's VERIFY_IDENTITY includes VERIFY_CA; PyMySQL 1.2 implies it, 1.1 would raise
    # ValueError ("Cannot set verify_mode to CERT_NONE when check_hostname is enabled").
    url = DatabaseUrl.parse("mysql://app@db/app?ssl_ca=/ca.pem&ssl_verify_identity=true")
    params = url.database().connect_params
    assert params["ssl_verify_identity"] is True and params["ssl_verify_cert"] is True
    assert dict(url.options) == {"ssl_ca": "/ca.pem", "ssl_verify_identity": True}


@pytest.mark.parametrize("query,words", [
    ("ssl=true", "unknown URL parameter ssl; supported: ssl_ca"),
    ("sslmode=require", "unknown URL parameter sslmode"),
    ("charset=latin1", "charset must be utf8mb4"),
    ("connect_timeout=0", "connect_timeout must be a number of seconds"),
    ("ssl_verify_cert=maybe", "ssl_verify_cert must be true or false"),
    ("ssl_ca=a&ssl_ca=b", "ssl_ca is given twice"),
    ("ssl_key_password", "ssl_key_password needs a value"),
    ("ssl_ca=/c.pem&ssl_verify_identity=true&ssl_verify_cert=false",
     "cannot go with ssl_verify_cert=false"),
    ("ssl_verify_identity=true", "ssl_verify_identity=true needs ssl_ca"),
])
def test_unknown_or_bad_url_parameters_are_refused_in_one_line(query, words):
    result = _run("--database-url", f"mysql://root@127.0.0.1:1/outbox_x?{query}")
    assert result.returncode == 2
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_tls_option_reaches_the_driver(fresh_url):
    # The server here has no TLS: a URL that demands a verified certificate must fail to
    # connect (proof the option is used, not ignored), in one line.
    demand = {"mysql": "ssl_ca=/nonexistent/ca.pem&ssl_verify_cert=true",
              "postgresql": "sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem"}[FAMILY.name]
    text = _url_of(fresh_url)
    raw = text + ("&" if "?" in text else "?") + demand
    result = _run("--database-url", raw)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not fresh_url.exists()


# ---------------------------------------------------------------------------
# Usage errors, broken pipes
# ---------------------------------------------------------------------------

def _cli(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "outbox_lite.cli", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, **(env or {})}, **kwargs)


@pytest.mark.parametrize("args,words", [
    (["purge", "--older-than", "7"], "'7' needs a unit: 7s, 7m, 7h, 7d or 7w"),
    (["purge", "--older-than", "99999999d"], "longer than the limit, 36500 days"),
    (["purge", "--older-than=infd"], "not a finite duration"),
    (["purge", "--older-than=nanh"], "not a finite duration"),
    (["purge", "--older-than=-3d"], "must be positive"),
    (["purge", "--older-than", "0"], "'0' must be a positive number with a unit: s, m, h"),
    (["purge", "--older-than=-7"], "'-7' must be a positive number with a unit: s, m, h"),
    (["purge", "--older-than", "7y"], "not a duration like 90s, 15m, 12h, 7d or 2w"),
    (["stats", "--lock-timeout=1e12"], "longer than the limit"),
    (["stats", "--lock-timeout=inf"], "not a finite duration"),
    (["requeue", "--id", "abc"], "'abc' is not an event id"),
    (["dead-letters", "--requeue", "--id", "0"], "'0' is not an event id"),
    (["dead-letters", "--delete"], "--delete needs the dead letters named"),
    (["dead-letters", "--delete", "--all", "--error-code", "x"], "--all selects every"),
    (["dead-letters", "--id", "3", "--all"], "--all and --dry-run go with --requeue or"),
    (["dead-letters", "--dry-run"], "--all and --dry-run go with --requeue or --delete"),
    (["dead-letters", "--requeue", "--limit", "3"], "--limit and --json go with the listing"),
    (["dead-letters", "--delete", "--all", "--json"], "--limit and --json go with the list"),
    (["dead-letters", "--limit", "0"], "must be at least 1"),
    (["contention", "--workers", "x"], "'x' is not a whole number"),
])
def test_bad_flags_are_one_line_without_internal_names(args, words):
    result = _cli(*args, env={"OUTBOX_DATABASE_URL": "mysql://root@127.0.0.1:1/outbox_x"})
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    # One prefix for argparse's errors and the command's own: the command is named.
    assert result.stderr.startswith(f"outbox-lite {args[0]}: error: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "_positive" not in result.stderr and "_event_id" not in result.stderr
    assert "Traceback" not in result.stderr


def test_requeue_help_speaks_of_requeue_only():
    requeue = " ".join(_cli("requeue", "--help").stdout.split())
    assert "--all" in requeue and "delete" not in requeue.lower()
    dead_letters = " ".join(_cli("dead-letters", "--help").stdout.split())
    assert "required for --delete" in dead_letters


def test_help_lists_the_duration_units_and_the_url_options():
    purge = _cli("purge", "--help").stdout
    assert "s, m, h, d or w" in " ".join(purge.split())
    assert "bare number is refused" in " ".join(purge.split())
    stats = " ".join(_cli("stats", "--help").stdout.split())
    assert "ssl_ca" in stats and "%25" in stats


@pytest.mark.parametrize("command", ["stats", "purge", "relay", "dead-letters", "migrate"])
def test_help_is_wrapped_between_words_so_a_copied_url_works(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "72")  # a narrow terminal: the URL template is wider
    lines = _cli(command, "--help").stdout.splitlines()
    words = {word for line in lines for word in line.split()}
    assert "mysql://user[:password]@host[:port]/database[?option=value&...]" in words
    assert "Percent-encode" in words
    blocks = "\n".join(lines).split("\n\n")  # usage, description, options
    assert not blocks[1].startswith(("options:", "positional arguments:")), blocks[1]


def test_a_broken_pipe_ends_quietly(db_url):
    # The reader is gone before the command writes (as `stats | head -1` ends early).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "outbox_lite.cli", "stats",
                                 "--database-url", _url_of(db_url)],
                                stdout=write_end, stderr=subprocess.PIPE, cwd=ROOT)
    finally:
        os.close(write_end)
    stderr = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 141
    assert stderr == ""  # no traceback, no "Exception ignored", no error line


def test_stats_into_head_prints_one_line_and_nothing_else(db_url):
    result = subprocess.run(f"{sys.executable} -m outbox_lite.cli stats --database-url"
                            f" '{_url_of(db_url)}' | head -1", shell=True,
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.stdout.startswith("pending") and len(result.stdout.splitlines()) == 1
    assert result.stderr == ""


def _url_of(url):
    """``url`` in full (the password, and the options such as PostgreSQL's driver=)."""
    return url.secret_text()


def _fetch(url):
    """``fetch(sql, *params)`` on ``url``'s database as its administrator: rows as dicts."""
    def run(sql, *params):
        database = url.database()
        try:
            return rows_of(database.execute_sql(sql, params))
        finally:
            database.close()
    return run


# ---------------------------------------------------------------------------
# migrate: least privilege, and a rollback that changes nothing
# ---------------------------------------------------------------------------

def _schemas_and_tables(fresh_url):
    """(1 if ``fresh_url``'s database exists else 0, its tables)."""
    [(count,)] = as_admin(None, FAMILY.DATABASE_COUNT, fresh_url.name)
    if not count:
        return 0, []
    database = fresh_url.database()
    try:
        return 1, FAMILY.tables(database)
    finally:
        database.close()


def test_rollback_on_a_database_never_migrated_changes_nothing(fresh_url):
    raw = _url_of(fresh_url)
    result = _run("--rollback", "--database-url", raw)
    assert result.returncode == 0, result.stderr
    assert "nothing to roll back" in result.stdout
    assert _schemas_and_tables(fresh_url) == (0, [])  # no database created
    fresh_url.create_database()
    result = _run("--rollback", "--database-url", raw)
    assert result.returncode == 0 and "nothing to roll back" in result.stdout
    assert _schemas_and_tables(fresh_url) == (1, [])  # no history table created


def test_a_rollback_that_works_prints_no_warning(fresh_url):
    raw = _url_of(fresh_url)
    assert _run("--database-url", raw).returncode == 0
    result = _run("--rollback", "--database-url", raw)
    assert result.returncode == 0
    assert result.stdout.strip() == "rolled back 006_headers_and_expiry"
    assert result.stderr == ""


@pytest.fixture
def dml_user(fresh_url):
    user, password = f"ol_dml_{os.getpid()}", "dml-Pass-123"
    create_login(user, password)
    yield user, password
    drop_login(user, fresh_url)


def test_migrate_as_a_dml_only_user(fresh_url, dml_user):
    user, password = dml_user
    fetch = _fetch(fresh_url)
    assert _run("--database-url", _url_of(fresh_url)).returncode == 0  # the migration user
    grant("SELECT, INSERT, UPDATE, DELETE", fresh_url, "outbox_event", user)
    raw = url_as(fresh_url, user, password)
    # It cannot read the history: one line naming the missing privilege (MySQL's refusal
    # names it, "SELECT command denied"; PostgreSQL's only the table, and the hint says what
    # migrate needs), for applying and for rolling back alike, and nothing changed.
    lacks = {"mysql": "the SELECT privilege", "postgresql": "a privilege"}[FAMILY.name]
    for args in ([], ["--rollback"]):
        result = _run("--database-url", raw, *args)
        assert result.returncode == 1, (args, result.stdout)
        assert result.stdout == ""  # not "nothing to roll back", not "up to date"
        assert result.stderr.strip().splitlines() == [
            f"outbox-lite migrate: error: user {user} lacks {lacks} on table "
            "outbox_lite_migrations: migrate needs SELECT on outbox_lite_migrations to see what"
            " is applied, and CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE on the"
            " database to apply or roll back migrations; see 'Schema, migrations and grants' "
            f"in the README; on {fresh_url.location}"], args
        assert password not in result.stderr
        assert [row["name"] for row in fetch(
            "SELECT name FROM outbox_lite_migrations ORDER BY id")] == sorted(
                path.stem for path in schema.migrations_dir().glob("[0-9]*.py"))
    # It can read the history and nothing is pending: up to date, nothing written.
    grant("SELECT", fresh_url, "outbox_lite_migrations", user)
    result = _run("--database-url", raw)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{fresh_url.name} is up to date ({fresh_url.location})"
    assert result.stderr == ""
    migrated = FAMILY.indexes(fetch, "outbox_event"), FAMILY.columns(fetch, "outbox_event")
    assert "expires_at" in [column["name"] for column in migrated[1]]
    # It can read the history but not undo a migration: the DDL it lacks, in one line
    # naming the table (MySQL names the privilege, "ALTER command denied"; on PostgreSQL
    # only the table's owner may alter it, "must be owner of table outbox_event").
    result = _run("--database-url", raw, "--rollback")
    assert result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    lacks = {"mysql": f"user {user} lacks the ALTER privilege on table outbox_event: ",
             "postgresql": f"user {user} is not the owner of table outbox_event, which alone"
                           " may alter it: "}[FAMILY.name]
    assert result.stderr.startswith(f"outbox-lite migrate: error: {lacks}migrate needs"), (
        result.stderr)  # 006's ALTER TABLE
    assert password not in result.stderr
    assert (FAMILY.indexes(fetch, "outbox_event"), FAMILY.columns(fetch, "outbox_event")
            ) == migrated  # the indexes and columns as migrated: nothing rolled back
    # Something is pending, and its change is in place (a run stopped before its history
    # row): it only needs recording, which this user may not do. One line naming what is
    # missing, no traceback, nothing changed.
    fetch("DELETE FROM outbox_lite_migrations WHERE name = '003_status_index_covers_aggregate'")
    result = _run("--database-url", raw)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    lacks = {"mysql": "the INSERT privilege", "postgresql": "a privilege"}[FAMILY.name]
    assert f"user {user} lacks {lacks} on table outbox_lite_migrations" in result.stderr
    assert [row["name"] for row in fetch("SELECT name FROM outbox_lite_migrations"
                                         " ORDER BY name")] == [
        "001_create_outbox_event", "002_aggregate_index_published_at",
        "004_create_inbox_message", "005_exact_aggregate_ids", "006_headers_and_expiry"]


def test_rollback_by_a_user_without_rights_on_the_database_is_refused(fresh_url, dml_user):
    user, password = dml_user
    assert _run("--database-url", _url_of(fresh_url)).returncode == 0  # the migration user
    raw = url_as(fresh_url, user, password)
    missing = url_as(fresh_url.with_name(f"{fresh_url.name}_no"), user, password)
    if FAMILY.name == "mysql":
        # The server hides a database from a user with no privilege on it, whether it
        # exists or not (1044 for both): "does not exist, nothing to roll back" would be a
        # guess.
        for url, name in ((raw, fresh_url.name), (missing, f"{fresh_url.name}_no")):
            result = _run("--database-url", url, "--rollback")
            assert result.returncode == 1 and result.stdout == ""
            assert result.stderr.strip() == (f"outbox-lite migrate: error: access denied to "
                                              f"database {name} for user {user};"
                                              f" on {DatabaseUrl.parse(url).location}")
    else:
        # PostgreSQL lets every role connect to every database (CONNECT is PUBLIC's) and
        # shows every role which exist: the history it may not read is named, and a
        # database that does not exist has nothing to roll back.
        result = _run("--database-url", raw, "--rollback")
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.strip().startswith(
            f"outbox-lite migrate: error: user {user} lacks a privilege on table "
            "outbox_lite_migrations: migrate needs SELECT on "), result.stderr
        result = _run("--database-url", missing, "--rollback")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == (f"nothing to roll back: database {fresh_url.name}_no"
                                         " does not exist")
    assert _schemas_and_tables(fresh_url) == (1, ["inbox_message", "outbox_event",
                                                  "outbox_lite_migrations"])
    # Whoever may know is told: a database that does not exist has nothing to roll back.
    result = _run("--database-url", _url_of(fresh_url.with_name(f"{fresh_url.name}_no")),
                  "--rollback")
    assert result.returncode == 0
    assert result.stdout.strip() == (f"nothing to roll back: database {fresh_url.name}_no "
                                     "does not exist")
    assert _schemas_and_tables(fresh_url.with_name(f"{fresh_url.name}_no")) == (0, [])


def test_the_python_api_refuses_to_read_a_history_it_may_not_see(fresh_url, dml_user):
    import peewee as pw
    from outbox_lite import migrate as schema
    user, password = dml_user
    assert _run("--database-url", _url_of(fresh_url)).returncode == 0
    grant("SELECT, INSERT, UPDATE, DELETE", fresh_url, "outbox_event", user)
    database = DatabaseUrl.parse(url_as(fresh_url, user, password)).database()
    # What each server says: MySQL 1142 "SELECT command denied", PostgreSQL 42501
    # "permission denied for table outbox_lite_migrations".
    refusal = {"mysql": (pw.OperationalError, "SELECT command denied", 1142),
               "postgresql": (pw.ProgrammingError,
                              "permission denied for table outbox_lite_migrations", "42501")}
    kind, words, code = refusal[FAMILY.name]
    try:
        for call in (schema.applied, schema.rollback, schema.migrate):
            with pytest.raises(kind, match=words) as info:
                call(database)
            assert FAMILY.error_code(info.value) == code
    finally:
        database.close()
    assert _schemas_and_tables(fresh_url) == (1, ["inbox_message", "outbox_event",
                                                  "outbox_lite_migrations"])


@pytest.mark.parametrize("url", [
    "mysql://root@127.0.0.1:3306/x",
    "mysql://a%40b:p/a#s?s@db.example:3307/app?ssl_verify_cert=true&connect_timeout=2.5",
    "mysql://u:%25x%20y@[::1]:3306/d?ssl_ca=/etc/ssl/a%20b.pem",
])
def test_secret_text_reads_back_as_the_same_url_and_str_never_shows_the_password(url):
    parsed = DatabaseUrl.parse(url)
    assert DatabaseUrl.parse(parsed.secret_text()) == parsed
    if parsed.password:
        assert parsed.password not in str(parsed) and "***" in str(parsed)
