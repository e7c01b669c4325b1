"""A password account logs in through every door (the commands, the Python API, the relay's
reconnect), with TLS off and on, with the server's login cache cold and warm; and a connection
whose TLS fails says why, in one line, without a password.

The account is what a service gets from ``CREATE USER … IDENTIFIED BY`` with the server's
default plugin: caching_sha2_password on MySQL, mysql_native_password on MariaDB
(``outbox_lite._server``). On MySQL a login without TLS is answered from the server's cache
only when a full authentication filled it; ``FLUSH PRIVILEGES`` empties it (cold), and then the
password must go RSA-encrypted: PyMySQL needs its ``rsa`` extra (cryptography) for that.
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
from outbox_lite._db import DatabaseUrl
from outbox_lite._server import Server, server_of
from outbox_lite.relay import Relay

from _tls import TLSMariaDB, TLSServer, mysql_own
from _helpers import TEST_URL, QuietMySQLDatabase, seed

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
    conn = url.server_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def tested() -> Server:
    return server_of(_query(TEST_URL))


@pytest.fixture(scope="module")
def tls_server(tested: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    """A server that offers TLS, of the kind under test: the MySQL under test itself (its CA
    from its data directory), or, since the MariaDB under test has no certificates, a MariaDB
    of this module's own with a CA and a certificate for 127.0.0.1."""
    if tested.offers_tls(_query(TEST_URL)):
        yield mysql_own(TEST_URL)
        return
    server = TLSMariaDB(tmp_path_factory.mktemp("tls-mariadb"))
    try:
        yield server.start()
    finally:
        server.stop()


def test_each_server_offers_tls_as_it_is_set_up(tested: Server, tls_server: TLSServer):
    # MySQL 9.7 as scripts/mysql-server.sh initialises it: TLS with its own self-signed CA,
    # and a certificate that names no host. MariaDB 10.11 as .ci/run starts it: no TLS.
    assert tested.offers_tls(_query(TEST_URL)) is (not tested.is_mariadb)
    assert server_of(_query(tls_server.url)).kind == tested.kind
    assert server_of(_query(tls_server.url)).offers_tls(_query(tls_server.url))
    assert tls_server.names_host is tested.is_mariadb  # ours names 127.0.0.1; MySQL's none


# ---------------------------------------------------------------------------
# The account, the cache, the doors
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Target:
    """A migrated database on a server, the account's URL to it, and its root URL."""

    root: DatabaseUrl
    url: DatabaseUrl
    server: Server
    tls: bool

    def flush(self) -> None:
        """Empty the server's login cache (caching_sha2_password's, on MySQL)."""
        _root(self.root, "FLUSH PRIVILEGES")

    def cached(self) -> bool:
        """Whether the server answers the account's login without TLS from its cache: a
        PyMySQL without cryptography logs in without TLS only then (it cannot send the
        password RSA-encrypted). MariaDB's native plugin needs neither: always True."""
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
    return f"ssl_ca={server.ca}&ssl_verify_cert=true" if tls else "ssl_disabled=true"


