"""outbox_lite beside its peers on the same PostgreSQL server, in one run (issue 30's item 5):
procrastinate (the PostgreSQL job queue), pactix (an outbox on SQLAlchemy) and
faststream-outbox (FastStream's outbox broker on a Postgres table), measured the same way with
the same number of processes.

* ``writes``: ``--processes`` writer processes, ``--writes`` each (after one write rolled
  back, which must leave neither row nor event, and 3 to warm up): a business row
  (``INSERT INTO job … RETURNING id``) and its event in one transaction. outbox_lite:
  ``create_in_transaction`` inside ``db.atomic()`` (Peewee on psycopg 3); procrastinate:
  ``task.configure(connection=conn).defer(…)`` on the caller's psycopg 3 connection inside
  ``conn.transaction()``, which procrastinate supports for a user-managed transaction (its
  ``SyncPsycopgConnector``): the job commits with the row, or neither does. pactix:
  ``OutboxStore.append(conn, MessageEnvelope(…))`` on the caller's ``AsyncConnection`` inside
  ``engine.begin()`` (SQLAlchemy asyncio on asyncpg); faststream-outbox:
  ``broker.publish(body, queue=…, session=conn)`` the same way (its INSERT also calls
  ``pg_notify``).
* ``drain``: a backlog of ``--events`` seeded, then drained by ``--processes`` worker
  processes. outbox_lite: ``Relay(…).run(until_empty=True)``, batches of ``--batch``, a
  publisher that accepts every event with no network call; procrastinate: workers
  (``run_worker_async(wait=False)``, concurrency 1) running a no-op ``async`` task; pactix:
  ``OutboxRunner.run_once(engine)`` until a pass claims nothing (claims of ``--batch``, one
  transaction per message marked published), a catch-all publisher returning
  ``PublishOutcome.published()``; faststream-outbox: its subscriber processing the rows in
  place (no downstream broker), a no-op handler, ``max_workers=1``,
  ``fetch_batch_size=--batch``, each handled row DELETEd (one by one, or buffered up to
  ``--faststream-flush``, its ``terminal_flush_batch_size``); it has no "until empty", so each
  process stops once ``SELECT EXISTS (SELECT 1 FROM outbox)`` (polled every 50 ms) is false.

Every process connects and warms up first, then all start together; a side's rate is its
operations over the time from that start to the last process's end (imports and connections
not counted; a relay's or a worker's own start, e.g. registering a worker, is).
Each side ends checked by SQL: every business row has its event (outbox_event rows,
procrastinate_jobs 'todo', outbox_message 'pending', outbox rows not leased, matched to the
rows by job id), and after a drain every event is 'published' / every job 'succeeded' / every
outbox_message 'published' / the outbox table empty with the handlers' count equal to the
backlog. The sides take turns (the order rotated and reversed from round to round) for
``--rounds`` rounds; printed: each side's median and spread (min-max), the median of the
rounds' own ratios outbox_lite / peer, and the load average (the machine's 2 cores are shared).

No peer is a dependency of the project: each runs in a venv of its own and its processes are
that interpreter running this file. procrastinate: ``--peers-python`` (default
``$OUTBOX_PEERS_PYTHON`` or ``/tmp/peers-venv/bin/python``), created when that default is
missing (``procrastinate==3.10.0`` and the project's own psycopg version); pactix and
faststream-outbox (pactix needs Python >= 3.12): ``--pactix-python`` (default
``$OUTBOX_PEERS312_PYTHON`` or ``/tmp/peers-venv-312/bin/python``), created when missing from
pyenv's ``~/.pyenv/versions/3.12.1/bin/python3`` (``pactix[postgres]==0.2.0`` and
``faststream-outbox[asyncpg]==0.19.0``). Each side has a database of its own on the server,
``<database>_bench_peers`` and ``<database>_bench_peers_<peer>``, created before and dropped
after.

Usage: python scripts/bench.py peers [--database-url URL] [--peers-python PATH]
       [--pactix-python PATH] [--peer procrastinate|pactix|faststream_outbox …]
       [--faststream-flush 1] [--processes 1 --processes 4] [--writes 1000]
       [--events 20000] [--batch 100]
       [--rounds 3] [--only writes|drain] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

# Nothing of outbox_lite at import time: the peers' processes run this file under an
# interpreter that has the peer and not outbox_lite.
from ._setup import PAYLOAD, add_database_option, add_sizes, load

ENTRY = Path(__file__).resolve().parent.parent / "bench.py"
ROOT = ENTRY.parent.parent
POSTGRESQL = "postgresql://postgres@127.0.0.1:5432/outbox_lite_test"
PEERS_PYTHON = "/tmp/peers-venv/bin/python"
PROCRASTINATE = "procrastinate==3.10.0"
#: pactix needs Python >= 3.12: its venv (shared with faststream-outbox) is made from pyenv's 3.12.
PEERS312_PYTHON = "/tmp/peers-venv-312/bin/python"
PYTHON312 = "~/.pyenv/versions/3.12.1/bin/python3"
PEERS312 = ("pactix[postgres]==0.2.0", "faststream-outbox[asyncpg]==0.19.0")
QUEUE = "peers"
#: Writes each process makes before the start (connection, statements, schema caches).
WARM = 3
PEERS = ("procrastinate", "pactix", "faststream_outbox")
#: The distribution each side is (its version is reported)
DISTRIBUTIONS = {"procrastinate": "procrastinate", "pactix": "pactix",
                 "faststream_outbox": "faststream-outbox"}
MEASURES = ("writes", "drain")


# ---------------------------------------------------------------------------
# The processes' bodies: each prints "ready", waits for a line on stdin, works, then prints
# one JSON line {"start": …, "end": …, "count": …} (time.monotonic, shared by the processes).
# ---------------------------------------------------------------------------

def _ready_then_go() -> float:
    print("ready", flush=True)
    sys.stdin.readline()
    return time.monotonic()


def _done(start: float, count: int) -> None:
    print(json.dumps({"start": start, "end": time.monotonic(), "count": count}), flush=True)


def _timed_writes(write: Callable[[int], Any], writes: int) -> None:
    """Warm with WARM writes, wait for the go, then time ``writes`` more (each side's loop)."""
    for n in range(WARM):
        write(n)
    start = _ready_then_go()
    for n in range(WARM, WARM + writes):
        write(n)
    _done(start, writes)


async def _timed_writes_async(write: Callable[[int], Any], writes: int) -> None:
    """:func:`_timed_writes` for a side whose ``write(n)`` is a coroutine."""
    for n in range(WARM):
        await write(n)
    start = _ready_then_go()
    for n in range(WARM, WARM + writes):
        await write(n)
    _done(start, writes)


class _RolledBack(Exception):
    pass


class AcceptAll:
    """A publisher that accepts every event, no network call: the relay's own work is all."""

    def publish(self, events: Any) -> dict[int, BaseException]:
        return {}

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return "AcceptAll()"


def _library_write(database_url: str, writes: int, worker: str) -> None:
    from outbox_lite import OutboxRepository
    from outbox_lite._families.url import DatabaseUrl

    db = DatabaseUrl.parse(database_url).database()
    repo = OutboxRepository(db)

    def write(n: int) -> None:
        with db.atomic():
            job_id = db.execute_sql("INSERT INTO job (name) VALUES (%s) RETURNING id",
                                    (f"{worker}-{n}",)).fetchone()[0]
            repo.create_in_transaction(event_type="job.created", aggregate_type="job",
                                       aggregate_id=str(job_id),
                                       payload={**PAYLOAD, "job_id": job_id},
                                       dedupe_key=f"job.created:{worker}-{n}")

    try:  # one write rolled back: the final counts show the event went with the row
        with db.atomic():
            db.execute_sql("INSERT INTO job (name) VALUES (%s)", (f"{worker}-rolled-back",))
            repo.create_in_transaction(event_type="job.created", aggregate_type="job",
                                       aggregate_id="0", payload=PAYLOAD,
                                       dedupe_key=f"job.created:{worker}-rolled-back")
            raise _RolledBack
    except _RolledBack:
        pass
    _timed_writes(write, writes)
    db.close()


def _library_drain(database_url: str, batch: int, worker: str) -> None:
    from outbox_lite import OutboxRepository
    from outbox_lite._families.url import DatabaseUrl
    from outbox_lite.relay import Relay

    db = DatabaseUrl.parse(database_url).database()
    db.connect()
    relay = Relay(OutboxRepository(db), AcceptAll(), batch_size=batch, worker_id=worker,
                  progress_every=0)
    start = _ready_then_go()
    relay.run(until_empty=True)
    _done(start, relay.stats.published)
    db.close()


def _procrastinate_app(conninfo: str, sync: bool) -> tuple[Any, Any]:
    """The peer's app (a sync psycopg 3 connector for writes and seeding, the async one for
    workers) and its no-op task."""
    import procrastinate

    connector = (procrastinate.SyncPsycopgConnector(conninfo=conninfo, min_size=1, max_size=2)
                 if sync else procrastinate.PsycopgConnector(conninfo=conninfo, min_size=1,
                                                            max_size=3))
    app = procrastinate.App(connector=connector)

    @app.task(name="job_created", queue=QUEUE)
    async def job_created(**kwargs: Any) -> None:
        return None

    return app, job_created


def _procrastinate_schema(conninfo: str) -> None:
    app, _ = _procrastinate_app(conninfo, sync=True)
    with app.open():
        app.schema_manager.apply_schema()


def _procrastinate_seed(conninfo: str, events: int) -> None:
    app, task = _procrastinate_app(conninfo, sync=True)
    with app.open():
        for first in range(0, events, 1000):
            task.batch_defer(*[{**PAYLOAD, "job_id": n}
                               for n in range(first, min(events, first + 1000))])


def _procrastinate_write(conninfo: str, writes: int, worker: str) -> None:
    import psycopg

    app, task = _procrastinate_app(conninfo, sync=True)
    app.open()
    conn = psycopg.connect(conninfo)

    def write(n: int) -> None:
        with conn.transaction():  # the caller's transaction: the row and the job commit together
            job_id = conn.execute("INSERT INTO job (name) VALUES (%s) RETURNING id",
                                  (f"{worker}-{n}",)).fetchone()[0]  # type: ignore[index]
            task.configure(connection=conn).defer(**{**PAYLOAD, "job_id": job_id})

    with conn.transaction():  # one rolled back: the final counts show the job went with it
        conn.execute("INSERT INTO job (name) VALUES (%s)", (f"{worker}-rolled-back",))
        task.configure(connection=conn).defer(**{**PAYLOAD, "job_id": 0})
        raise psycopg.Rollback()
    _timed_writes(write, writes)
    conn.close()
    app.close()


def _procrastinate_drain(conninfo: str, worker: str) -> None:
    import asyncio

    app, _ = _procrastinate_app(conninfo, sync=False)

    async def main() -> None:
        async with app.open_async():
            await app.job_manager.check_connection_async()
            start = await asyncio.get_running_loop().run_in_executor(None, _ready_then_go)
            await app.run_worker_async(queues=[QUEUE], wait=False, concurrency=1, name=worker,
                                       install_signal_handlers=False)
            _done(start, -1)  # the parent counts the succeeded jobs

    asyncio.run(main())



# pactix 0.2.0 and faststream-outbox 0.19.0: SQLAlchemy 2 asyncio on asyncpg, in a Python 3.12
# venv. The business row and the message share one ``engine.begin()`` transaction.

def _async_engine(url: str, pool: int = 2) -> Any:
    from sqlalchemy.ext.asyncio import create_async_engine

    return create_async_engine(url, pool_size=pool, max_overflow=0)


_INSERT_JOB = "INSERT INTO job (name) VALUES (:name) RETURNING id"


def _pactix_store(batch: int = 100) -> Any:
    from pactix import PactixConfig
    from pactix.outbox import OutboxStore

    return OutboxStore(PactixConfig(outbox_batch_size=batch))


def _pactix_schema(url: str) -> None:
    import asyncio

    from pactix.db import metadata

    async def main() -> None:
        engine = _async_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        await engine.dispose()

    asyncio.run(main())


def _pactix_write(url: str, writes: int, worker: str) -> None:
    import asyncio

    from pactix import MessageEnvelope, MessageMetadata
    from sqlalchemy import text

    store = _pactix_store()

    async def write(engine: Any, n: int, *, roll_back: bool = False) -> None:
        async with engine.begin() as conn:  # the caller's transaction: the row and the message
            job_id = (await conn.execute(text(_INSERT_JOB),
                                         {"name": f"{worker}-{n}"})).scalar_one()
            await store.append(conn, MessageEnvelope(
                MessageMetadata(message_id=f"job.created:{worker}-{n}", event_type="job.created",
                                message_key=str(job_id)),
                {**PAYLOAD, "job_id": job_id}))
            if roll_back:
                raise _RolledBack

    async def main() -> None:
        engine = _async_engine(url, pool=1)
        try:  # one rolled back: the final counts show the message went with the row
            await write(engine, -1, roll_back=True)
        except _RolledBack:
            pass
        await _timed_writes_async(lambda n: write(engine, n), writes)
        await engine.dispose()

    asyncio.run(main())


def _pactix_seed(url: str, events: int) -> None:
    import asyncio

    from pactix.db import outbox_message
    from pactix.message import MessageMetadata
    from pactix.outbox import OutboxMessageRecord
    from pactix.outbox.store import _record_values

    store = _pactix_store()

    async def main() -> None:
        engine = _async_engine(url)
        async with engine.begin() as conn:
            for first in range(0, events, 1000):
                await conn.execute(outbox_message.insert(), [_record_values(
                    OutboxMessageRecord.pending(
                        MessageMetadata(message_id=f"job.created:{n}", event_type="job.created",
                                        message_key=str(n)),
                        {**PAYLOAD, "job_id": n}, store.retry_policy), "postgresql")
                    for n in range(first, min(events, first + 1000))])
        await engine.dispose()

    asyncio.run(main())


def _pactix_drain(url: str, batch: int, worker: str) -> None:
    """pactix's ``OutboxRunner.run_once`` (reclaim + claim of ``batch`` in one transaction,
    then one transaction per published message) until a pass claims nothing, with a
    catch-all publisher that reports every message published, no network call."""
    import asyncio

    from pactix import OutboxRunner, PublisherRegistry, PublishOutcome, outbox_publisher

    store = _pactix_store(batch)

    async def accept_all(record: Any) -> Any:
        return PublishOutcome.published()

    async def main() -> None:
        engine = _async_engine(url)
        registry = PublisherRegistry()
        await registry.register_all(outbox_publisher(accept_all))
        runner = OutboxRunner(store, registry)
        async with engine.connect() as conn:  # connect before the start
            await conn.exec_driver_sql("SELECT 1")
        start = await asyncio.get_running_loop().run_in_executor(None, _ready_then_go)
        published = 0
        while True:
            summary = await runner.run_once(engine)
            published += summary.published
            if summary.claimed == 0 and summary.reclaimed == 0:
                break
        _done(start, published)
        await engine.dispose()

    asyncio.run(main())


def _faststream_parts(url: str, pool: int = 2) -> tuple[Any, Any, Any]:
    from faststream_outbox import OutboxBroker, make_outbox_table
    from sqlalchemy import MetaData

    metadata = MetaData()
    table = make_outbox_table(metadata, table_name="outbox")
    engine = _async_engine(url, pool=pool)
    return OutboxBroker(engine, outbox_table=table, logger=None), table, engine


def _faststream_schema(url: str) -> None:
    import asyncio

    async def main() -> None:
        _, table, engine = _faststream_parts(url)
        async with engine.begin() as conn:
            await conn.run_sync(table.metadata.create_all)
        await engine.dispose()

    asyncio.run(main())


def _faststream_write(url: str, writes: int, worker: str) -> None:
    import asyncio

    from sqlalchemy import text

    broker, _, engine = _faststream_parts(url, pool=1)

    async def write(n: int, *, roll_back: bool = False) -> None:
        async with engine.begin() as conn:  # the caller's transaction: the row and the message
            job_id = (await conn.execute(text(_INSERT_JOB),
                                         {"name": f"{worker}-{n}"})).scalar_one()
            await broker.publish({**PAYLOAD, "job_id": job_id}, queue=QUEUE, session=conn)
            if roll_back:
                raise _RolledBack

    async def main() -> None:
        await broker.connect()
        try:  # one rolled back: the final counts show the message went with the row
            await write(-1, roll_back=True)
        except _RolledBack:
            pass
        await _timed_writes_async(write, writes)
        await engine.dispose()

    asyncio.run(main())


def _faststream_seed(url: str, events: int) -> None:
    import asyncio

    broker, _, engine = _faststream_parts(url)

    async def main() -> None:
        await broker.connect()
        async with engine.begin() as conn:
            for first in range(0, events, 1000):
                await broker.publish_batch(*[{**PAYLOAD, "job_id": n}
                                             for n in range(first, min(events, first + 1000))],
                                           queue=QUEUE, session=conn)
        await engine.dispose()

    asyncio.run(main())


def _faststream_drain(url: str, batch: int, worker: str, flush: int = 1) -> None:
    """faststream-outbox's own subscriber processing the rows in place (its "standalone
    outbox queue": no downstream broker), a no-op handler, ``max_workers=1``,
    ``fetch_batch_size=batch`` and ``terminal_flush_batch_size=flush`` (its default 1: each
    handled row DELETEd on its own; more buffers the DELETEs). The subscriber has no "until
    empty": the process stops its broker once ``SELECT EXISTS (SELECT 1 FROM outbox)`` (every
    50 ms on a connection of its own) says the table is empty."""
    import asyncio

    from sqlalchemy import text

    broker, _, engine = _faststream_parts(url, pool=4)
    handled = 0

    @broker.subscriber(QUEUE, max_workers=1, fetch_batch_size=batch,
                       terminal_flush_batch_size=flush)
    async def job_created(body: dict[str, Any]) -> None:
        nonlocal handled
        handled += 1

    async def main() -> None:
        async with engine.connect() as conn:  # connect before the start
            await conn.exec_driver_sql("SELECT 1")
        start = await asyncio.get_running_loop().run_in_executor(None, _ready_then_go)
        await broker.start()
        async with engine.connect() as watch:
            while (await watch.execute(text("SELECT EXISTS (SELECT 1 FROM outbox)"))).scalar():
                await watch.commit()
                await asyncio.sleep(0.05)
        end = time.monotonic()
        await broker.stop()
        print(json.dumps({"start": start, "end": end, "count": handled}), flush=True)
        await engine.dispose()

    asyncio.run(main())


ROLES: dict[str, Callable[..., None]] = {"_library_write": _library_write, "_library_drain": _library_drain,
         "_procrastinate_schema": _procrastinate_schema,
         "_procrastinate_seed": _procrastinate_seed,
         "_procrastinate_write": _procrastinate_write,
         "_procrastinate_drain": _procrastinate_drain,
         "_pactix_schema": _pactix_schema, "_pactix_seed": _pactix_seed,
         "_pactix_write": _pactix_write, "_pactix_drain": _pactix_drain,
         "_faststream_schema": _faststream_schema, "_faststream_seed": _faststream_seed,
         "_faststream_write": _faststream_write, "_faststream_drain": _faststream_drain}


# ---------------------------------------------------------------------------
# The parent: databases, seeding, starting the processes together, checking
# ---------------------------------------------------------------------------

def peers_python(option: str | None) -> str:
    """procrastinate's interpreter; the default venv is created when missing."""
    path = option or os.environ.get("OUTBOX_PEERS_PYTHON") or PEERS_PYTHON
    if not Path(path).exists():
        if path != PEERS_PYTHON:
            raise SystemExit(f"--peers-python {path}: no such interpreter")
        from importlib.metadata import version

        venv = Path(PEERS_PYTHON).parent.parent
        print(f"creating {venv} with {PROCRASTINATE}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([PEERS_PYTHON, "-m", "pip", "install", "-q", PROCRASTINATE,
                        f"psycopg[binary]=={version('psycopg')}"], check=True)
    return path


