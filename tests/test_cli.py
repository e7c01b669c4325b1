"""The command line: migrate end to end, and one-line errors with a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
