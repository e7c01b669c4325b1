"""What every benchmark shares, written once: the scratch database (``--database-url`` names a
server, and each bench runs in a database of its own there, ``<database>_<suffix>``, created
and migrated before and dropped after, whatever happens in between), the business table and
the event the benches write, the server's name and version, and the load average printed
beside every figure (the machine's 2 cores are shared)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:  # outbox_lite is imported where it is used: the relay's raw twins, fresh
    # processes that start through this package, import nothing of it
    from outbox_lite._families.url import DatabaseUrl

#: The event payload every bench writes.
PAYLOAD = {"job_id": 0, "model": "small", "prompt": "resize the picture to 512x512",
           "priority": 3, "tags": ["image", "resize"]}

#: The event INSERT of the MySQL baselines, written without the library.
EVENT_INSERT = (
    "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload,"
    " status, attempt_count, available_at, created_at, updated_at)"
    " VALUES (%s, %s, %s, %s, %s, 'pending', 0, %s, %s, %s)"
)

#: What differs between the families in the benches' own SQL (the library's is its own).
JOB_TABLE = {
    "mysql": "CREATE TABLE job (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
             " name VARCHAR(64) NOT NULL) ENGINE=InnoDB",
    "postgresql": "CREATE TABLE job (id BIGSERIAL PRIMARY KEY, name VARCHAR(64) NOT NULL)",
}
ANALYZE = {"mysql": "ANALYZE TABLE outbox_event", "postgresql": "ANALYZE outbox_event"}
JOB_INSERT = {"mysql": "INSERT INTO job (name) VALUES (%s)",
              "postgresql": "INSERT INTO job (name) VALUES (%s) RETURNING id"}


def utcnow() -> dt.datetime:
    """Now in UTC, naive, as the tables store it."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def is_postgresql(url: Any) -> bool:
    return str(getattr(url, "scheme", "")) == "postgresql"


def family(url: Any) -> str:
    """The family's key in JOB_TABLE, ANALYZE and JOB_INSERT."""
    return "postgresql" if is_postgresql(url) else "mysql"


def job_table(url: Any) -> str:
    """The benches' business table, in the server's dialect."""
    return JOB_TABLE[family(url)]


def load() -> str:
    """The load averages, as printed beside the figures."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def median_pair(rounds: int, first: Callable[[], float], second: Callable[[], float],
                ) -> tuple[float, float, float]:
    """Alternate A B B A … so drift on a noisy machine hits both sides alike; return the
    median of each side and the median of the rounds' own ratios A/B."""
    a: list[float] = []
    b: list[float] = []
    for r in range(rounds):
        order = (first, second) if r % 2 == 0 else (second, first)
        for fn in order:
            (a if fn is first else b).append(fn())
    return (statistics.median(a), statistics.median(b),
            statistics.median(x / y for x, y in zip(a, b)))


