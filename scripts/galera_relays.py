#!/usr/bin/env python3
"""Issue 36's table on a real Galera cluster: ``outbox-lite relay`` processes on the nodes of
the cluster that scripts/galera.sh started, tried as an operator would.

The database (``--database``, default outbox_galera) is dropped and made again with
``outbox-lite migrate --database-url`` on node 1; the outbox is emptied before each run. Each
run seeds ``--events`` events up front (writer processes, ``--seed-per-transaction`` events per
``db.atomic()``), then starts ``outbox-lite relay --until-empty --publisher
galera_publisher:recorder`` processes, a publisher that never fails and counts every publish
of every event in a Redis hash (scripts/galera_publisher.py). The cases, as in the issue:

1. three relays, one per node, no writers (everything seeded up front);
2. three relays, one per node, while writers on every node write ``--writer-events`` more
   events (one per transaction, as a service writes them);
3. ONE relay on node 1 while writers on nodes 2 and 3 write ``--writer-events`` more.

Writers use ``OutboxRepository.create_in_transaction`` inside ``db.atomic()`` and retry as the
producing guide's loop does (DuplicateEventError: an earlier attempt committed; a connection
error: reconnect) and, for a cluster, on LockConflictError and on a COMMIT refused with
Peewee's OperationalError 1213 (Galera's certification failure), each counted.

A relay that exits 0 (the outbox was empty) while writers still write is started again, as
a service's supervisor would; a relay that dies (exit status other than 0) is not: that is
what the table counts. Each relay has ``--deadline`` seconds (counted from the writers' end),
then SIGTERM, then SIGKILL 15 s later. After every process has ended, the outbox is read on
node 1 and the Redis hash compared with it. Printed as Markdown (``--json`` for the raw rows).

Usage: python scripts/galera_relays.py [--case 1|2|3 ...] [--rounds 1] [--events 20000]
       [--writer-events 20000] [--batch-size 100] [--lock-timeout 300] [--deadline 120]
       [--urls "URL URL URL"] [--database outbox_galera] [--redis-url redis://127.0.0.1:6379/0]
The node URLs come from --urls, else $OUTBOX_GALERA_URLS, else ``scripts/galera.sh urls``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
sys.path.insert(0, str(CHECKOUT))

PUBLISHER = "galera_publisher:recorder"
CASES = {
    1: "3 relays, one per node, no writers",
    2: "3 relays, one per node, writers on every node",
    3: "ONE relay on node 1, writers on nodes 2 and 3",
    4: "ONE relay on node 1, no writers",
    5: "2 relays, on nodes 1 and 2, no writers",
}
RELAY_NODES = {1: [1, 2, 3], 2: [1, 2, 3], 3: [1], 4: [1], 5: [1, 2]}
WRITER_NODES = {1: [1, 2, 3], 2: [1, 2, 3], 3: [2, 3], 4: [1, 2, 3], 5: [1, 2, 3]}


# -- the nodes and the database --

def node_urls(args: argparse.Namespace) -> list[str]:
    given = args.urls or os.environ.get("OUTBOX_GALERA_URLS")
    if given:
        urls = given.split()
    else:
        out = subprocess.run([str(HERE / "galera.sh"), "urls", args.database], check=True,
                             capture_output=True, text=True).stdout
        urls = out.split()
    if len(urls) < 3:
        sys.exit(f"galera_relays: needs 3 nodes, got {len(urls)}: {urls}"
                 " (start them with scripts/galera.sh start)")
    # the same database on every node
    return [urllib.parse.urlsplit(u)._replace(path="/" + args.database).geturl() for u in urls]


def connect(url: str, database: str | None = "") -> Any:
    import peewee

    parts = urllib.parse.urlsplit(url)
    name = parts.path.lstrip("/") if database == "" else database
    return peewee.MySQLDatabase(name, host=parts.hostname or "127.0.0.1",
                                port=parts.port or 3306,
                                user=urllib.parse.unquote(parts.username or "root"),
                                password=urllib.parse.unquote(parts.password or ""),
                                charset="utf8mb4")


def outbox_lite_command() -> list[str]:
    script = Path(sys.executable).with_name("outbox-lite")
    if script.exists():
        return [str(script)]
    found = shutil.which("outbox-lite")
    return [found] if found else [sys.executable, "-m", "outbox_lite.cli"]


def prepare(urls: list[str], name: str) -> None:
    """Drop the database and make it again with the command an operator runs."""
    server = connect(urls[0], "mysql")
    server.connect()
    server.execute_sql(f"DROP DATABASE IF EXISTS `{name}`")
    server.close()
    subprocess.run([*outbox_lite_command(), "migrate", "--database-url", urls[0]], check=True,
                   stdout=subprocess.DEVNULL)


def empty_outbox(url: str) -> None:
    db = connect(url)
    db.connect()
    db.execute_sql("TRUNCATE TABLE outbox_event")
    db.close()


def outbox_counts(url: str) -> dict[str, int]:
    db = connect(url)
    db.connect()
    rows = db.execute_sql("SELECT status, COUNT(*) FROM outbox_event GROUP BY status").fetchall()
    db.close()
    return {status: int(n) for status, n in rows}


def conflict_counters(urls: list[str]) -> dict[str, int]:
    """Galera's own counts, summed over the nodes: COMMITs refused by certification
    (wsrep_local_cert_failures) and local transactions aborted by a replicated one
    (wsrep_local_bf_aborts). The relay does not count its conflicts where one can read
    them, so these are the run's conflict counts (a writer's, a relay's and ours alike)."""
    total = {"cert_failures": 0, "bf_aborts": 0}
    for url in urls:
        db = connect(url, "mysql")
        db.connect()
        rows = db.execute_sql("SHOW GLOBAL STATUS WHERE Variable_name IN"
                              " ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')").fetchall()
        db.close()
        for name, value in rows:
            key = "cert_failures" if name.lower().endswith("cert_failures") else "bf_aborts"
            total[key] += int(value)
        try:  # Group Replication: the transactions this member's certification refused
            db.connect()
            row = db.execute_sql(
                "SELECT COUNT_CONFLICTS_DETECTED FROM performance_schema."
                "replication_group_member_stats WHERE MEMBER_ID = @@server_uuid").fetchone()
            total["cert_failures"] += int(row[0]) if row else 0
        except Exception:  # noqa: BLE001 - not a Group Replication member
            pass
        finally:
            db.close()
    return total


