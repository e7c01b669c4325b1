"""TLS for the tests: a server that offers it, with the CA file that verifies it.

MySQL 8+ offers TLS from the start, with a CA and a server certificate it made when its data
directory was initialised (``scripts/mysql-server.sh`` keeps them in the chroot: the CA is
``$OUTBOX_MYSQL_ROOT`` + ``@@datadir`` + ``@@ssl_ca``). MariaDB 10.11 offers TLS only when given
certificates, and the shared one has none: then the tests start a MariaDB of their own on a
free port, with a CA and a certificate for 127.0.0.1 made here, and stop it by its pid.
PostgreSQL as the tests' servers run it offers no TLS either: a PostgreSQL of the test's own,
with such certificates and a password-checked superuser.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pymysql
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from outbox_lite._families.url import DatabaseUrl

from _redis import free_port

MYSQL_ROOT = Path(os.environ.get("OUTBOX_MYSQL_ROOT", "/var/tmp/outbox-lite-mysql"))


@dataclass(frozen=True)
class TLSServer:
    """A server that offers TLS: its root URL (no password), the CA file that verifies its
    certificate, and whether that certificate names 127.0.0.1 (identity verification)."""

    url: DatabaseUrl
    ca: Path
    names_host: bool


def names_127(certificate_pem: bytes) -> bool:
    """Whether a certificate's subjectAltName holds the IP address 127.0.0.1."""
    cert = x509.load_pem_x509_certificate(certificate_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)


def mysql_own(url: DatabaseUrl) -> TLSServer:
    """The MySQL under test, with the CA it generated in its data directory."""
    conn = url.server_connection()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@datadir, @@ssl_ca, @@ssl_cert")
            datadir, ca, cert = cur.fetchone()
    finally:
        conn.close()
    folder = MYSQL_ROOT / str(datadir).strip("/")
    ca_file, cert_file = folder / str(ca), folder / str(cert)
    assert ca_file.is_file(), (f"the CA of the MySQL under test is not at {ca_file}: set "
                               "OUTBOX_MYSQL_ROOT to the chroot of scripts/mysql-server.sh")
    return TLSServer(url, ca_file, names_127(cert_file.read_bytes()))


# ---------------------------------------------------------------------------
# Certificates, and a MariaDB of the test's own that offers TLS with them
# ---------------------------------------------------------------------------

def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signed for 127.0.0.1 (as an operator makes them):
    returns the CA file, the server's chain (certificate + CA, as MySQL sends it) and key."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key, key = _key(), _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "outbox_lite test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(hours=1))
          .not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
              .issuer_name(ca_name).public_key(key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(hours=1))
              .not_valid_after(now + dt.timedelta(days=2))
              .add_extension(x509.SubjectAlternativeName(
                  [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(True, False, True, False, False, False, False,
                                           False, False), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                             critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                  ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    ca_file, chain_file, key_file = folder / "ca.pem", folder / "server.pem", folder / "key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain_file.write_bytes(server.public_bytes(serialization.Encoding.PEM)
                           + ca.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(_pem(key))
    return ca_file, chain_file, key_file


class TLSMariaDB:
    """A mariadbd of the test's own on a free port, offering TLS with certificates made by
    :func:`make_certificates`; root has no password. Stopped by its pid, never the shared
    one."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.ca, self.chain, self.key = make_certificates(folder)

    @property
    def url(self) -> DatabaseUrl:
        return DatabaseUrl.parse(f"mysql://root@127.0.0.1:{self.port}/outbox_lite_tls")

    def start(self) -> TLSServer:
        data = self.folder / "data"
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}",
                        "--auth-root-authentication-method=normal", "--skip-test-db",
                        "--user=root"], check=True, capture_output=True, timeout=120)
        self.proc = subprocess.Popen(
            ["/usr/sbin/mariadbd", "--no-defaults", "--user=root", f"--datadir={data}",
             f"--port={self.port}", "--bind-address=127.0.0.1",
             f"--socket={self.folder / 'sock'}", f"--pid-file={self.folder / 'pid'}",
             "--skip-log-bin", "--innodb-buffer-pool-size=16M",
             f"--log-error={self.folder / 'error.log'}", f"--ssl-ca={self.ca}",
             f"--ssl-cert={self.chain}", f"--ssl-key={self.key}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.url.server_connection().close()
                break
            except pymysql.MySQLError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"mariadbd on port {self.port} did not start; see "
                                       f"{self.folder / 'error.log'}")
                time.sleep(0.05)
        return TLSServer(self.url, self.ca, names_127(self.chain.read_bytes()))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # this server only, by its pid
            self.proc.wait(timeout=60)
        self.proc = None
        shutil.rmtree(self.folder / "data", ignore_errors=True)


# ---------------------------------------------------------------------------
# A PostgreSQL of the test's own that offers TLS and checks passwords
# ---------------------------------------------------------------------------

class TLSPostgreSQL:
    """A PostgreSQL of the test's own (``tests/_servers.py``, the test server's major version)
    offering TLS with certificates made by :func:`make_certificates`, its TCP logins checked
    with scram-sha-256 (the shared PostgreSQL offers no TLS and trusts 127.0.0.1). Its
    superuser ``postgres`` has :attr:`PASSWORD`. Stopped by its pid, never the shared one."""

    PASSWORD = "Tls-Admin-Pass-9"

    def __init__(self) -> None:
        # The server runs as the user postgres when the tests run as root: the files must be
        # where it can read them (pytest's temporary folders are root's alone), and its key
        # its own, mode 0600, or it refuses to start.
        self.folder = Path(tempfile.mkdtemp(prefix="outbox-lite-pg-tls-"))
        self.folder.chmod(0o755)
        self.ca, self.chain, self.key = make_certificates(self.folder)
        self.key.chmod(0o600)
        if os.geteuid() == 0:
            os.chown(self.key, pwd.getpwnam("postgres").pw_uid, -1)
        self._stack = contextlib.ExitStack()

    def start(self) -> TLSServer:
        from _servers import own_postgresql_server
        url = self._stack.enter_context(own_postgresql_server(
            {"ssl": "on", "ssl_cert_file": self.chain, "ssl_key_file": self.key},
            password=self.PASSWORD, tls=True))
        return TLSServer(url, self.ca, names_127(self.chain.read_bytes()))

    def stop(self) -> None:
        self._stack.close()
        shutil.rmtree(self.folder, ignore_errors=True)
