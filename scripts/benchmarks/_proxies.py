"""The benches' TCP proxies on 127.0.0.1: one that delays every chunk (a link farther away
than the loopback, without ``tc netem``, which this kernel lacks), and one that counts the
commands a client sends (its statements, whatever else a shared server is doing)."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import threading
import time
from typing import Any

from ._setup import is_postgresql


class DelayProxy:
    """A TCP proxy on 127.0.0.1 that forwards every chunk ``delay`` seconds after it arrived,
    each way, keeping order (a timer per chunk on one event loop; ``call_at`` runs timers of
    equal or later deadlines in order)."""

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream, self.delay = upstream, delay
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(65536):
                loop.call_at(loop.time() + self.delay, writer.write, data)
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
        finally:
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer),
                                 return_exceptions=True)
        except asyncio.CancelledError:  # close(): the proxy ends, its clients with it
            writer.close()

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


#: PostgreSQL's untyped first messages that are requests, not the start-up (SSL, GSS).
_PG_REQUESTS = (80877103, 80877104)


def _proxy_main(target: tuple[str, int], port: Any, commands: Any, pg: bool = False) -> None:
    """A TCP proxy to the database server that counts the commands its clients send (MySQL
    packets of sequence 0 from the client; PostgreSQL's Query and Execute messages): one
    relay's queries, whatever else the shared server is doing (its global ``Questions``, or
    pg_stat_database, counts every client's)."""
    def count_one() -> None:
        with commands.get_lock():
            commands.value += 1

    def mysql_packets(buffer: bytes, state: dict[str, Any]) -> bytes:
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:3], "little")
            if len(buffer) < 4 + size:
                break
            if buffer[3] == 0:
                count_one()
            buffer = buffer[4 + size:]
        return buffer

    def pg_messages(buffer: bytes, state: dict[str, Any]) -> bytes:
        while True:
            if not state.get("started"):  # untyped: int32 length, int32 code
                if len(buffer) < 8:
                    return buffer
                size = int.from_bytes(buffer[:4], "big")
                if len(buffer) < size:
                    return buffer
                if int.from_bytes(buffer[4:8], "big") not in _PG_REQUESTS:
                    state["started"] = True
                buffer = buffer[size:]
                continue
            if len(buffer) < 5:
                return buffer
            size = int.from_bytes(buffer[1:5], "big")
            if len(buffer) < 1 + size:
                return buffer
            if buffer[:1] in (b"Q", b"E"):  # a simple query, or an extended one's Execute
                count_one()
            buffer = buffer[1 + size:]

    parse = pg_messages if pg else mysql_packets

    async def pipe(reader: Any, writer: Any, count: bool) -> None:
        buffer = b""
        state: dict[str, Any] = {}
        try:
            while data := await reader.read(65536):
                writer.write(data)
                if count:
                    buffer = parse(buffer + data, state)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def serve(client_reader: Any, client_writer: Any) -> None:
        server_reader, server_writer = await asyncio.open_connection(*target)
        await asyncio.gather(pipe(client_reader, server_writer, True),
                             pipe(server_reader, client_writer, False))

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port.value = server.sockets[0].getsockname()[1]
        await server.serve_forever()

    asyncio.run(main())


def clear_text(url: Any) -> Any:
    """``url`` with TLS turned off, so a proxy can read the commands (the sessions otherwise
    switch to TLS when the server offers it)."""
    clear = ("sslmode", "disable") if is_postgresql(url) else ("ssl_disabled", True)
    options = tuple(sorted({**dict(url.options), clear[0]: clear[1]}.items()))
    return dataclasses.replace(url, options=options)


class CountingProxy:
    """A counting proxy (:func:`_proxy_main`) in a process of its own; ``url`` is the
    server's URL through it, in clear text."""

    def __init__(self, url: Any) -> None:
        ctx = multiprocessing.get_context("fork")
        self.port, self.commands = ctx.Value("i", 0), ctx.Value("q", 0)
        pg = is_postgresql(url)
        self.process = ctx.Process(target=_proxy_main, daemon=True,
                                   args=((url.host, url.port), self.port, self.commands, pg))
        self.process.start()
        while not self.port.value:
            time.sleep(0.01)
        self.url = dataclasses.replace(clear_text(url), host="127.0.0.1",
                                       port=self.port.value)

    def count(self) -> int:
        return int(self.commands.value)

    def close(self) -> None:
        self.process.terminate()
        self.process.join(10)
