"""Where the client's time goes, in figures the machine's load does not move: CPU instructions
and statements per event, the library against its raw-driver twin, on each server.

    python scripts/bench.py instructions [--database-url URL ...] [--writes 200]
                                         [--batches 10] [--repeat 2] [--json]

Two paths, each side in processes of its own under ``valgrind --tool=callgrind`` (which
counts the instructions the process executes, whatever else the machine does; ``perf stat
-e instructions:u`` is not supported on this machine's kernel):

* ``write``: a business INSERT plus ``create_in_transaction(..., dedupe_key=...)`` in
  ``database.atomic()``, against raw PyMySQL (or psycopg 3 sending the library's own
  ``INSERT … ON CONFLICT (dedupe_key) DO NOTHING``) doing BEGIN, the same business INSERT,
  the event's INSERT, COMMIT: ``write``'s library and raw clients;
* ``claim``: the relay draining batches of 100 (``Relay.run(until_empty=True)`` with a
  publisher that publishes nothing and fails nothing: claim, hand-off, record, each batch's
  outcomes recorded with the next claim), against the raw twin of ``relay`` (the library's
  claim written out in raw_mysql.py / raw_pg.py, the previous batch recorded by one UPDATE
  in the same transaction, each payload decoded), without the broker.

A side's figure is (instructions of a process doing its warm-up and N operations − those of
a process doing the warm-up alone) / events: start-up, imports, connecting and the
per-connection questions cancel out. Both sides talk to the server in clear text (TLS would
add the same cipher work to both). Statements per event are counted on the wire, by the
counting proxy of ``_proxies.py`` (MySQL commands, PostgreSQL Query and Execute messages:
BEGIN and COMMIT count), the same way for both sides, and for the library also through
Peewee's ``peewee`` logger (its statements without BEGIN and COMMIT). ``--repeat`` runs each
count again, to show the spread (callgrind's counts move by a few hundred instructions an
event from run to run: hash seeds, the server's replies).
``--profile`` prints instead the library's top functions on each path by cumulative CPU time
(``cProfile`` timed by ``time.process_time``, with call counts), in this process, without
valgrind.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from outbox_lite._families.url import DatabaseUrl

from . import raw_mysql, raw_pg
from ._proxies import CountingProxy, clear_text
from ._setup import (ALL_THREE, add_database_option, is_postgresql, job_table,
                     scratch_database, server_name, server_url)

ENTRY = Path(__file__).resolve().parent.parent / "bench.py"
WARM = 10  # operations (writes, or batches) before counting: caches, prepared state
BATCH = 100
PATHS = ("write", "claim")
SIDES = ("library", "raw")
#: raw-same: on MySQL and MariaDB, the raw write sending the library's statements at
#: REPEATABLE READ (the lock-free read of the key, then the INSERT); the raw twin already
#: sends them on PostgreSQL and in the claim.
#: packed: on MySQL and MariaDB, the library's write on a connection allowing multiple
#: statements (``multi_statements=true``): the read and the INSERT in one packet.
ALL_SIDES = (*SIDES, "raw-same", "packed")
#: The sides that are writes on MySQL and MariaDB only.
_MYSQL_WRITES = ("raw-same", "packed")


# ---------------------------------------------------------------------------
# The operations: each returns (run(count), close)
# ---------------------------------------------------------------------------

class _Nothing:
    """A publisher that publishes nothing and fails nothing: the relay's own work alone."""

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        return {}

    def close(self) -> None:
        pass


def _writes(side: str, url: DatabaseUrl) -> tuple[Callable[[int], None], Callable[[], None]]:
    from . import write

    # In clear text as the library's side (PyMySQL turns TLS on when the server offers it)
    clear = {} if is_postgresql(url) else {"ssl_disabled": True}
    client = {"library": write.Library, "raw": write.Raw, "raw-same": _RawSame,
              "packed": write.Packed}[side](
        url, {} if side in ("library", "packed") else clear)
    counter = iter(range(10**9))

    def run(count: int) -> None:
        for _ in range(count):
            client.write(next(counter) + os.getpid() * 10**6)

    return run, client.close


class _RawSame:
    """write's raw client, reading the key lock-free before the event's INSERT (MySQL)."""

    name = "raw-same"

    def __init__(self, url: DatabaseUrl, init: dict[str, Any]) -> None:
        from . import write

        self.raw = write.Raw(url, init)
        self.conn, self.row = self.raw.conn, write._row

    def write(self, n: int) -> None:
        from ._setup import EVENT_INSERT, JOB_INSERT

        with self.conn.cursor() as cur:
            self.conn.begin()
            cur.execute(JOB_INSERT["mysql"], (f"raw-{n}",))
            row = self.row(cur.lastrowid, n)
            cur.execute(raw_mysql.DEDUPE_KEY_TAKEN, (row[3],))
            assert cur.fetchone() is None
            cur.execute(EVENT_INSERT, row)
            self.conn.commit()

    def close(self) -> None:
        self.conn.close()