def take_turns(clients: list[Any], operations: int, block: int,
               around: Callable[[Any], Any] = lambda client: contextlib.nullcontext(),
               ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Warm each client (3 operations), then ``operations`` each, taking turns in blocks of
    ``block`` (A B C, then C B A, …) so the server's background work weighs on all alike;
    each operation is ``client.write(n)``, inside ``around(client)`` for a whole block.
    Returns the seconds each client spent (by ``client.name``) and each block's rate."""
    n = 0
    for client in clients:  # warm: connection, session question, packet limit, schema
        with around(client):
            for _ in range(3):
                client.write(n)
                n += 1
    spent = {c.name: 0.0 for c in clients}
    per_block: dict[str, list[float]] = {c.name: [] for c in clients}
    for turn in range(0, operations, block):
        size = min(block, operations - turn)
        for client in clients if turn // block % 2 == 0 else clients[::-1]:
            with around(client):
                started = time.perf_counter()
                for _ in range(size):
                    client.write(n)
                    n += 1
                elapsed = time.perf_counter() - started
            spent[client.name] += elapsed
            per_block[client.name].append(size / elapsed)
    return spent, per_block


def server_name(base: DatabaseUrl, *, where: bool = True, short: bool = False) -> str:
    """The server's kind and version (``short``: PostgreSQL's major.minor only), and where it
    listens unless ``where`` is false."""
    from outbox_lite._families.mysql_server import server_of

    conn = base.server_connection()
    try:
        cur = conn.cursor()
        if is_postgresql(base):
            cur.execute("SELECT current_setting('server_version')")
            version = cur.fetchone()[0].split()[0]
            name = "PostgreSQL " + (".".join(version.split(".")[:2]) if short else version)
        else:
            name = str(server_of(lambda sql: (cur.execute(sql), cur.fetchall())[1]))
        return f"{name} at {base.host}:{base.port}" if where else name
    finally:
        conn.close()


#: The default servers of the benches that put MariaDB and MySQL side by side.
MARIADB_AND_MYSQL = ["mysql://root@127.0.0.1:3306/outbox_lite",
                     "mysql://root@127.0.0.1:3308/outbox_lite"]
#: ... and of those that measure on all three servers.
ALL_THREE = MARIADB_AND_MYSQL + ["postgresql://postgres@127.0.0.1:5432/outbox_lite"]


def add_database_option(parser: argparse.ArgumentParser, suffix: str,
                        repeat: bool = False, default: str | None = None) -> None:
    """The ``--database-url`` option (repeatable with ``repeat``), its help naming the
    scratch database and ``default`` (else the environment's or the library's URL)."""
    from outbox_lite._db import DEFAULT_URL

    fallback = default or f"$OUTBOX_DATABASE_URL, else {DEFAULT_URL}"
    parser.add_argument("--database-url", metavar="URL",
                        **({"action": "append"} if repeat else {}),
                        help=("server to use" + (" (repeatable)" if repeat else "")
                              + f"; the bench runs in <database>_{suffix}, created and"
                              f" dropped (default: {fallback})"))


_SIZES = {"rounds": "rounds per side", "events": "events", "batch": "batch size",
          "workers": "processes"}


def add_sizes(parser: argparse.ArgumentParser, **sizes: int | tuple[int, str]) -> None:
    """An integer option per size given (``rounds``, ``events``, ``batch``, ``workers``):
    its default, or its default and what it counts."""
    for name, value in sizes.items():
        default, what = value if isinstance(value, tuple) else (value, _SIZES[name])
        parser.add_argument(f"--{name}", type=int, default=default,
                            help=f"{what} (default {default})")


def server_url(option: str | None) -> DatabaseUrl:
    """The URL given, else ``$OUTBOX_DATABASE_URL``, else the library's default."""
    from outbox_lite._db import DEFAULT_URL
    from outbox_lite._families.url import DatabaseUrl

    return DatabaseUrl.parse(option or os.environ.get("OUTBOX_DATABASE_URL") or DEFAULT_URL)


def prepare(url: DatabaseUrl, *setup_sql: str) -> None:
    """``url``'s database dropped if it was left behind, created, migrated, ``setup_sql`` run
    in it."""
    from outbox_lite import migrate as schema

    url.drop_database()
    url.create_database()
    database = url.database()
    schema.migrate(database)
    for sql in setup_sql:
        database.execute_sql(sql)
    database.close()


@contextlib.contextmanager
def scratch_database(option: str | DatabaseUrl | None, suffix: str,
                     *setup_sql: str) -> Iterator[Any]:
    """Yield the URL of ``<database>_<suffix>`` on the server of ``option``: dropped if it was
    left behind, created, migrated, ``setup_sql`` run in it; dropped again on the way out."""
    base = option if option is not None and not isinstance(option, str) else server_url(option)
    url = base.with_name(f"{base.name}_{suffix}")
    try:
        prepare(url, *setup_sql)
        yield url
    finally:
        url.drop_database()
