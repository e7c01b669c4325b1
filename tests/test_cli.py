"""The command line: migrate end to end, and one-line errors with a non-zero exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from outbox_lite._db import DatabaseUrl, DatabaseUrlError
from outbox_lite.cli import main

from conftest import TEST_URL

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
    raw = f"mysql://{fresh_url.user}@{fresh_url.host}:{fresh_url.port}/{fresh_url.name}"
    assert fresh_url.password == "" or pytest.fail("this test builds a password-less URL")
    assert main(["migrate", "--database-url", raw]) == 0
    out = capsys.readouterr().out
    assert "created database" in out
    assert "applied 001_create_outbox_event, 002_aggregate_index_published_at" in out
    assert main(["migrate", "--database-url", raw]) == 0
    assert "up to date" in capsys.readouterr().out
    conn = fresh_url.server_connection()
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s"
                    " AND table_name = 'outbox_event'", (fresh_url.name,))
        assert cur.fetchone() == (1,)
        assert main(["migrate", "--rollback", "--database-url", raw]) == 0
        assert "rolled back 002_aggregate_index_published_at" in capsys.readouterr().out
        assert main(["migrate", "--rollback", "--database-url", raw]) == 0
        assert "rolled back 001_create_outbox_event" in capsys.readouterr().out
        cur.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s"
                    " AND table_name = 'outbox_event'", (fresh_url.name,))
        assert cur.fetchone() == (0,)
    conn.close()


def test_the_script_reads_the_url_from_the_environment(fresh_url):
    raw = f"mysql://{fresh_url.user}@{fresh_url.host}:{fresh_url.port}/{fresh_url.name}"
    result = _run(env={"OUTBOX_DATABASE_URL": raw})
    assert result.returncode == 0, result.stderr
    assert "applied 001_create_outbox_event" in result.stdout


@pytest.mark.parametrize("url,code,words", [
    ("postgres://u@h/db", 2, "unsupported URL scheme"),
    ("mysql://root@127.0.0.1/bad-name", 2, "database name"),
    ("mysql://root@127.0.0.1:notaport/db", 2, "bad database URL"),
    ("mysql://root@127.0.0.1:1/outbox_x", 1, "cannot reach the MySQL server at 127.0.0.1:1"),
    ("mysql://nobody:Sup3rSecret@127.0.0.1/outbox_x", 1, "access denied for user nobody"),
])
def test_bad_urls_and_servers_give_one_line_and_no_traceback(url, code, words):
    result = _run("--database-url", url)
    assert result.returncode == code
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert "Sup3rSecret" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


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


@pytest.mark.parametrize("query,words", [
    ("ssl=true", "unknown URL parameter ssl; supported: ssl_ca"),
    ("sslmode=require", "unknown URL parameter sslmode"),
    ("charset=latin1", "charset must be utf8mb4"),
    ("connect_timeout=0", "connect_timeout must be a number of seconds"),
    ("ssl_verify_cert=maybe", "ssl_verify_cert must be true or false"),
    ("ssl_ca=a&ssl_ca=b", "ssl_ca is given twice"),
    ("ssl_key_password", "ssl_key_password needs a value"),
])
def test_unknown_or_bad_url_parameters_are_refused_in_one_line(query, words):
    result = _run("--database-url", f"mysql://root@127.0.0.1:1/outbox_x?{query}")
    assert result.returncode == 2
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_tls_option_reaches_the_driver(fresh_url):
    # The server here has no TLS: a URL that demands a verified certificate must fail to
    # connect (proof the option is used, not ignored), in one line.
    raw = (f"mysql://{fresh_url.user}@{fresh_url.host}:{fresh_url.port}/{fresh_url.name}"
           "?ssl_ca=/nonexistent/ca.pem&ssl_verify_cert=true")
    result = _run("--database-url", raw)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not fresh_url.exists()