def _drains(side: str, url: DatabaseUrl) -> tuple[Callable[[int], None], Callable[[], None]]:
    """Drain what is pending (``count`` is the parent's: it seeded the batches)."""
    if side == "library":
        from outbox_lite import OutboxRepository
        from outbox_lite.relay import Relay

        database = url.database()
        relay = Relay(OutboxRepository(database), _Nothing(), batch_size=BATCH,
                      progress_every=0, tracing=False, worker_id="instructions")
        return (lambda count: relay.run(until_empty=True)), database.close
    pg = is_postgresql(url)
    raw: Any = raw_pg if pg else raw_mysql
    if pg:
        conn = raw_pg.connect(url)
        begin, commit = (lambda: conn.execute("BEGIN")), (lambda: conn.execute("COMMIT"))
    else:
        import pymysql

        conn = pymysql.connect(host=url.host, port=url.port, user=url.user,
                               password=url.password, database=url.name, charset="utf8mb4",
                               autocommit=True, ssl_disabled=True)  # as the library's side
        begin, commit = conn.begin, conn.commit
    payload = raw_mysql.COLUMNS.index("payload")  # in both twins' rows

    def run(count: int) -> None:
        cur = conn.cursor()
        published: list[int] = []
        while True:  # as relay's raw twin: record the last batch with the next claim
            begin()
            if published:
                raw.publish_many(cur, published, "instructions")
            rows = raw.claim(cur, "instructions", BATCH)
            commit()
            if not rows:
                return
            for row in rows:
                json.loads(row[payload])
            published = [row[0] for row in rows]

    return run, conn.close


OPERATIONS = {"write": _writes, "claim": _drains}


def _child(side: str, path: str, url_text: str, count: int) -> None:
    """The process callgrind counts: connect, warm up, then ``count`` operations."""
    url = DatabaseUrl.parse(url_text)
    run, close = OPERATIONS[path](side, url)
    _operate(path, run, count)
    close()


def _operate(path: str, run: Callable[[int], None], count: int) -> None:
    """The warm-up and ``count`` operations. A drain takes whatever is pending (the parent
    seeded the warm-up's batches and ``count`` more): one drain, so that a process does not
    also pay for a second drain of an empty outbox."""
    if path == "claim":
        run(WARM + count)
        return
    run(WARM)
    if count:
        run(count)


# ---------------------------------------------------------------------------
# The parent: seeding, counting
# ---------------------------------------------------------------------------

class _Runner:
    def __init__(self, url: DatabaseUrl, writes: int, batches: int) -> None:
        from . import protocol

        self.url = clear_text(url)
        self.sizes = {"write": writes, "claim": batches}
        self.admin = protocol.Bench(url, events=0, writes=0, loaded_rows=0, batch=BATCH,
                                    workers=1)

    def _seed(self, path: str, count: int) -> None:
        if path == "claim":
            self.admin.reset()
            self.admin.seed((WARM + count) * BATCH)
            self.admin.sql(self.admin.analyze)

    def events(self, path: str) -> int:
        return self.sizes[path] * (BATCH if path == "claim" else 1)

    def instructions(self, side: str, path: str) -> float:
        """Instructions per event: a process doing the warm-up and N operations, less one
        doing the warm-up alone."""
        totals = []
        for count in (0, self.sizes[path]):
            self._seed(path, count)
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "callgrind.out"
                subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                                sys.executable, str(ENTRY), "instructions", "--child", side,
                                path, self.url.secret_text(), str(count)],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                totals.append(_summary(out.read_text()))
                if count and os.environ.get("OUTBOX_BENCH_KEEP_CALLGRIND"):
                    keep = Path(os.environ["OUTBOX_BENCH_KEEP_CALLGRIND"])
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(out, keep / f"{self.url.port}-{path}-{side}.out")
        return (totals[1] - totals[0]) / self.events(path)

    def statements(self, side: str, path: str) -> dict[str, float]:
        """Statements per event on the wire (and, for the library, in Peewee's log)."""
        proxy = CountingProxy(self.url)
        logged = _PeeweeLog()
        try:
            counts = {}
            for count in (0, self.sizes[path]):
                self._seed(path, count)
                before = proxy.count()
                with logged:
                    run, close = OPERATIONS[path](side, proxy.url)
                    _operate(path, run, count)
                    close()
                counts[count] = (proxy.count() - before, logged.count)
        finally:
            proxy.close()
        (wire0, log0), (wire, log) = counts[0], counts[self.sizes[path]]
        figures = {"wire": (wire - wire0) / self.events(path)}
        if side in ("library", "packed"):
            figures["peewee"] = (log - log0) / self.events(path)
        return figures

    def close(self) -> None:
        self.admin.admin.close()


