"""A password account logs in through every door (the commands, the Python API, the relay's
reconnect), with TLS off and on, with the server's login cache cold and warm; and a connection
whose TLS fails says why, in one line, without a password.

The account is what a service gets from ``CREATE USER … IDENTIFIED BY`` with the server's
default plugin: caching_sha2_password on MySQL, mysql_native_password on MariaDB
(``outbox_lite._families.mysql_server``). On MySQL a login without TLS is answered from the server's cache
only when a full authentication filled it; ``FLUSH PRIVILEGES`` empties it (cold), and then the
password must go RSA-encrypted: PyMySQL needs its ``rsa`` extra (cryptography) for that.
On PostgreSQL it is ``CREATE ROLE … LOGIN PASSWORD``, stored as scram-sha-256, on a server of
the test's own that checks passwords and offers TLS (the shared one trusts 127.0.0.1 and offers
none); PostgreSQL keeps no login cache: every login is a full one, cold and warm alike.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pymysql
import pymysql._auth
import pytest

from outbox_lite import ConnectionLostError, OutboxRepository
from outbox_lite import migrate as schema
from outbox_lite._families.mysql_server import server_of
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.relay import Relay

from _helpers import FAMILY, TEST_URL, QuietMySQLDatabase, rows_of, seed
from _tls import TLSMariaDB, TLSPostgreSQL, TLSServer, make_certificates, mysql_own

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "Login-Pass-42!"  # never to appear in any output


def _query(url: DatabaseUrl) -> Any:
    def query(sql: str) -> Any:
        conn = url.server_connection()
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall()
        finally:
            conn.close()
    return query


def _root(url: DatabaseUrl, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """``sql`` as the administrator on the server (PostgreSQL: its database ``postgres``)."""
    conn = url.server_connection()
    try:
        cur = conn.cursor()
        cur.execute(sql, params or None)
        return [] if cur.description is None else [tuple(row) for row in cur.fetchall()]
    finally:
        conn.close()


def _in(url: DatabaseUrl, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """``sql`` as the administrator on ``url``'s database."""
    database = url.database()
    try:
        return [tuple(row.values()) for row in rows_of(database.execute_sql(sql, params))]
    finally:
        database.close()


def _with(url: DatabaseUrl, query: str) -> str:
    """``url``'s full text (password, options) with the options of ``query`` added."""
    text = url.secret_text()
    return text + ("&" if "?" in text else "?") + query


def _offers_tls(url: DatabaseUrl) -> bool:
    if FAMILY.name == "mysql":
        return bool(server_of(_query(url)).offers_tls(_query(url)))
    return _query(url)("SHOW ssl")[0][0] == "on"


#: The server's maintenance database, which every server has.
MAINTENANCE = {"mysql": "mysql", "postgresql": "postgres"}[FAMILY.name]


@pytest.fixture(scope="module")
def tested() -> Any:
    return FAMILY.server(_query(TEST_URL))