@pytest.fixture(params=[False, True], ids=["tls-off", "tls-on"])
def target(request: pytest.FixtureRequest, tls_server: TLSServer) -> Iterator[Target]:
    tls: bool = request.param
    root = (tls_server.url if tls else TEST_URL).with_name(
        f"{TEST_URL.name}_login_{os.getpid()}")
    root.drop_database()
    root.create_database()
    database = root.database()
    schema.migrate(database)
    database.close()
    user = f"ol_login_{os.getpid()}"
    _root(root, f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")
    _root(root, f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY %s", PASSWORD)
    _root(root, f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{root.name}`.*"
          f" TO '{user}'@'127.0.0.1'")
    server = server_of(_query(root))
    account = dataclasses.replace(root, user=user, password=PASSWORD)
    url = DatabaseUrl.parse(f"{account.secret_text()}?{_options(tls, tls_server)}")
    try:
        # The account has the server's default plugin, as a service's account does.
        assert _root(root, "SELECT plugin FROM mysql.user WHERE user = %s", user) == [
            (server.password_plugin,)]
        yield Target(root, url, server, tls)
    finally:
        _root(root, f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")
        root.drop_database()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "outbox_lite.cli", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def _session_tls(database: Any) -> str:
    return str(database.execute_sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'").fetchone()[1])


def door_stats(target: Target, n: int) -> None:
    result = _cli("stats", "--database-url", target.url.secret_text())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["pending", "1"]  # the one seeded


def door_migrate(target: Target, n: int) -> None:
    result = _cli("migrate", "--database-url", target.url.secret_text())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{target.url.name} is up to date"


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
    _root(target.root, f"INSERT INTO `{target.root.name}`.outbox_event (event_type,"
          " aggregate_type, aggregate_id, dedupe_key, payload, status, attempt_count,"
          " available_at, created_at, updated_at) VALUES ('e', 'a', '0', 'login-0', '{}',"
          " 'pending', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")
    target.flush()
    # Cold: MySQL's cache no longer knows the account; MariaDB has no such cache.
    assert target.cached() is not target.server.caches_logins
    enter(target, 1)
    assert target.cached()  # the door's login was a full one: the cache is warm now
    enter(target, 2)  # warm
    keys = [row[0] for row in _root(target.root, f"SELECT dedupe_key FROM "
                                    f"`{target.root.name}`.outbox_event ORDER BY id")]
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
            connection_id = self.database.execute_sql("SELECT CONNECTION_ID()").fetchone()[0]
            self.target.flush()
            self.cold_at_kill = not self.target.cached()
            _root(self.target.root, f"KILL CONNECTION {int(connection_id)}")
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
    assert broker.cold_at_kill is target.server.caches_logins
    assert relay.stats.reconnects >= 1 and target.cached()
    assert sorted(set(broker.published)) == ids
    assert _root(target.root, f"SELECT status, COUNT(*) FROM `{target.root.name}`.outbox_event"
                              " GROUP BY status") == [("published", 30)]


# ---------------------------------------------------------------------------
# TLS: what PyMySQL does by default, and failures said in one line
# ---------------------------------------------------------------------------

def test_pymysql_without_tls_options_uses_tls_unverified_from_1_2(tls_server: TLSServer):
    # PyMySQL 1.2 connects with TLS when the server offers it, verifying nothing (the test's
    # CA is not given, and still it connects); 1.1 uses no TLS unless an ssl option asks.
    database = tls_server.url.with_name("mysql").database()
    try:
        cipher = _session_tls(database)
    finally:
        database.close()
    assert bool(cipher) is (pymysql.VERSION >= (1, 2))


def _stats_line(url: str) -> str:
    result = _cli("stats", "--database-url", url)
    assert result.returncode == 1 and result.stdout == "", result
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert PASSWORD not in result.stderr
    return result.stderr.strip()


def _secret_url(server: TLSServer, query: str, host: str = "127.0.0.1") -> str:
    url = dataclasses.replace(server.url, host=host, password=PASSWORD, name="mysql")
    return url.secret_text() + "?" + query


def test_an_untrusted_certificate_is_named_as_the_cause(tls_server: TLSServer):
    port = tls_server.url.port
    # The password is wrong on purpose: TLS fails first, and the line must not show it.
    assert _stats_line(_secret_url(tls_server, "ssl_verify_cert=true")) == (
        f"outbox-lite stats: error: TLS with the MySQL server at 127.0.0.1:{port} failed: "
        "certificate verify failed: self-signed certificate in certificate chain (ssl_ca "
        "must name the CA file that signed the server's certificate)")
    # With the right CA the same URL gets past TLS to the login (refused: wrong password).
    assert _stats_line(_secret_url(tls_server, f"ssl_ca={tls_server.ca}&ssl_verify_cert=true")
                       ) == "outbox-lite stats: error: access denied for user root (check " \
                            "the user and password)"


def test_identity_verification_needs_a_certificate_for_the_host(tls_server: TLSServer):
    port = tls_server.url.port
    query = f"ssl_ca={tls_server.ca}&ssl_verify_identity=true"
    mismatch = (f"outbox-lite stats: error: TLS with the MySQL server at {{host}}:{port} "
                f"failed: certificate verify failed: {{what}} mismatch, certificate is not "
                f"valid for '{{host}}' (ssl_verify_identity needs a certificate issued for the "
                f"URL's host)")
    # By name: neither certificate names localhost.
    assert _stats_line(_secret_url(tls_server, query, host="localhost")) == mismatch.format(
        host="localhost", what="Hostname")
    # By address: MySQL's own certificate names no host at all, so identity verification
    # cannot pass against it; the test's MariaDB certificate names 127.0.0.1 and passes.
    url = dataclasses.replace(tls_server.url, name="mysql").secret_text() + "?" + query
    if tls_server.names_host:
        result = _cli("stats", "--database-url", url)
        assert result.returncode == 1  # past TLS and the login: no outbox table in `mysql`
        assert "table outbox_event is missing in mysql" in result.stderr, result.stderr
    else:
        assert _stats_line(url) == mismatch.format(host="127.0.0.1", what="IP address")


def test_a_server_without_tls_is_named_when_the_url_asks_for_it(tested: Server,
                                                                tls_server: TLSServer):
    url = (TEST_URL.with_name("mysql").secret_text()
           + f"?ssl_ca={tls_server.ca}&ssl_verify_cert=true")
    result = _cli("stats", "--database-url", url)
    if tested.offers_tls(_query(TEST_URL)):  # MySQL: the TLS server is the one under test
        assert "table outbox_event is missing in mysql" in result.stderr, result.stderr
    else:  # MariaDB as .ci/run starts it
        assert result.returncode == 1 and result.stderr.strip() == (
            f"outbox-lite stats: error: TLS with the MySQL server at {TEST_URL.host}:"
            f"{TEST_URL.port} failed: the server offers no TLS, and the URL asks for it "
            "(ssl_ca, ssl_cert, ssl_key, ssl_verify_cert or ssl_verify_identity)")


def test_a_missing_ca_file_is_named_by_its_option(tmp_path: Path):
    url = TEST_URL.secret_text() + f"?ssl_ca={tmp_path / 'nowhere.pem'}"
    assert _stats_line(url) == ("outbox-lite stats: error: URL parameter ssl_ca names a file "
                                "that does not exist or cannot be read")


def test_the_python_api_says_why_tls_failed(tls_server: TLSServer):
    url = DatabaseUrl.parse(_secret_url(tls_server, "ssl_verify_cert=true"))
    database = url.database()
    try:
        with pytest.raises(ConnectionLostError) as info:
            OutboxRepository(database).stats()
    finally:
        database.close()
    assert str(info.value).startswith(
        "cannot open a connection to the server: certificate verify failed: self-signed "
        "certificate in certificate chain")
    assert PASSWORD not in str(info.value)