def peers312_python(option: str | None) -> str:
    """pactix's and faststream-outbox's interpreter (Python >= 3.12); the default venv is
    created from ``PYTHON312`` when missing."""
    path = option or os.environ.get("OUTBOX_PEERS312_PYTHON") or PEERS312_PYTHON
    if not Path(path).exists():
        if path != PEERS312_PYTHON:
            raise SystemExit(f"--pactix-python {path}: no such interpreter")
        venv = Path(PEERS312_PYTHON).parent.parent
        python312 = str(Path(PYTHON312).expanduser())
        print(f"creating {venv} from {python312} with {' '.join(PEERS312)}", file=sys.stderr,
              flush=True)
        subprocess.run([python312, "-m", "venv", str(venv)], check=True)
        subprocess.run([PEERS312_PYTHON, "-m", "pip", "install", "-q", *PEERS312], check=True)
    return path


def peer_versions(python: str, peer: str) -> dict[str, str]:
    driver = ("'psycopg': psycopg.__version__ + ' ' + psycopg.pq.__impl__"
              if peer == "procrastinate" else
              "'sqlalchemy': m.version('sqlalchemy'), 'asyncpg': m.version('asyncpg')"
              + (", 'faststream': m.version('faststream')" if peer == "faststream_outbox"
                 else ""))
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m, json, sys"
         + (", psycopg" if peer == "procrastinate" else "") + ";"
         f" print(json.dumps({{{peer!r}: m.version({DISTRIBUTIONS[peer]!r}), {driver},"
         " 'python': sys.version.split()[0]}))"],
        capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out))