@pytest.fixture(scope="module")
def tls_server(tested: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    """A server that offers TLS, of the kind under test: the MySQL under test itself (its CA
    from its data directory), or, since the MariaDB under test has no certificates, a MariaDB
    of this module's own with a CA and a certificate for 127.0.0.1; on PostgreSQL one of this
    module's own with such certificates, whose logins check passwords."""
    if _offers_tls(TEST_URL):
        yield mysql_own(TEST_URL)
        return
    server: Any = (TLSPostgreSQL() if FAMILY.name == "postgresql"
                   else TLSMariaDB(tmp_path_factory.mktemp("tls-mariadb")))
    try:
        yield server.start()
    finally:
        server.stop()


def test_each_server_offers_tls_as_it_is_set_up(tested: Any, tls_server: TLSServer):
    # MySQL 9.7 as scripts/mysql-server.sh initialises it: TLS with its own self-signed CA,
    # and a certificate that names no host. MariaDB 10.11 as .ci/run starts it: no TLS.
    # PostgreSQL as the host and scripts/postgres-server.sh run it: no TLS (ssl = off).
    mysql = FAMILY.name == "mysql" and not tested.is_mariadb
    assert _offers_tls(TEST_URL) is mysql
    assert FAMILY.server(_query(tls_server.url)).kind == tested.kind
    assert _offers_tls(tls_server.url)
    assert tls_server.names_host is not mysql  # ours name 127.0.0.1; MySQL's none


# ---------------------------------------------------------------------------
# The account, the cache, the doors
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Target:
    """A migrated database on a server, the account's URL to it, and its root URL."""

    root: DatabaseUrl
    url: DatabaseUrl
    caches_logins: bool
    tls: bool

    def flush(self) -> None:
        """Empty the server's login cache (caching_sha2_password's, on MySQL; PostgreSQL
        has none)."""
        if FAMILY.name == "mysql":
            _root(self.root, "FLUSH PRIVILEGES")

    def cached(self) -> bool:
        """Whether the server answers the account's login without TLS from its cache: a
        PyMySQL without cryptography logs in without TLS only then (it cannot send the
        password RSA-encrypted). MariaDB's native plugin needs neither, and PostgreSQL's
        scram-sha-256 no cache: always True."""
        if FAMILY.name != "mysql":
            return True
        saved = pymysql._auth._have_cryptography
        pymysql._auth._have_cryptography = False
        try:
            pymysql.connect(host=self.url.host, port=self.url.port, user=self.url.user,
                            password=self.url.password, ssl_disabled=True).close()
            return True
        except RuntimeError as exc:
            assert "'cryptography' package is required" in str(exc)
            return False
        finally:
            pymysql._auth._have_cryptography = saved


def _options(tls: bool, server: TLSServer) -> str:
    """The URL options of a connection with TLS verified (``tls``) or without TLS."""
    if FAMILY.name == "mysql":
        return f"ssl_ca={server.ca}&ssl_verify_cert=true" if tls else "ssl_disabled=true"
    return f"sslmode=verify-full&sslrootcert={server.ca}" if tls else "sslmode=disable"


def _create_account(root: DatabaseUrl, user: str) -> None:
    """The account, with DML on every table of ``root``'s database."""
    if FAMILY.name == "mysql":
        _root(root, f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")
        _root(root, f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY %s", PASSWORD)
        _root(root, f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{root.name}`.*"
              f" TO '{user}'@'127.0.0.1'")
        return
    [(create,)] = _root(root, "SELECT format('CREATE ROLE %%I LOGIN PASSWORD %%L', %s::text,"
                              " %s::text)", user, PASSWORD)
    _root(root, create)
    _in(root, f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {user}")


def _drop_account(root: DatabaseUrl, user: str) -> None:
    if FAMILY.name == "mysql":
        _root(root, f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")
    else:  # its grants go with the database, dropped first
        _root(root, f"DROP ROLE IF EXISTS {user}")


def _stored_password_kind(root: DatabaseUrl, user: str) -> str:
    """How the server keeps the account's password: its plugin (MySQL, MariaDB), or
    ``SCRAM-SHA-256`` (PostgreSQL's password_encryption, 14+ default)."""
    if FAMILY.name == "mysql":
        return str(_root(root, "SELECT plugin FROM mysql.user WHERE user = %s", user)[0][0])
    return str(_root(root, "SELECT split_part(rolpassword, '$', 1) FROM pg_authid"
                           " WHERE rolname = %s", user)[0][0])


@pytest.fixture(params=[False, True], ids=["tls-off", "tls-on"])
def target(request: pytest.FixtureRequest, tested: Any, tls_server: TLSServer,
           ) -> Iterator[Target]:
    tls: bool = request.param
    # MySQL and MariaDB: the test server checks passwords; without TLS it is the one. The
    # shared PostgreSQL trusts every login: both go to this module's own.
    server = tls_server.url if tls or FAMILY.name == "postgresql" else TEST_URL
    root = server.with_name(f"{TEST_URL.name}_login_{os.getpid()}")
    root.drop_database()
    root.create_database()
    database = root.database()
    schema.migrate(database)
    database.close()
    user = f"ol_login_{os.getpid()}"
    _create_account(root, user)
    account = dataclasses.replace(root, user=user, password=PASSWORD)
    url = DatabaseUrl.parse(_with(account, _options(tls, tls_server)))
    caches = FAMILY.name == "mysql" and server_of(_query(root)).caches_logins
    try:
        # The account has the server's default plugin, as a service's account does.
        expected = (server_of(_query(root)).password_plugin if FAMILY.name == "mysql"
                    else "SCRAM-SHA-256")
        assert _stored_password_kind(root, user) == expected
        yield Target(root, url, caches, tls)
    finally:
        root.drop_database()
        _drop_account(root, user)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "outbox_lite.cli", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def _session_tls(database: Any) -> str:
    """The session's TLS cipher, "" without TLS."""
    if FAMILY.name == "mysql":
        return str(database.execute_sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'").fetchone()[1])
    row = database.execute_sql("SELECT cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                               ).fetchone()
    return str(row[0] or "") if row else ""


def door_stats(target: Target, n: int) -> None:
    result = _cli("stats", "--database-url", target.url.secret_text())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["pending", "1"]  # the one seeded


def door_migrate(target: Target, n: int) -> None:
    result = _cli("migrate", "--database-url", target.url.secret_text())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{target.url.name} is up to date ({target.url.location})"


def _write_one(database: Any, target: Target, n: int) -> None:
    repo = OutboxRepository(database)
    with database.atomic():
        repo.create_in_transaction(event_type="login.checked", aggregate_type="login",
                                   aggregate_id=str(n), payload={"n": n},
                                   dedupe_key=f"login-{n}")
    assert bool(_session_tls(database)) is target.tls
    database.close()


def door_repository(target: Target, n: int) -> None:
    """A service's own Peewee database, with the password, as the README's snippets make it."""
    url = target.url
    if FAMILY.name == "postgresql":
        tls = {k: v for k, v in url.options if k in ("sslmode", "sslrootcert")}
        _write_one(FAMILY.database_class()(url.name, host=url.host, port=url.port,
                                           user=url.user, password=url.password, **tls),
                   target, n)
        return
    tls = ({"ssl_ca": dict(url.options)["ssl_ca"], "ssl_verify_cert": True} if target.tls
           else {"ssl_disabled": True})
    _write_one(QuietMySQLDatabase(url.name, host=url.host, port=url.port, user=url.user,
                                  password=url.password, charset="utf8mb4", **tls), target, n)


def door_database_url(target: Target, n: int) -> None:
    _write_one(target.url.database(), target, n)


DOORS = {"stats": door_stats, "migrate": door_migrate, "repository": door_repository,
         "database-url": door_database_url}


@pytest.mark.parametrize("door", list(DOORS))
def test_a_password_account_logs_in_cold_and_warm(target: Target, door: str):
    enter = DOORS[door]
    now = FAMILY.UTC_NOW
    _in(target.root, "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id,"
        " dedupe_key, payload, status, attempt_count, available_at, created_at, updated_at)"
        f" VALUES ('e', 'a', '0', 'login-0', '{{}}', 'pending', 0, {now}, {now}, {now})")
    target.flush()
    # Cold: MySQL's cache no longer knows the account; MariaDB and PostgreSQL have no such
    # cache.
    assert target.cached() is not target.caches_logins
    enter(target, 1)
    assert target.cached()  # the door's login was a full one: the cache is warm now
    enter(target, 2)  # warm
    keys = [row[0] for row in _in(target.root, "SELECT dedupe_key FROM outbox_event"
                                              " ORDER BY id")]
    writes = door in ("repository", "database-url")
    assert keys == (["login-0", "login-1", "login-2"] if writes else ["login-0"])


# ---------------------------------------------------------------------------
# The relay: a connection killed while the cache is cold is reconnected, not the end
# ---------------------------------------------------------------------------

class KillingBroker:
    """Publishes into a list; during the first batch it empties the login cache and kills
    the relay's connection, so the relay's reconnect finds the cache cold."""

    def __init__(self, target: Target, database: Any) -> None:
        self.target, self.database = target, database
        self.published: list[int] = []
        self.cold_at_kill: bool | None = None

    def publish(self, events: Any) -> dict[int, BaseException]:
        if not self.published:
            session = FAMILY.session_id(self.database)
            self.target.flush()
            self.cold_at_kill = not self.target.cached()
            _root(self.target.root, FAMILY.kill_sql(session))
        self.published.extend(e.id for e in events)
        return {}

    def close(self) -> None:
        pass


def test_a_relay_reconnects_with_a_cold_cache_and_finishes(target: Target):
    database = target.url.database()
    repo = OutboxRepository(database)
    ids = seed(repo, 30)
    broker = KillingBroker(target, database)
    relay = Relay(repo, broker, worker_id="relay-login", batch_size=10, progress_every=0,
                  reconnect_pause=0.01)
    stop = threading.Event()
    watchdog = threading.Timer(60, stop.set)
    watchdog.start()
    try:
        relay.run(stop, until_empty=True)
    finally:
        watchdog.cancel()
        database.close()
    assert not stop.is_set(), "the relay did not drain the outbox within 60 s"
    assert broker.cold_at_kill is target.caches_logins
    assert relay.stats.reconnects >= 1 and target.cached()
    assert sorted(set(broker.published)) == ids
    assert _in(target.root, "SELECT status, COUNT(*) FROM outbox_event GROUP BY status") == [
        ("published", 30)]


# ---------------------------------------------------------------------------
# TLS: what PyMySQL does by default, and failures said in one line
# ---------------------------------------------------------------------------

def test_a_url_without_tls_options_uses_the_drivers_default(tls_server: TLSServer):
    # PyMySQL 1.2 connects with TLS when the server offers it, verifying nothing (the test's
    # CA is not given, and still it connects); 1.1 uses no TLS unless an ssl option asks.
    # libpq's default is sslmode=prefer: TLS when offered, unverified.
    database = tls_server.url.with_name(MAINTENANCE).database()
    try:
        cipher = _session_tls(database)
    finally:
        database.close()
    assert bool(cipher) is (pymysql.VERSION >= (1, 2) if FAMILY.name == "mysql" else True)


def _stats_line(url: str) -> str:
    result = _cli("stats", "--database-url", url)
    assert result.returncode == 1 and result.stdout == "", result
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert PASSWORD not in result.stderr
    line, where = result.stderr.strip().rsplit("; on ", 1)  # the server it went to (issue 37)
    assert where == DatabaseUrl.parse(url).location, result.stderr
    return line


def _secret_url(server: TLSServer, query: str, host: str = "127.0.0.1") -> str:
    url = dataclasses.replace(server.url, host=host, password=PASSWORD, name=MAINTENANCE)
    return _with(url, query)


@pytest.fixture(scope="module")
def stranger_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA that signed nothing the servers have."""
    return make_certificates(tmp_path_factory.mktemp("stranger"))[0]


#: A URL's ask to verify the server's certificate, with no CA that signed it: MySQL's
#: ssl_verify_cert with the system's CAs; PostgreSQL's verify-ca with a CA of another.
def _unverifiable(stranger_ca: Path) -> str:
    return ("ssl_verify_cert=true" if FAMILY.name == "mysql"
            else f"sslmode=verify-ca&sslrootcert={stranger_ca}")


#: What each family says of a certificate its CA file did not sign.
UNTRUSTED = {"mysql": "certificate verify failed: self-signed certificate in certificate chain"
                      " (ssl_ca must name the CA file that signed the server's certificate)",
             "postgresql": "certificate verify failed (sslrootcert must name the CA file that"
                           " signed the server's certificate)"}[FAMILY.name]


def test_an_untrusted_certificate_is_named_as_the_cause(tls_server: TLSServer,
                                                        stranger_ca: Path):
    port = tls_server.url.port
    # The password is wrong on purpose: TLS fails first, and the line must not show it.
    assert _stats_line(_secret_url(tls_server, _unverifiable(stranger_ca))) == (
        f"outbox-lite stats: error: TLS with the {FAMILY.SERVER_NAME} server at 127.0.0.1:{port}"
        f" failed: {UNTRUSTED}")
    # With the right CA the same URL gets past TLS to the login (refused: wrong password).
    trusted = (f"ssl_ca={tls_server.ca}&ssl_verify_cert=true" if FAMILY.name == "mysql"
               else f"sslmode=verify-ca&sslrootcert={tls_server.ca}")
    assert _stats_line(_secret_url(tls_server, trusted)) == (
        f"outbox-lite stats: error: access denied for user {tls_server.url.user} (check the"
        " user and password)")


def test_identity_verification_needs_a_certificate_for_the_host(tls_server: TLSServer):
    port = tls_server.url.port
    if FAMILY.name == "mysql":
        query = f"ssl_ca={tls_server.ca}&ssl_verify_identity=true"
        mismatch = (f"outbox-lite stats: error: TLS with the MySQL server at {{host}}:{port} "
                    f"failed: certificate verify failed: {{what}} mismatch, certificate is not "
                    f"valid for '{{host}}' (ssl_verify_identity needs a certificate issued for "
                    f"the URL's host)")
        by_name = mismatch.format(host="localhost", what="Hostname")
    else:
        query = f"sslrootcert={tls_server.ca}&sslmode=verify-full"
        by_name = (f"outbox-lite stats: error: TLS with the PostgreSQL server at localhost:{port}"
                   ' failed: server certificate for "127.0.0.1" (and 1 other name) does not'
                   ' match host name "localhost" (sslmode=verify-full needs a certificate'
                   " issued for the URL's host)")
    # By name: no certificate names localhost.
    assert _stats_line(_secret_url(tls_server, query, host="localhost")) == by_name
    # By address: MySQL's own certificate names no host at all, so identity verification
    # cannot pass against it; the tests' own certificates name 127.0.0.1 and pass.
    url = _with(dataclasses.replace(tls_server.url, name=MAINTENANCE), query)
    if tls_server.names_host:
        result = _cli("stats", "--database-url", url)
        assert result.returncode == 1  # past TLS and the login: no outbox table there
        assert f"table outbox_event is missing in {MAINTENANCE}" in result.stderr, result.stderr
    else:
        assert _stats_line(url) == mismatch.format(host="127.0.0.1", what="IP address")


def test_a_server_without_tls_is_named_when_the_url_asks_for_it(tls_server: TLSServer):
    asks = (f"ssl_ca={tls_server.ca}&ssl_verify_cert=true" if FAMILY.name == "mysql"
            else f"sslmode=verify-ca&sslrootcert={tls_server.ca}")
    url = _with(TEST_URL.with_name(MAINTENANCE), asks)
    result = _cli("stats", "--database-url", url)
    if _offers_tls(TEST_URL):  # MySQL: the TLS server is the one under test
        assert "table outbox_event is missing in mysql" in result.stderr, result.stderr
        return
    # MariaDB as .ci/run starts it, PostgreSQL as the tests' servers run it
    options = {"mysql": "ssl_ca, ssl_cert, ssl_key, ssl_verify_cert or ssl_verify_identity",
               "postgresql": "sslmode=require or stricter"}[FAMILY.name]
    assert result.returncode == 1 and result.stderr.strip() == (
        f"outbox-lite stats: error: TLS with the {FAMILY.SERVER_NAME} server at {TEST_URL.host}:"
        f"{TEST_URL.port} failed: the server offers no TLS, and the URL asks for it ({options});"
        f" on {DatabaseUrl.parse(url).location}")


def test_a_missing_ca_file_is_named_by_its_option(tls_server: TLSServer, tmp_path: Path):
    nowhere = tmp_path / "nowhere.pem"
    if FAMILY.name == "mysql":
        # PyMySQL's own error (FileNotFoundError) names neither the option nor the file.
        assert _stats_line(_with(TEST_URL, f"ssl_ca={nowhere}")) == (
            "outbox-lite stats: error: URL parameter ssl_ca names a file that does not exist or"
            " cannot be read")
        return
    # libpq names the file, when it verifies the certificate.
    assert _stats_line(_secret_url(tls_server, f"sslmode=verify-ca&sslrootcert={nowhere}")) == (
        f"outbox-lite stats: error: TLS with the PostgreSQL server at 127.0.0.1:"
        f"{tls_server.url.port} failed: root certificate file \"{nowhere}\" does not exist"
        " (sslrootcert must name the CA file that signed the server's certificate)")


def test_the_python_api_says_why_tls_failed(tls_server: TLSServer, stranger_ca: Path):
    url = DatabaseUrl.parse(_secret_url(tls_server, _unverifiable(stranger_ca)))
    database = url.database()
    try:
        with pytest.raises(ConnectionLostError) as info:
            OutboxRepository(database).stats()
    finally:
        database.close()
    assert str(info.value).startswith(
        f"cannot open a connection to the server: {UNTRUSTED.split(' (')[0]}")
    assert PASSWORD not in str(info.value)
