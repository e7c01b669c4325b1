"""A TCP forwarder between the tests and a database server that can lose a statement's answer.

Armed with :meth:`Proxy.drop_after`, it forwards the client's matching query to the server,
reads and throws away the server's answer, and closes both sockets: the client sees a lost
connection (MySQL 2013; PostgreSQL "server closed the connection unexpectedly") for a statement
the server finished, as when a connection dies at the moment of a COMMIT. Every other byte
passes as it is; each client connection gets one to the server.

Armed with :meth:`Proxy.refuse`, it makes the server refuse a COMMIT as a cluster does (Galera's
certification failure, Group Replication's rollback, a serialization failure): the client's
``COMMIT`` goes to the server as ``ROLLBACK``, and the server's answer to it is replaced by the
error given, in the protocol's own error message (MySQL's ERR packet with its number and
SQLSTATE; PostgreSQL's ErrorResponse then ReadyForQuery, idle). So the server's state is what a
refused COMMIT leaves (the whole transaction rolled back, the session idle) and the driver
raises exactly what it raises for the real refusal: nothing in the client is told apart.

It reads the client's messages in the server's wire protocol (``protocol``): MySQL's packets
(a COM_QUERY's SQL), or PostgreSQL's v3 messages (a simple Query's SQL, or an extended-protocol
Parse's: psycopg 3 sends its statements that way). So the client must not use TLS: on MySQL
PyMySQL's ``ssl_disabled``; on PostgreSQL the proxy answers the client's SSLRequest (and
GSSENCRequest) with "N" itself, so ``sslmode=prefer`` (the drivers' default) goes on in plain
text. On PostgreSQL the lost answer is everything up to the server's ReadyForQuery, so the
statement has run to its end (an extended-protocol statement runs at its Sync) before the
connection closes.
"""

from __future__ import annotations

import socket
import threading
from typing import Callable

_COM_QUERY = 3
_PG_TLS_REQUESTS = (80877103, 80877104)  # SSLRequest, GSSENCRequest