def published_ids(url: str) -> set[int]:
    db = connect(url)
    db.connect()
    rows = db.execute_sql("SELECT id FROM outbox_event WHERE status = 'published'").fetchall()
    db.close()
    return {int(r[0]) for r in rows}


# -- writers (a process each: python galera_relays.py _write ...) --

def write(url: str, tag: str, first: int, count: int, per_transaction: int) -> dict[str, Any]:
    """Write events first..first+count-1 in transactions of per_transaction events, retrying
    as a service would; returns what happened."""
    import peewee

    from outbox_lite import (CONNECTION_ERRORS, DuplicateEventError, LockConflictError,
                             OutboxRepository, is_retryable, reconnect)

    db = connect(url)
    outbox = OutboxRepository(db)
    out: dict[str, Any] = {"written": 0, "lock_conflicts": 0, "commit_refused": 0,
                           "duplicates": 0, "connection_errors": 0, "gave_up": 0, "other": {}}
    started = time.monotonic()
    k = first
    end = first + count
    while k < end:
        keys = range(k, min(k + per_transaction, end))
        for attempt in range(100):
            try:
                with db.atomic():
                    for n in keys:
                        outbox.create_in_transaction(
                            event_type="galera.test", aggregate_type="galera",
                            aggregate_id=str(n), payload={"n": n},
                            dedupe_key=f"{tag}:{n}")
            except DuplicateEventError:
                out["duplicates"] += 1  # an earlier attempt committed
                break
            except LockConflictError:
                out["lock_conflicts"] += 1
                time.sleep(0.01 * min(attempt + 1, 10))
            except peewee.OperationalError as exc:
                code = exc.args[0] if exc.args else None
                if is_retryable(exc):  # the cluster refused the COMMIT (1213, 3101, 1180)
                    out["commit_refused"] += 1
                    time.sleep(0.01 * min(attempt + 1, 10))
                    continue
                out["connection_errors"] += 1
                key = f"{code} {exc.args[1] if len(exc.args) > 1 else ''}"[:80]
                out["other"][key] = out["other"].get(key, 0) + 1
                time.sleep(0.5)
                reconnect(db)
            except CONNECTION_ERRORS as exc:
                out["connection_errors"] += 1
                key = f"{type(exc).__name__}: {exc}"[:80]
                out["other"][key] = out["other"].get(key, 0) + 1
                time.sleep(0.5)
                reconnect(db)
            else:
                out["written"] += len(keys)
                break
        else:
            out["gave_up"] += len(keys)
        k += per_transaction
    db.close()
    out["seconds"] = round(time.monotonic() - started, 2)
    return out