def library_versions() -> dict[str, str]:
    import importlib.metadata as metadata

    import psycopg

    return {"outbox_lite": metadata.version("outbox-lite"), "peewee": metadata.version("peewee"),
            "psycopg": f"{metadata.version('psycopg')} {psycopg.pq.__impl__}",
            "python": sys.version.split()[0]}


def conninfo(url: Any) -> str:
    """libpq's key=value string for ``url``, without its password (given as PGPASSWORD)."""
    return f"host={url.host} port={url.port} user={url.user} dbname={url.name}"


def sqlalchemy_url(url: Any) -> str:
    """SQLAlchemy's asyncpg URL for ``url``, without its password (asyncpg reads PGPASSWORD)."""
    return f"postgresql+asyncpg://{url.user}@{url.host}:{url.port}/{url.name}"


#: Per peer: the role prefix, how its processes get the database, the SQL that empties it
#: after the job table, the SQL checking writes (rows, events, matched) and a drain (done, left).
PEER_SQL: dict[str, dict[str, Any]] = {
    "procrastinate": {
        "role": "_procrastinate", "address": conninfo, "tables": "procrastinate_jobs",
        "written": "SELECT (SELECT COUNT(*) FROM job),"
                   " (SELECT COUNT(*) FROM procrastinate_jobs WHERE status = 'todo'),"
                   " (SELECT COUNT(*) FROM job JOIN procrastinate_jobs p"
                   "  ON (p.args->>'job_id')::bigint = job.id)",
        "drained": "SELECT COUNT(*) FILTER (WHERE status = 'succeeded'),"
                   " COUNT(*) FILTER (WHERE status <> 'succeeded') FROM procrastinate_jobs",
        "analyze": "ANALYZE procrastinate_jobs"},
    "pactix": {
        "role": "_pactix", "address": sqlalchemy_url, "tables": "outbox_message",
        "written": "SELECT (SELECT COUNT(*) FROM job),"
                   " (SELECT COUNT(*) FROM outbox_message WHERE status = 'pending'),"
                   " (SELECT COUNT(*) FROM job JOIN outbox_message o"
                   "  ON (o.payload->>'job_id')::bigint = job.id)",
        "drained": "SELECT COUNT(*) FILTER (WHERE status = 'published'),"
                   " COUNT(*) FILTER (WHERE status <> 'published') FROM outbox_message",
        "analyze": "ANALYZE outbox_message"},
    # faststream-outbox DELETEs a handled row: "done" is the handlers' count, and the table
    # must be empty after.
    "faststream_outbox": {
        "role": "_faststream", "address": sqlalchemy_url, "tables": "outbox",
        "written": "SELECT (SELECT COUNT(*) FROM job),"
                   " (SELECT COUNT(*) FROM outbox WHERE acquired_token IS NULL),"
                   " (SELECT COUNT(*) FROM job JOIN outbox o"
                   "  ON (convert_from(o.payload, 'UTF8')::jsonb->>'job_id')::bigint = job.id)",
        "drained": "SELECT -1, COUNT(*) FROM outbox",
        "analyze": "ANALYZE outbox"},
}


