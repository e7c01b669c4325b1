"""outbox_lite beside a peer on the same PostgreSQL server, in one run (issue 30's item 5):
procrastinate, the PostgreSQL job queue, measured the same way with the same number of
processes.

* ``writes``: ``--processes`` writer processes, ``--writes`` each (after one write rolled
  back, which must leave neither row nor event, and 3 to warm up): a business row
  (``INSERT INTO job … RETURNING id``) and its event in one transaction. outbox_lite:
  ``create_in_transaction`` inside ``db.atomic()`` (Peewee on psycopg 3); procrastinate:
  ``task.configure(connection=conn).defer(…)`` on the caller's psycopg 3 connection inside
  ``conn.transaction()``, which procrastinate supports for a user-managed transaction (its
  ``SyncPsycopgConnector``): the job commits with the row, or neither does.
* ``drain``: a backlog of ``--events`` seeded, then drained by ``--processes`` worker
  processes. outbox_lite: ``Relay(…).run(until_empty=True)``, batches of ``--batch``, a
  publisher that accepts every event with no network call; procrastinate: workers
  (``run_worker_async(wait=False)``, concurrency 1) running a no-op ``async`` task.

Every process connects and warms up first, then all start together; a side's rate is its
operations over the time from that start to the last process's end (imports and connections
not counted; a relay's or a worker's own start, e.g. registering a worker, is).
Each side ends checked by SQL: every business row has its event (outbox_event rows, or
procrastinate_jobs 'todo'), and after a drain every event is 'published' / every job
'succeeded'. The sides take turns (A B, B A, …) for ``--rounds`` rounds; printed: each side's
median and spread (min-max), the median of the rounds' own ratios outbox_lite / peer, and the
load average (the machine's 2 cores are shared).

procrastinate is no dependency of the project: it runs in a venv of its own (``--peers-python``,
default ``$OUTBOX_PEERS_PYTHON`` or ``/tmp/peers-venv/bin/python``), which this script creates
when that default is missing (``procrastinate==3.10.0`` and the project's own psycopg version),
and the peer's processes are that interpreter running this file. Each side has a database of its
own on the server, ``<database>_bench_peers`` and ``<database>_bench_peers_procrastinate``,
created before and dropped after.

Usage: python scripts/bench.py peers [--database-url URL] [--peers-python PATH]
       [--processes 1 --processes 4] [--writes 1000] [--events 20000] [--batch 100]
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
import uuid
from pathlib import Path
from typing import Any, Callable

# Nothing of outbox_lite at import time: the peer's processes run this file under an
# interpreter that has procrastinate and not outbox_lite.
from ._setup import PAYLOAD, add_database_option, add_sizes, load

ENTRY = Path(__file__).resolve().parent.parent / "bench.py"
ROOT = ENTRY.parent.parent
POSTGRESQL = "postgresql://postgres@127.0.0.1:5432/outbox_lite_test"
PEERS_PYTHON = "/tmp/peers-venv/bin/python"
PROCRASTINATE = "procrastinate==3.10.0"
QUEUE = "peers"
#: Writes each process makes before the start (connection, statements, schema caches).
WARM = 3
SIDES = ("outbox_lite", "procrastinate")
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
    for n in range(WARM):
        write(n)
    start = _ready_then_go()
    for n in range(WARM, WARM + writes):
        write(n)
    _done(start, writes)
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
    for n in range(WARM):
        write(n)
    start = _ready_then_go()
    for n in range(WARM, WARM + writes):
        write(n)
    _done(start, writes)
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


ROLES: dict[str, Callable[..., None]] = {"_library_write": _library_write, "_library_drain": _library_drain,
         "_procrastinate_schema": _procrastinate_schema,
         "_procrastinate_seed": _procrastinate_seed,
         "_procrastinate_write": _procrastinate_write,
         "_procrastinate_drain": _procrastinate_drain}


# ---------------------------------------------------------------------------
# The parent: databases, seeding, starting the processes together, checking
# ---------------------------------------------------------------------------

def peers_python(option: str | None) -> str:
    """The peer's interpreter; the default venv is created when missing."""
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


def peer_versions(python: str) -> dict[str, str]:
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m, json, psycopg, sys;"
         " print(json.dumps({'procrastinate': m.version('procrastinate'),"
         " 'psycopg': psycopg.__version__ + ' ' + psycopg.pq.__impl__,"
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