def start_writers(urls: list[str], nodes: list[int], tag: str, first: int, total: int,
                  per_transaction: int) -> list[subprocess.Popen[str]]:
    """Writer processes, one per node given, sharing total events between them."""
    procs = []
    share, extra = divmod(total, len(nodes))
    for i, node in enumerate(nodes):
        count = share + (1 if i < extra else 0)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "_write", urls[node - 1], tag, str(first), str(count),
             str(per_transaction)], stdout=subprocess.PIPE, text=True))
        first += count
    return procs


def finish_writers(procs: list[subprocess.Popen[str]]) -> dict[str, Any]:
    total: dict[str, Any] = {"written": 0, "lock_conflicts": 0, "commit_refused": 0,
                             "duplicates": 0, "connection_errors": 0, "gave_up": 0,
                             "other": {}, "seconds": 0.0, "failed": 0}
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            total["failed"] += 1
            continue
        got = json.loads(out.strip().splitlines()[-1])
        for key in ("written", "lock_conflicts", "commit_refused", "duplicates",
                    "connection_errors", "gave_up"):
            total[key] += got[key]
        for key, n in got["other"].items():
            total["other"][key] = total["other"].get(key, 0) + n
        total["seconds"] = max(total["seconds"], got["seconds"])
    return total


# -- relays --

@dataclass
class Launch:
    node: int
    at: float = 0.0  # started, seconds after the relays of the run
    rc: int | None = None
    seconds: float = 0.0
    last_line: str = ""
    published: int = 0
    conflict_lines: int = 0
    lock_conflicts: int = 0  # the relay's own count, from its last progress line
    timed_out: bool = False


@dataclass
class Slot:
    """One relay on one node, started again when it exits 0 while writers still write."""

    node: int
    launches: list[Launch] = field(default_factory=list)

    @property
    def died(self) -> Launch | None:
        last = self.launches[-1] if self.launches else None
        return last if last is not None and last.rc != 0 else None


PROGRESS = re.compile(r": (\d+) published, ")
CONFLICTS = re.compile(r"(\d+) lock conflicts")


def run_relay(slot: Slot, url: str, args: argparse.Namespace, env: dict[str, str], logdir: Path,
              writers_done: threading.Event, done_at: list[float], pending: Any,
              t0: float) -> None:
    n = 0
    while True:
        n += 1
        log = logdir / f"relay-node{slot.node}-{n}.log"
        started = time.monotonic()
        launch = Launch(slot.node, at=round(started - t0, 1))
        slot.launches.append(launch)
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [*outbox_lite_command(), "relay", "--database-url", url, "--publisher", PUBLISHER,
                 "--until-empty", "--batch-size", str(args.batch_size),
                 "--lock-timeout", str(args.lock_timeout),
                 "--worker-id", f"galera-node{slot.node}-{n}", "--progress-every", "5"],
                stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT, env=env,
                cwd=HERE)
            while proc.poll() is None:
                base = done_at[0] if writers_done.is_set() else time.monotonic()
                if time.monotonic() > max(base, started) + args.deadline:
                    launch.timed_out = True
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                    break
                time.sleep(0.2)
        launch.rc = proc.returncode
        launch.seconds = round(time.monotonic() - started, 1)
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()
                 if line.strip()]
        launch.last_line = lines[-1] if lines else ""
        launch.conflict_lines = sum("conflict" in line.lower() for line in lines)
        for line in reversed(lines):
            m = PROGRESS.search(line)
            if m:
                launch.published = int(m.group(1))
                c = CONFLICTS.search(line)
                launch.lock_conflicts = int(c.group(1)) if c else 0
                break
        if launch.rc != 0 or launch.timed_out:
            return
        if writers_done.is_set() and pending() == 0:
            return
        time.sleep(0.2)  # exited empty while writers still write: start it again