class Proxy:
    """Listens on 127.0.0.1 (``port``) and forwards each connection to ``host:port``, whose
    server speaks ``protocol`` (``"mysql"`` or ``"postgresql"``)."""

    def __init__(self, host: str, port: int, protocol: str = "mysql") -> None:
        if protocol not in ("mysql", "postgresql"):
            raise ValueError(f"unknown protocol {protocol!r}")
        self.protocol = protocol
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._match: Callable[[str], bool] | None = None
        self._skip = 0
        #: The statements whose answers were thrown away, in order.
        self.dropped: list[str] = []
        self._refusal: tuple[str, str, str] | None = None
        self._refused_commits: set[int] = set()
        self._commits = 0
        #: The errors returned for the COMMITs refused, in order: (code, SQLSTATE, message).
        self.refused: list[tuple[str, str, str]] = []
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def drop_after(self, match: Callable[[str], bool], *, skip: int = 0) -> None:
        """Lose the answer of the next query whose SQL ``match`` accepts, after ``skip`` such
        queries have passed."""
        with self._lock:
            self._match, self._skip = match, skip

    def refuse(self, error: tuple[int | str, str, str], commits: tuple[int, ...] = (0,)
               ) -> None:
        """Refuse the COMMITs (of any connection) numbered ``commits`` from now on (0: the
        next one) with ``error``: (MySQL's error number or PostgreSQL's SQLSTATE, the
        SQLSTATE, the message); the server rolls each back."""
        with self._lock:
            code, state, message = error
            self._refusal, self._refused_commits = (str(code), state, message), set(commits)
            self._commits = 0

    def _refused(self, sql: str) -> tuple[str, str, str] | None:
        """The error for a COMMIT ``sql`` to refuse now, or None."""
        if sql.strip().rstrip(";").strip().upper() != "COMMIT":
            return None
        with self._lock:
            number, self._commits = self._commits, self._commits + 1
            if self._refusal is None or number not in self._refused_commits:
                return None
            self.refused.append(self._refusal)
            return self._refusal

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            doomed = threading.Event()  # set before a doomed query goes to the server
            refusal: list[tuple[str, str, str]] = []  # the error for the COMMIT in flight
            postgresql = self.protocol == "postgresql"
            threading.Thread(target=self._pg_upstream if postgresql else self._upstream,
                             args=(client, server, doomed, refusal), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, doomed, refusal),
                             daemon=True).start()

    def _doomed(self, payload: bytes) -> bool:
        if not payload or payload[0] != _COM_QUERY:
            return False
        return self._doomed_sql(payload[1:].decode("utf-8", "replace"))

    def _doomed_sql(self, sql: str) -> bool:
        with self._lock:
            if self._match is None or not self._match(sql):
                return False
            if self._skip:
                self._skip -= 1
                return False
            self._match = None
            self.dropped.append(sql)
            return True

    def _upstream(self, client: socket.socket, server: socket.socket,
                  doomed: threading.Event, refusal: list[tuple[str, str, str]]) -> None:
        """Client to server, a whole packet at a time (so a query can be recognised)."""
        try:
            while True:
                header = _read(client, 4)
                payload = _read(client, int.from_bytes(header[:3], "little"))
                error = (self._refused(payload[1:].decode("utf-8", "replace"))
                         if payload[:1] == bytes([_COM_QUERY]) else None)
                if error is not None:
                    refusal.append(error)
                    payload = bytes([_COM_QUERY]) + b"ROLLBACK"
                    header = len(payload).to_bytes(3, "little") + header[3:]
                if self._doomed(payload):
                    doomed.set()
                server.sendall(header + payload)
        except OSError:
            pass
        finally:
            _close(server)
            _close(client)

    def _pg_upstream(self, client: socket.socket, server: socket.socket,
                     doomed: threading.Event, refusal: list[tuple[str, str, str]]) -> None:
        """Client to server in PostgreSQL's protocol: the startup message (after answering a
        TLS request "N"), then one typed message at a time."""
        try:
            while True:  # the startup phase: length, then a code, then the rest
                header = _read(client, 8)
                length, code = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")
                body = _read(client, length - 8)
                if code in _PG_TLS_REQUESTS:
                    client.sendall(b"N")  # no TLS: the client goes on in plain text
                    continue
                server.sendall(header + body)
                break
            while True:
                header = _read(client, 5)
                body = _read(client, int.from_bytes(header[1:], "big") - 4)
                error = (self._refused(body.split(b"\0", 1)[0].decode("utf-8", "replace"))
                         if header[:1] == b"Q" else None)
                if error is not None:
                    refusal.append(error)
                    body = b"ROLLBACK\0"
                    header = b"Q" + (len(body) + 4).to_bytes(4, "big")
                if self._doomed_sql_of(header[:1], body):
                    doomed.set()
                server.sendall(header + body)
        except OSError:
            pass
        finally:
            _close(server)
            _close(client)

    def _doomed_sql_of(self, kind: bytes, body: bytes) -> bool:
        if kind == b"Q":  # Query: the SQL, NUL-terminated
            sql = body.split(b"\0", 1)[0]
        elif kind == b"P":  # Parse: the statement's name, then its SQL, NUL-terminated
            sql = body.split(b"\0", 2)[1]
        else:
            return False
        return self._doomed_sql(sql.decode("utf-8", "replace"))

    def _downstream(self, server: socket.socket, client: socket.socket,
                    doomed: threading.Event, refusal: list[tuple[str, str, str]]) -> None:
        """Server to client, until the answer to a doomed query: that one is read and lost
        (on PostgreSQL up to its ReadyForQuery, when the statement has run). The answer to
        the ROLLBACK sent for a refused COMMIT is read whole and replaced by the error."""
        lost = b""
        answer = b""
        try:
            while data := server.recv(65536):
                if refusal:
                    answer += data
                    if not self._answered(answer):
                        continue
                    client.sendall(self._error_reply(refusal.pop(0), answer))
                    answer = b""
                    continue
                if doomed.is_set():
                    if self.protocol == "mysql":
                        break  # the server finished the statement; its answer goes nowhere
                    lost += data
                    if _ready_for_query(lost):
                        break
                    continue
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)


    def _answered(self, answer: bytes) -> bool:
        """Whether ``answer`` holds the server's whole answer to one statement."""
        if self.protocol == "postgresql":
            return _ready_for_query(answer)
        return len(answer) >= 4 and len(answer) >= 4 + int.from_bytes(answer[:3], "little")

    def _error_reply(self, error: tuple[str, str, str], answer: bytes) -> bytes:
        """The protocol's error message for ``error``, in place of the server's ``answer``."""
        code, state, message = error
        if self.protocol == "postgresql":
            fields = b"".join(kind + value.encode() + b"\0" for kind, value in (
                (b"S", "ERROR"), (b"V", "ERROR"), (b"C", state), (b"M", message))) + b"\0"
            return (b"E" + (len(fields) + 4).to_bytes(4, "big") + fields
                    + b"Z" + (5).to_bytes(4, "big") + b"I")
        payload = (b"\xff" + int(code).to_bytes(2, "little") + b"#" + state.encode()
                   + message.encode())
        return len(payload).to_bytes(3, "little") + answer[3:4] + payload


def _ready_for_query(data: bytes) -> bool:
    """Whether PostgreSQL messages ``data`` (from a message's start) hold a ReadyForQuery."""
    at = 0
    while at + 5 <= len(data):
        kind, length = data[at:at + 1], int.from_bytes(data[at + 1:at + 5], "big")
        if at + 1 + length > len(data):
            return False
        if kind == b"Z":
            return True
        at += 1 + length
    return False


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
