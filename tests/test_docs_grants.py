"""docs/guides/grants.md, run as written against the test server with real logins: the users
created, the migrator's rights, ``outbox-lite migrate`` as the migrator, then the service's
table grants; the service then does its work and is refused what it must not do. MySQL and
MariaDB run the page's MySQL steps (``CREATE USER``, and ``migrate`` creates the database),
PostgreSQL its PostgreSQL steps (``CREATE ROLE``, a database the migrator owns). Only names
differ: the test's own users and database, its server's port."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import peewee
import pytest

from outbox_lite import Inbox, OutboxRepository
from outbox_lite._families.url import DatabaseUrl

from _docs import block
from _helpers import FAMILY, TEST_URL, as_admin, create_login, drop_login

PAGE = "docs/guides/grants.md"

#: Each family's three blocks of the page, by what only that block holds.
STEPS = {
    "mysql": ("CREATE USER", "'mysql://", "ON app.outbox_event TO 'app'@'%'"),
    "postgresql": ("CREATE ROLE", "'postgresql://", "ON outbox_event TO app;"),
}
#: What each server answers to the page's wrong orders: a grant to a user never created, a
#: table's grant before migrate made the table.
NO_USER = {"mysql": (1133, 1410), "postgresql": ("42704",)}  # MariaDB, MySQL 8+; undefined_object
NO_TABLE = {"mysql": 1146, "postgresql": "42P01"}
#: What a refusal names: MySQL the privilege, PostgreSQL only the table.
LACKS = {"mysql": "the SELECT privilege", "postgresql": "a privilege"}


def _steps() -> tuple[str, str, str]:
    create, migrate, grant = (block(PAGE, words) for words in STEPS[FAMILY.name])
    return create, migrate, grant


def _ours(text: str, name: str, suffix: str) -> str:
    """The page's statements with the test's names: its users and its database."""
    if FAMILY.name == "mysql":
        text = text.replace("'outbox_migrator'@", f"'outbox_migrator_{suffix}'@")
        text = text.replace("'app'@", f"'app_{suffix}'@")
        return re.sub(r"\bapp\.", f"`{name}`.", text)
    text = re.sub(r"\boutbox_migrator\b", f"outbox_migrator_{suffix}", text)
    text = re.sub(r"\bDATABASE app\b", f'DATABASE "{name}"', text)
    return re.sub(r"\b(ROLE|TO) app\b", rf"\1 app_{suffix}", text)


def _statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.startswith("--")]
    return [s.strip() for s in " ".join(lines).split(";") if s.strip()]


def _refused(url: DatabaseUrl | None, sql: str) -> object:
    """The server's error code for ``sql`` run as the administrator (None: it ran)."""
    try:
        as_admin(url, sql)
    except Exception as exc:  # noqa: BLE001 - either driver's error: its code is the answer
        return FAMILY.error_code(exc)
    return None


def _drop(target: DatabaseUrl, migrator: str, app: str, nobody: str) -> None:
    """Drop the test's users: on MySQL the page's are user@'%', the test's own nobody the
    helpers' user@127.0.0.1."""
    if FAMILY.name == "mysql":
        for user in (migrator, app):
            as_admin(None, f"DROP USER IF EXISTS '{user}'@'%'")
        drop_login(nobody)
        return
    for user in (migrator, app, nobody):
        drop_login(user, target)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "outbox_lite.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OUTBOX_DATABASE_URL": ""})


def _as(user: str, password: str, name: str) -> str:
    """The test server's URL for ``user`` on database ``name`` (its options, such as
    PostgreSQL's driver=, kept)."""
    from dataclasses import replace
    return replace(TEST_URL.with_name(name), user=user, password=password).secret_text()


def test_the_grants_page_runs_as_written():
    suffix = f"{os.getpid()}"
    name = f"{TEST_URL.name}_grants_page_{suffix}"
    create, migrate, grant = _steps()
    migrator, app, nobody = (f"outbox_migrator_{suffix}", f"app_{suffix}",
                             f"nobody_{suffix}")
    target = TEST_URL.with_name(name)
    target.drop_database()
    _drop(target, migrator, app, nobody)
    try:
        # What the page says of the wrong orders: a GRANT creates no user, and a table's
        # grant needs the table (each server, its own error codes).
        to_nobody = {"mysql": f"GRANT SELECT ON `{name}`.* TO '{nobody}'@'%'",
                     "postgresql": f"GRANT CONNECT ON DATABASE postgres TO {nobody}"}
        assert _refused(None, to_nobody[FAMILY.name]) in NO_USER[FAMILY.name]
        for statement in _statements(_ours(create, name, suffix)):
            as_admin(None, statement)
        service_grants = _statements(_ours(grant, name, suffix))
        # (on PostgreSQL the database exists now: the grant is made on it)
        assert _refused(None if FAMILY.name == "mysql" else target, service_grants[0]) == (
            NO_TABLE[FAMILY.name])

        # Step 2, the command as printed, with our user, port and database.
        [line] = [l for l in migrate.splitlines() if l.startswith("outbox-lite migrate")]
        printed = DatabaseUrl.parse(re.search(r"'([a-z]+://[^']+)'", line).group(1))
        assert (printed.user, printed.password) == ("outbox_migrator", "migrator-secret")
        result = _cli("migrate", "--database-url", _as(migrator, printed.password, name))
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        if FAMILY.name == "mysql":  # migrate creates it; on PostgreSQL the administrator did
            assert lines.pop(0).startswith(f"created database {name} (")
        assert lines[0].startswith("applied 001_create_outbox_event")
        assert "migrator-secret" not in result.stdout + result.stderr

        # Step 3: MySQL's as the administrator, PostgreSQL's as the migrator, who owns the
        # tables, on a connection to the database.
        if FAMILY.name == "mysql":
            for statement in service_grants:
                as_admin(None, statement)
        else:
            owner = DatabaseUrl.parse(_as(migrator, "migrator-secret", name)).database()
            try:
                for statement in service_grants:
                    owner.execute_sql(statement)
            finally:
                owner.close()

        # The service, logged in as app: it writes, claims, records, accepts and purges.
        app_url = _as(app, "app-secret", name)
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
        assert refused.stderr.startswith(
            f"outbox-lite migrate: error: user {app} lacks {LACKS[FAMILY.name]} on table"
            " outbox_lite_migrations: "), refused.stderr
        assert "app-secret" not in refused.stderr

        # A user with no privilege on the database (on PostgreSQL: no CONNECT, which the
        # page's REVOKE keeps from PUBLIC) is refused at the door, in one line.
        create_login(nobody, "nobody-secret")
        door_url = _as(nobody, "nobody-secret", name)
        door = _cli("stats", "--database-url", door_url)
        assert door.returncode == 1 and door.stdout == ""
        assert door.stderr == (f"outbox-lite stats: error: access denied to database {name}"
                               f" for user {nobody}; on {DatabaseUrl.parse(door_url).location}"
                               "\n")
    finally:
        _drop(target, migrator, app, nobody)
        target.drop_database()