class Peers:
    def __init__(self, library_url: Any, peer_url: Any, python: str, *, batch: int) -> None:
        self.library_url, self.peer_url, self.python, self.batch = (
            library_url, peer_url, python, batch)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT),
                    **({"PGPASSWORD": peer_url.password} if peer_url.password else {})}

    def sql(self, url: Any, statement: str) -> list[tuple[Any, ...]]:
        from . import raw_pg

        conn = raw_pg.connect(url)
        try:
            cur = conn.execute(statement)
            return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def _command(self, side: str, role: str, *args: str) -> list[str]:
        python = sys.executable if side == "outbox_lite" else self.python
        return [python, str(ENTRY), "peers", role, *args]

    def reset(self, side: str) -> None:
        if side == "outbox_lite":
            self.sql(self.library_url, "TRUNCATE job, outbox_event RESTART IDENTITY")
        else:
            self.sql(self.peer_url, "TRUNCATE job, procrastinate_jobs RESTART IDENTITY CASCADE")

    def together(self, commands: list[list[str]]) -> float:
        """Start ``commands``, let them all go once each is ready; the seconds from the first
        start to the last end, by their own clocks."""
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
            seconds = self.together([self._command(side, "_procrastinate_write",
                                                   conninfo(self.peer_url), str(writes),
                                                   f"w{i}") for i in range(processes)])
            [(rows, events, matched)] = self.sql(
                self.peer_url, "SELECT (SELECT COUNT(*) FROM job),"
                " (SELECT COUNT(*) FROM procrastinate_jobs WHERE status = 'todo'),"
                " (SELECT COUNT(*) FROM job JOIN procrastinate_jobs p"
                "  ON (p.args->>'job_id')::bigint = job.id)")
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
            subprocess.run(self._command(side, "_procrastinate_seed", conninfo(self.peer_url),
                                         str(events)), env=self.env, check=True)
            self.sql(self.peer_url, "ANALYZE procrastinate_jobs")

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
        event published, every job succeeded."""
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
            seconds = self.together([self._command(side, "_procrastinate_drain",
                                                   conninfo(self.peer_url), f"worker-{i}")
                                     for i in range(processes)])
            [(done, left)] = self.sql(
                self.peer_url, "SELECT COUNT(*) FILTER (WHERE status = 'succeeded'),"
                " COUNT(*) FILTER (WHERE status <> 'succeeded') FROM procrastinate_jobs")
        if done != events or left:
            raise AssertionError(f"{side} drain: {done} done, {left} not, of {events}")
        return events / seconds


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "rounds": values}


def measure(peers: Peers, kind: str, processes: int, rounds: int, size: int,
            ) -> dict[str, Any]:
    """``rounds`` of both sides taking turns; each side's spread and the rounds' ratios."""
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            rate = (peers.writes(side, processes, size) if kind == "writes"
                    else peers.drain(side, processes, size))
            rates[side].append(rate)
            print(f"round {r + 1} {kind} x{processes} {side}: {rate:,.0f}/s (load {load()})",
                  file=sys.stderr, flush=True)
    ratios = [a / b for a, b in zip(rates["outbox_lite"], rates["procrastinate"])]
    return {"measure": kind, "processes": processes, "size": size,
            **{side: spread(values) for side, values in rates.items()},
            "ratio": spread(ratios), "load_average": list(os.getloadavg())}


def format_table(report: dict[str, Any]) -> str:
    v = report["versions"]
    lines = [f"{report['server']}; outbox_lite {v['library']['outbox_lite']} (Peewee"
             f" {v['library']['peewee']}, psycopg {v['library']['psycopg']}) beside"
             f" procrastinate {v['peer']['procrastinate']} (psycopg {v['peer']['psycopg']});"
             f" {report['rounds']} rounds, median (min-max)",
             f"  {'measure':<22} {'outbox_lite':>24} {'procrastinate':>24}"
             f" {'ratio':>18} {'load':>5}"]

    def cell(s: dict[str, Any], fmt: str) -> str:
        return (f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})")

    for m in report["measures"]:
        what = (f"writes/s, {m['processes']} proc" if m["measure"] == "writes"
                else f"drained/s, {m['processes']} proc")
        lines.append(f"  {what:<22} {cell(m['outbox_lite'], ',.0f'):>24}"
                     f" {cell(m['procrastinate'], ',.0f'):>24} {cell(m['ratio'], '.2f'):>18}"
                     f" {m['load_average'][0]:>5.2f}")
    lines.append("  (ratio: outbox_lite / procrastinate, the median of the rounds' own ratios;"
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
    parser.add_argument("--processes", type=int, action="append",
                        help="writer and worker processes per side, each given in turn"
                             " (default: 1 and 4)")
    add_sizes(parser, rounds=3, events=(20_000, "events in the backlog drained"),
              batch=(100, "outbox_lite's events per claim"),
              writes=(1000, "writes per writer process"))
    parser.add_argument("--only", choices=MEASURES, action="append",
                        help="run only this measure (default: both)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)

    from ._setup import scratch_database, server_name, server_url

    base = server_url(args.database_url or POSTGRESQL)
    if str(base.scheme) != "postgresql":
        parser.error("the peers run on PostgreSQL: give a postgresql:// URL")
    python = peers_python(args.peers_python)
    report: dict[str, Any] = {
        "server": server_name(base), "rounds": args.rounds, "batch": args.batch,
        "versions": {"library": library_versions(), "peer": peer_versions(python)},
        "load_average_at_start": list(os.getloadavg()), "measures": []}
    peer_url = base.with_name(f"{base.name}_bench_peers_procrastinate")
    with scratch_database(base, "bench_peers",
                          "CREATE TABLE job (id BIGSERIAL PRIMARY KEY,"
                          " name VARCHAR(64) NOT NULL)") as library_url:
        try:
            peer_url.drop_database()
            peer_url.create_database()
            peers = Peers(library_url, peer_url, python, batch=args.batch)
            subprocess.run(peers._command("procrastinate", "_procrastinate_schema",
                                          conninfo(peer_url)), env=peers.env, check=True)
            peers.sql(peer_url, "CREATE TABLE job (id BIGSERIAL PRIMARY KEY,"
                                " name VARCHAR(64) NOT NULL)")
            for kind in args.only or MEASURES:
                for processes in args.processes or [1, 4]:
                    report["measures"].append(measure(
                        peers, kind, processes, args.rounds,
                        args.writes if kind == "writes" else args.events))
        finally:
            peer_url.drop_database()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(format_table(report))
    return 0