class Peers:
    def __init__(self, library_url: Any, peer_urls: dict[str, Any], pythons: dict[str, str],
                 *, batch: int, flush: int = 1) -> None:
        self.library_url, self.peer_urls, self.pythons, self.batch, self.flush = (
            library_url, peer_urls, pythons, batch, flush)
        password = next(iter(peer_urls.values())).password if peer_urls else None
        self.env = {**os.environ, "PYTHONPATH": str(ROOT),
                    **({"PGPASSWORD": password} if password else {})}
        self.counts: list[int] = []

    def sql(self, url: Any, statement: str) -> list[tuple[Any, ...]]:
        from . import raw_pg

        conn = raw_pg.connect(url)
        try:
            cur = conn.execute(statement)
            return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def _command(self, side: str, role: str, *args: str) -> list[str]:
        python = sys.executable if side == "outbox_lite" else self.pythons[side]
        return [python, str(ENTRY), "peers", role, *args]

    def _peer(self, side: str, role: str, *args: str) -> list[str]:
        """The command of ``side``'s ``role`` (e.g. "write"), its database first."""
        spec = PEER_SQL[side]
        return self._command(side, f"{spec['role']}_{role}",
                             spec["address"](self.peer_urls[side]), *args)

    def setup(self, side: str) -> None:
        """``side``'s own schema, then the business table."""
        subprocess.run(self._peer(side, "schema"), env=self.env, check=True)
        self.sql(self.peer_urls[side], "CREATE TABLE job (id BIGSERIAL PRIMARY KEY,"
                                       " name VARCHAR(64) NOT NULL)")

    def reset(self, side: str) -> None:
        if side == "outbox_lite":
            self.sql(self.library_url, "TRUNCATE job, outbox_event RESTART IDENTITY")
        else:
            self.sql(self.peer_urls[side],
                     f"TRUNCATE job, {PEER_SQL[side]['tables']} RESTART IDENTITY CASCADE")

    def together(self, commands: list[list[str]]) -> float:
        """Start ``commands``, let them all go once each is ready; the seconds from the first
        start to the last end, by their own clocks (their counts kept in ``self.counts``)."""
        procs = [subprocess.Popen(c, env=self.env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for c in commands]
        try:
            for p in procs:
                line = p.stdout.readline()  # type: ignore[union-attr]
                if line.strip() != "ready":
                    raise RuntimeError(f"{' '.join(commands[0][2:5])}: {line!r}"
                                       f" {p.communicate(timeout=60)[1][-2000:]}")
            for p in procs:
                p.stdin.write("go\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
            results = [p.communicate(timeout=900) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = [err for p, (_, err) in zip(procs, results) if p.returncode != 0]
        if failed:
            raise RuntimeError(f"{' '.join(commands[0][2:5])} failed: {failed[0][-2000:]}")
        spans = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
        self.counts = [s["count"] for s in spans]
        return max(s["end"] for s in spans) - min(s["start"] for s in spans)

    def writes(self, side: str, processes: int, writes: int) -> float:
        """Writes/s of ``processes`` writers, checked: each business row has its event."""
        self.reset(side)
        if side == "outbox_lite":
            seconds = self.together([self._command(side, "_library_write",
                                                   self.library_url.secret_text(), str(writes),
                                                   f"w{i}") for i in range(processes)])
            [(rows, events, matched)] = self.sql(
                self.library_url, "SELECT (SELECT COUNT(*) FROM job),"
                " (SELECT COUNT(*) FROM outbox_event WHERE status = 'pending'),"
                " (SELECT COUNT(*) FROM job JOIN outbox_event e"
                "  ON e.aggregate_id = job.id::text)")
        else:
            seconds = self.together([self._peer(side, "write", str(writes), f"w{i}")
                                     for i in range(processes)])
            [(rows, events, matched)] = self.sql(self.peer_urls[side], PEER_SQL[side]["written"])
        expected = processes * (writes + WARM)
        if not rows == events == matched == expected:
            raise AssertionError(f"{side} writes: {rows} rows, {events} events, {matched}"
                                 f" matched, of {expected}")
        return processes * writes / seconds

    def seed(self, side: str, events: int) -> None:
        self.reset(side)
        if side == "outbox_lite":
            self._seed_library(events)
        else:
            subprocess.run(self._peer(side, "seed", str(events)), env=self.env, check=True)
            self.sql(self.peer_urls[side], PEER_SQL[side]["analyze"])

    def _seed_library(self, events: int) -> None:
        from . import raw_pg
        from ._setup import utcnow

        now = utcnow()
        conn = raw_pg.connect(self.library_url, autocommit=False)
        try:
            with conn.cursor() as cur:
                for first in range(0, events, 2000):
                    cur.executemany(
                        "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id,"
                        " dedupe_key, payload, status, available_at, created_at, updated_at)"
                        " VALUES ('job.created', 'job', %s, %s, %s, 'pending', %s, %s, %s)",
                        [(str(n), f"job.created:{n}", json.dumps({**PAYLOAD, "job_id": n}),
                          now, now, now) for n in range(first, min(events, first + 2000))])
            conn.commit()
            conn.autocommit = True
            conn.execute("ANALYZE outbox_event")
        finally:
            conn.close()

    def drain(self, side: str, processes: int, events: int) -> float:
        """Events/s of ``processes`` workers draining a backlog of ``events``, checked: every
        event published / job succeeded / row handled and deleted."""
        self.seed(side, events)
        if side == "outbox_lite":
            seconds = self.together([self._command(side, "_library_drain",
                                                   self.library_url.secret_text(),
                                                   str(self.batch), f"relay-{i}")
                                     for i in range(processes)])
            [(done, left)] = self.sql(
                self.library_url, "SELECT COUNT(*) FILTER (WHERE status = 'published'),"
                " COUNT(*) FILTER (WHERE status <> 'published') FROM outbox_event")
        else:
            args = [] if side == "procrastinate" else [str(self.batch)]
            flush = [str(self.flush)] if side == "faststream_outbox" else []
            seconds = self.together([self._peer(side, "drain", *args, f"worker-{i}", *flush)
                                     for i in range(processes)])
            [(done, left)] = self.sql(self.peer_urls[side], PEER_SQL[side]["drained"])
            if done == -1:  # rows deleted once handled: the handlers' own count
                done = sum(self.counts)
        if done != events or left:
            raise AssertionError(f"{side} drain: {done} done, {left} not, of {events}")
        return events / seconds


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "rounds": values}


def measure(peers: Peers, sides: tuple[str, ...], kind: str, processes: int, rounds: int,
            size: int) -> dict[str, Any]:
    """``rounds`` of the sides taking turns (the order rotated each round); each side's
    spread and the rounds' ratios outbox_lite / peer."""
    rates: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for side in order if r % 2 == 0 else order[::-1]:
            rate = (peers.writes(side, processes, size) if kind == "writes"
                    else peers.drain(side, processes, size))
            rates[side].append(rate)
            print(f"round {r + 1} {kind} x{processes} {side}: {rate:,.0f}/s (load {load()})",
                  file=sys.stderr, flush=True)
    ratios = {side: spread([a / b for a, b in zip(rates["outbox_lite"], rates[side])])
              for side in sides[1:]}
    return {"measure": kind, "processes": processes, "size": size,
            **{side: spread(values) for side, values in rates.items()},
            "ratio": ratios, "load_average": list(os.getloadavg())}


def format_table(report: dict[str, Any]) -> str:
    v = report["versions"]
    sides = report["sides"]
    peers = sides[1:]

    def described(peer: str) -> str:
        rest = ", ".join(f"{k} {x}" for k, x in v[peer].items() if k != peer)
        return f"{peer} {v[peer][peer]} ({rest})"

    lines = [f"{report['server']}; outbox_lite {v['library']['outbox_lite']} (Peewee"
             f" {v['library']['peewee']}, psycopg {v['library']['psycopg']}) beside "
             + "; ".join(described(p) for p in peers)
             + f"; {report['rounds']} rounds, median (min-max)",
             f"  {'measure':<22}" + "".join(f" {s:>22}" for s in sides)
             + "".join(f" {'ratio ' + p[:11]:>18}" for p in peers) + f" {'load':>5}"]

    def cell(s: dict[str, Any], fmt: str) -> str:
        return (f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})")

    for m in report["measures"]:
        what = (f"writes/s, {m['processes']} proc" if m["measure"] == "writes"
                else f"drained/s, {m['processes']} proc")
        lines.append(f"  {what:<22}" + "".join(f" {cell(m[s], ',.0f'):>22}" for s in sides)
                     + "".join(f" {cell(m['ratio'][p], '.2f'):>18}" for p in peers)
                     + f" {m['load_average'][0]:>5.2f}")
    lines.append("  (ratio: outbox_lite / the peer, the median of the rounds' own ratios;"
                 " load: the 1-minute load average at the end of the measure)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] and given[0] in ROLES:  # a fresh process
        role, values = given[0], given[1:]
        ROLES[role](*[int(v) if v.isdigit() else v for v in values])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_peers", default=POSTGRESQL)
    parser.add_argument("--peers-python", metavar="PATH",
                        help="the interpreter with procrastinate (default: $OUTBOX_PEERS_PYTHON,"
                             f" else {PEERS_PYTHON}, created with {PROCRASTINATE} if missing)")
    parser.add_argument("--pactix-python", metavar="PATH",
                        help="the Python >= 3.12 interpreter with pactix and faststream-outbox"
                             f" (default: $OUTBOX_PEERS312_PYTHON, else {PEERS312_PYTHON},"
                             f" created from {PYTHON312} with {' and '.join(PEERS312)} if"
                             " missing)")
    parser.add_argument("--peer", choices=PEERS, action="append",
                        help="measure this peer beside outbox_lite (default: all three)")
    parser.add_argument("--faststream-flush", type=int, default=1, metavar="N",
                        help="faststream-outbox's terminal_flush_batch_size: DELETEs of handled"
                             " rows buffered up to N (default: 1, its own default)")
    parser.add_argument("--processes", type=int, action="append",
                        help="writer and worker processes per side, each given in turn"
                             " (default: 1 and 4)")
    add_sizes(parser, rounds=3, events=(20_000, "events in the backlog drained"),
              batch=(100, "outbox_lite's events per claim (and pactix's,"
                          " faststream-outbox's fetch_batch_size)"),
              writes=(1000, "writes per writer process"))
    parser.add_argument("--only", choices=MEASURES, action="append",
                        help="run only this measure (default: both)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)

    from ._setup import scratch_database, server_name, server_url

    base = server_url(args.database_url or POSTGRESQL)
    if str(base.scheme) != "postgresql":
        parser.error("the peers run on PostgreSQL: give a postgresql:// URL")
    chosen = tuple(p for p in PEERS if p in (args.peer or PEERS))
    pythons = {p: (peers_python(args.peers_python) if p == "procrastinate"
                   else peers312_python(args.pactix_python)) for p in chosen}
    sides = ("outbox_lite", *chosen)
    report: dict[str, Any] = {
        "server": server_name(base), "rounds": args.rounds, "batch": args.batch,
        "faststream_flush": args.faststream_flush,
        "sides": list(sides),
        "versions": {"library": library_versions(),
                     **{p: peer_versions(pythons[p], p) for p in chosen}},
        "load_average_at_start": list(os.getloadavg()), "measures": []}
    peer_urls = {p: base.with_name(f"{base.name}_bench_peers_{p}") for p in chosen}
    with scratch_database(base, "bench_peers",
                          "CREATE TABLE job (id BIGSERIAL PRIMARY KEY,"
                          " name VARCHAR(64) NOT NULL)") as library_url:
        try:
            peers = Peers(library_url, peer_urls, pythons, batch=args.batch,
                          flush=args.faststream_flush)
            for p, url in peer_urls.items():
                url.drop_database()
                url.create_database()
                peers.setup(p)
            for kind in args.only or MEASURES:
                for processes in args.processes or [1, 4]:
                    report["measures"].append(measure(
                        peers, sides, kind, processes, args.rounds,
                        args.writes if kind == "writes" else args.events))
        finally:
            for url in peer_urls.values():
                url.drop_database()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(format_table(report))
    return 0
