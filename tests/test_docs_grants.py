"""docs/guides/grants.md, run as written against the test server with real logins: the users
created, the migrator's grant, ``outbox-lite migrate`` as the migrator (which creates the
database), then the service's table grants; the service then does its work and is refused
what it must not do. Only names differ: the test's own users and database, its server's port."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import peewee
import pymysql
import pytest

from outbox_lite import Inbox, OutboxRepository
from outbox_lite._db import DatabaseUrl

from _docs import blocks
from _helpers import TEST_URL

PAGE = "docs/guides/grants.md"


def _steps() -> tuple[str, str, str]:
    create, migrate, grant = [b.code for b in blocks(PAGE)]
    return create, migrate, grant


def _ours(text: str, name: str, suffix: str) -> str:
    text = text.replace("'outbox_migrator'@", f"'outbox_migrator_{suffix}'@")
    text = text.replace("'app'@", f"'app_{suffix}'@")
    text = re.sub(r"\bapp\.", f"`{name}`.", text)
    return text


def _statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.startswith("--")]
    return [s.strip() for s in " ".join(lines).split(";") if s.strip()]


def _root(sql: str) -> None:
    conn = TEST_URL.server_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def _errno(sql: str) -> int:
    try:
        _root(sql)
    except pymysql.MySQLError as exc:
        return exc.args[0]
    return 0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "outbox_lite.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OUTBOX_DATABASE_URL": ""})


def test_the_grants_page_runs_as_written():
    suffix = f"{os.getpid()}"
    name = f"{TEST_URL.name}_grants_page_{suffix}"
    create, migrate, grant = _steps()
    users = [f"'outbox_migrator_{suffix}'@'%'", f"'app_{suffix}'@'%'"]
    target = TEST_URL.with_name(name)
    target.drop_database()
    for user in users:
        _root(f"DROP USER IF EXISTS {user}")
    try:
        # What the page says of the wrong orders: a GRANT creates no user, and a table's
        # grant needs the table (both servers, their own error numbers).
        assert _errno(f"GRANT SELECT ON `{name}`.* TO 'nobody_{suffix}'@'%'") in (1133, 1410)
        for statement in _statements(_ours(create, name, suffix)):
            _root(statement)
        assert _errno(_statements(_ours(grant, name, suffix))[0]) == 1146

        # Step 2, the command as printed, with our user, port and database.
        [line] = [l for l in migrate.splitlines() if l.startswith("outbox-lite migrate")]
        url = re.search(r"'(mysql://[^']+)'", line).group(1)
        url = (url.replace("outbox_migrator:", f"outbox_migrator_{suffix}:")
               .replace("127.0.0.1:3306/app", f"{TEST_URL.host}:{TEST_URL.port}/{name}"))
        result = _cli("migrate", "--database-url", url)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == f"created database {name}"
        assert result.stdout.splitlines()[1].startswith("applied 001_create_outbox_event")
        assert "migrator-secret" not in result.stdout + result.stderr

        for statement in _statements(_ours(grant, name, suffix)):
            _root(statement)

        # The service, logged in as app: it writes, claims, records, accepts and purges.
        app_url = f"mysql://app_{suffix}:app-secret@{TEST_URL.host}:{TEST_URL.port}/{name}"
        db = DatabaseUrl.parse(app_url).database()
        try:
            outbox = OutboxRepository(db)
            with db.atomic():
                outbox.create_in_transaction(event_type="order.placed", aggregate_type="order",
                                             aggregate_id="1", payload={"order_id": 1})
            with db.atomic():
                [event] = outbox.claim_batch("relay-1")
            assert outbox.mark_published(event.id, "relay-1")
            inbox = Inbox(db, "billing")
            with db.atomic():
                assert inbox.accept("outbox-order.placed%3A1")
            assert inbox.purge(0.000001) >= 0
            with pytest.raises(peewee.DatabaseError):
                db.execute_sql("CREATE TABLE sneaky (id INT)")
        finally:
            db.close()
        stats = _cli("stats", "--database-url", app_url)
        assert stats.returncode == 0, stats.stderr
        refused = _cli("migrate", "--database-url", app_url)
        assert refused.returncode == 1
        assert f"user app_{suffix} lacks the SELECT privilege on table outbox_lite_migrations" \
            in refused.stderr
        assert "app-secret" not in refused.stderr
    finally:
        for user in users:
            _root(f"DROP USER IF EXISTS {user}")
        target.drop_database()
