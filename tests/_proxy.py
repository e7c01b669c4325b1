"""A TCP forwarder between the tests and a MySQL server that can lose a statement's answer.

Armed with :meth:`Proxy.drop_after`, it forwards the client's matching query to the server,
reads and throws away the server's answer, and closes both sockets: the client sees a lost
connection (2013) for a statement the server finished, as when a connection dies at the moment
of a COMMIT. Every other byte passes as it is; each client connection gets one to the server.
It reads the client's packets, so the client must not use TLS (PyMySQL's ``ssl_disabled``).
"""

from __future__ import annotations

import socket
import threading
from typing import Callable

_COM_QUERY = 3


class Proxy:
    """Listens on 127.0.0.1 (``port``) and forwards each connection to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._match: Callable[[str], bool] | None = None
        self._skip = 0
        #: The statements whose answers were thrown away, in order.
        self.dropped: list[str] = []
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def drop_after(self, match: Callable[[str], bool], *, skip: int = 0) -> None:
        """Lose the answer of the next query whose SQL ``match`` accepts, after ``skip`` such
        queries have passed."""
        with self._lock:
            self._match, self._skip = match, skip

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
            threading.Thread(target=self._upstream, args=(client, server, doomed),
                             daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, doomed),
                             daemon=True).start()

    def _doomed(self, payload: bytes) -> bool:
        if not payload or payload[0] != _COM_QUERY:
            return False
        sql = payload[1:].decode("utf-8", "replace")
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
                  doomed: threading.Event) -> None:
        """Client to server, a whole packet at a time (so a query can be recognised)."""
        try:
            while True:
                header = _read(client, 4)
                payload = _read(client, int.from_bytes(header[:3], "little"))
                if self._doomed(payload):
                    doomed.set()
                server.sendall(header + payload)
        except OSError:
            pass
        finally:
            _close(server)
            _close(client)

    def _downstream(self, server: socket.socket, client: socket.socket,
                    doomed: threading.Event) -> None:
        """Server to client, until the answer to a doomed query: that one is read and lost."""
        try:
            while data := server.recv(65536):
                if doomed.is_set():
                    break  # the server finished the statement; its answer goes nowhere
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)


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