class _PeeweeLog(logging.Handler):
    """Counts the statements Peewee logs (its ``peewee`` logger, at DEBUG) while in use."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1

    def __enter__(self) -> None:
        self.count = 0
        logger = logging.getLogger("peewee")
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)

    def __exit__(self, *exc: Any) -> None:
        logger = logging.getLogger("peewee")
        logger.removeHandler(self)
        logger.setLevel(self._level)


def _summary(callgrind_out: str) -> int:
    match = re.search(r"^summary: (\d+)", callgrind_out, re.M) or re.search(
        r"^totals: (\d+)", callgrind_out, re.M)
    assert match, "callgrind wrote no summary"
    return int(match.group(1))


def _profile(runner: _Runner, path: str, top: int = 10) -> str:
    """The library's top functions on ``path`` by cumulative time, with call counts."""
    runner._seed(path, runner.sizes[path])
    run, close = OPERATIONS[path]("library", runner.url)
    run(WARM)
    if path == "claim":
        runner._seed(path, runner.sizes[path])
    profiler = cProfile.Profile(time.process_time)  # CPU, not the waits for the server
    profiler.enable()
    run(runner.sizes[path])
    profiler.disable()
    close()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(top + 15)
    return text.getvalue()


def measure(base: DatabaseUrl, writes: int, batches: int, repeat: int,
            profile: bool = False, paths: Sequence[str] = PATHS,
            sides: Sequence[str] = SIDES) -> dict[str, Any]:
    """One server's figures: per path and side, instructions per event (one per repeat) and
    statements per event; with ``profile``, the library's top functions per path instead."""
    if "raw-same" in sides:
        from outbox_lite._families import mysql_sql

        assert (mysql_sql.DEDUPE_KEY_TAKEN.named.replace("%(dedupe_key)s", "%s")
                == raw_mysql.DEDUPE_KEY_TAKEN), "raw_mysql.DEDUPE_KEY_TAKEN is not the library's"
    with scratch_database(base, f"bench_instr_{os.getpid()}", job_table(base)) as url:
        runner = _Runner(url, writes, batches)
        try:
            if profile:
                return {"profile": {path: _profile(runner, path) for path in paths}}
            figures: dict[str, Any] = {}
            for path in paths:
                for side in sides:
                    if side in _MYSQL_WRITES and (path != "write" or is_postgresql(base)):
                        continue
                    figures[f"{path}/{side}"] = {
                        "instructions": [runner.instructions(side, path) for _ in range(repeat)],
                        "statements": runner.statements(side, path)}
        finally:
            runner.close()
    return figures


def format_table(name: str, figures: dict[str, Any]) -> str:
    lines = [f"== {name}",
             f"  {'path':<6} {'library instr/event':>24} {'raw instr/event':>24} {'lib/raw':>7}"
             f" {'statements/event lib (peewee) / raw':>36}"]
    for path in [p for p in PATHS if {f"{p}/library", f"{p}/raw"} <= set(figures)]:
        lib, raw = figures[f"{path}/library"], figures[f"{path}/raw"]

        def cell(counts: list[float]) -> str:
            mean = sum(counts) / len(counts)
            spread = (max(counts) - min(counts)) / mean * 100 if mean else 0.0
            return f"{mean:>12,.0f} ±{spread:.2f} %"

        ratio = sum(lib["instructions"]) / sum(raw["instructions"])
        stmts = (f"{lib['statements']['wire']:.2f} ({lib['statements']['peewee']:.2f})"
                 f" / {raw['statements']['wire']:.2f}")
        lines.append(f"  {path:<6} {cell(lib['instructions']):>24} {cell(raw['instructions']):>24}"
                     f" {ratio:>7.2f} {stmts:>36}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        _child(args[1], args[2], args[3], int(args[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_option(parser, "bench_instr_<pid>", repeat=True)
    parser.add_argument("--writes", type=int, default=200,
                        help="writes counted per process (default 200)")
    parser.add_argument("--batches", type=int, default=10,
                        help="batches of 100 drained per process (default 10)")
    parser.add_argument("--path", choices=PATHS, action="append",
                        help="count only this path (repeatable; default: both)")
    parser.add_argument("--side", choices=ALL_SIDES, action="append",
                        help="count only this side (repeatable; default: library and raw)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="instruction counts per side, to show the spread (default 2)")
    parser.add_argument("--profile", action="store_true",
                        help="instead: the library's top functions per path (cProfile)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    ns = parser.parse_args(args)
    if not ns.profile and shutil.which("valgrind") is None:
        parser.error("needs valgrind (apt-get install valgrind)")
    results = {}
    for option in ns.database_url or ALL_THREE:
        base = server_url(option)
        results[server_name(base, where=False)] = measure(base, ns.writes, ns.batches,
                                                          ns.repeat, ns.profile,
                                                          ns.path or PATHS,
                                                          ns.side or SIDES)
    if ns.json:
        print(json.dumps(results, indent=2))
        return 0
    if ns.profile:
        for name, figures in results.items():
            for path, text in figures["profile"].items():
                print(f"== {name}: the library's {path} path, top functions by cumulative time")
                print(text)
        return 0
    print(f"instructions per event in the client process (callgrind: warm-up + N operations"
          f" less warm-up alone; mean of {ns.repeat} and their spread), statements per event"
          f" on the wire; write: {ns.writes} keyed writes, claim: {ns.batches} batches of"
          f" {BATCH} claimed and recorded")
    for name, figures in results.items():
        print(format_table(name, figures))
    return 0