# -- one run --

def run_case(case: int, round_no: int, urls: list[str], args: argparse.Namespace,
             logroot: Path) -> dict[str, Any]:
    import redis

    tag = f"c{case}r{round_no}-{uuid.uuid4().hex[:8]}"
    key = f"outbox_galera:{tag}"
    logdir = logroot / tag
    logdir.mkdir(parents=True)
    empty_outbox(urls[0])
    relay_nodes = RELAY_NODES[case]
    writer_nodes = WRITER_NODES[case]  # the seed's; the writers', cases 2 and 3
    writer_events = args.writer_events if case in (2, 3) else 0

    t0 = time.monotonic()
    seed = finish_writers(start_writers(urls, writer_nodes, tag, 0, args.events,
                                        args.seed_per_transaction))
    seed_seconds = round(time.monotonic() - t0, 1)

    env = dict(os.environ, OUTBOX_GALERA_REDIS_KEY=key, OUTBOX_GALERA_REDIS_URL=args.redis_url,
               PYTHONPATH=os.pathsep.join([str(HERE), str(CHECKOUT),
                                           os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    writers_done = threading.Event()
    done_at = [0.0]

    def pending() -> int:
        return outbox_counts(urls[0]).get("pending", 0)

    slots = [Slot(node) for node in relay_nodes]
    before = conflict_counters(urls)
    started = time.monotonic()
    writers = (start_writers(urls, writer_nodes, tag, args.events, writer_events, 1)
               if writer_events else [])
    threads = [threading.Thread(target=run_relay,
                                args=(slot, urls[slot.node - 1], args, env, logdir,
                                      writers_done, done_at, pending, started))
               for slot in slots]
    for t in threads:
        t.start()
    wrote = finish_writers(writers)
    done_at[0] = time.monotonic()
    writers_done.set()
    for t in threads:
        t.join()
    seconds = round(time.monotonic() - started, 1)
    after = conflict_counters(urls)

    counts = outbox_counts(urls[0])
    in_db = published_ids(urls[0])
    r = redis.Redis.from_url(args.redis_url)
    at_publisher = {int(k): int(v) for k, v in r.hgetall(key).items()}
    r.delete(key)
    twice = sum(1 for v in at_publisher.values() if v > 1)
    dead = [slot.died for slot in slots if slot.died is not None]
    return {
        "case": case, "round": round_no, "tag": tag, "logs": str(logdir),
        "relays": len(slots), "launches": sum(len(s.launches) for s in slots),
        "dead": [{"node": d.node, "rc": d.rc, "after_s": d.seconds,
                  "at_s": round(d.at + d.seconds, 1), "timed_out": d.timed_out,
                  "last_line": d.last_line} for d in dead],
        "events_written": seed["written"] + wrote["written"],
        "seed": seed, "seed_seconds": seed_seconds, "writers": wrote,
        "left": counts.get("pending", 0) + counts.get("processing", 0),
        "pending": counts.get("pending", 0), "processing": counts.get("processing", 0),
        "failed": counts.get("failed", 0),
        "published_db": counts.get("published", 0),
        "published_at_publisher": len(at_publisher),
        "publishes": sum(at_publisher.values()),
        "published_twice": twice,
        "recorded_never_published": len(in_db - set(at_publisher)),
        "published_not_recorded": len(set(at_publisher) - in_db),
        "relay_published_lines": sum(launch.published for s in slots for launch in s.launches),
        "relay_conflict_lines": sum(launch.conflict_lines for s in slots for launch in s.launches),
        "relay_lock_conflicts": sum(launch.lock_conflicts for s in slots for launch in s.launches),
        "events_per_s": round(len(at_publisher) / seconds) if seconds else 0,
        "cert_failures": after["cert_failures"] - before["cert_failures"],
        "bf_aborts": after["bf_aborts"] - before["bf_aborts"],
        "seconds": seconds,
    }


def per_thousand(n: int, events: int) -> str:
    return f"{1000 * n / events:.1f}" if events else "-"


def markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| case | round | relays that died | events written | left unpublished"
           " (pending+processing) | published: DB / publisher / publishes | published twice"
           " | writers' conflicts (LockConflictError / COMMIT refused) | relays' lock conflicts"
           " | cluster: cert failures / BF aborts (per 1,000 events) | seconds | events/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        dead = r["dead"]
        died = f"{len(dead)} of {r['relays']}"
        if dead:
            died += " (" + ", ".join(
                f"node {d['node']} {'timed out' if d['timed_out'] else 'exit ' + str(d['rc'])}"
                f" after {d['after_s']} s (at {d['at_s']} s)" for d in dead) + ")"
        if r["launches"] > r["relays"]:
            died += f"; {r['launches']} launches"
        w = r["writers"]
        s = r["seed"]
        out.append(
            f"| {r['case']} | {r['round']} | {died} | {r['events_written']:,} | "
            f"{r['left']:,} ({r['pending']:,}+{r['processing']:,}) | "
            f"{r['published_db']:,} / {r['published_at_publisher']:,} / {r['publishes']:,} | "
            f"{r['published_twice']:,} | "
            f"{s['lock_conflicts'] + w['lock_conflicts']} / "
            f"{s['commit_refused'] + w['commit_refused']} | {r['relay_lock_conflicts']} | "
            f"{r['cert_failures']} / {r['bf_aborts']} "
            f"({per_thousand(r['cert_failures'] + r['bf_aborts'], r['events_written'])}) | "
            f"{r['seconds']} | {r['events_per_s']:,} |")
    lines = sorted({d["last_line"] for r in rows for d in r["dead"]})
    if lines:
        out += ["", "Last stderr line of each dead relay (distinct):", ""]
        out += [f"- `{line}`" for line in lines]
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", type=int, choices=sorted(CASES), action="append",
                   help="which case (repeatable; default: all three)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each case (default 1)")
    p.add_argument("--events", type=int, default=20000,
                   help="events seeded before the relays start (default 20000)")
    p.add_argument("--writer-events", type=int, default=20000,
                   help="events the writers write while the relays run, cases 2 and 3"
                        " (default 20000)")
    p.add_argument("--seed-per-transaction", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lock-timeout", type=float, default=300)
    p.add_argument("--deadline", type=float, default=120,
                   help="seconds a relay may run after the writers finished (default 120)")
    p.add_argument("--urls", help="the nodes' URLs, separated by spaces")
    p.add_argument("--database", default="outbox_galera")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--logs", default="/var/tmp/outbox-lite-galera-runs",
                   help="the relays' stderr, one folder per run")
    p.add_argument("--json", action="store_true", help="print the rows as JSON too")
    return p


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_write":
        url, tag, first, count, per = sys.argv[2:7]
        print(json.dumps(write(url, tag, int(first), int(count), int(per))), flush=True)
        return
    args = parser().parse_args()
    urls = node_urls(args)
    prepare(urls, args.database)
    rows = []
    for case in args.case or sorted(CASES):
        for round_no in range(1, args.rounds + 1):
            row = run_case(case, round_no, urls, args, Path(args.logs))
            rows.append(row)
            print(f"galera_relays: case {case} round {round_no}: {len(row['dead'])} of"
                  f" {row['relays']} relays dead, {row['left']} left, {row['published_twice']}"
                  f" twice, {row['seconds']} s (logs: {row['logs']})", file=sys.stderr,
                  flush=True)
    print("Cases: " + "; ".join(f"{c}. {CASES[c]}" for c in sorted({r['case'] for r in rows}))
          + f". {args.events:,} events seeded first; cases 2 and 3 write {args.writer_events:,}"
          f" more while the relays run. Batch {args.batch_size}, lock timeout"
          f" {args.lock_timeout:g} s.\n")
    print(markdown(rows))
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
