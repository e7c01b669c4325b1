"""What each one-round-trip form of the keyed write locks at REPEATABLE READ, on MySQL and MariaDB
(issue 30's item 2): the evidence for ``mysql_sql.INSERT_UNLESS_TAKEN``'s note.

For each candidate, keys ``k2 < k5 < k8`` are committed; a first transaction at REPEATABLE
READ sends the candidate for the committed key ``k5`` (a refused duplicate) or for the new key
``k6``, and stays open; then a second writer, on a connection of its own with
``innodb_lock_wait_timeout = 1``, inserts each probe key (``k1`` far before, ``k4`` in the gap
before ``k5``, ``k6``/``k7`` after it, ``k9`` past the last key) in a transaction of its own
and rolls it back: ``ok`` when the INSERT went through, ``wait`` when it waited the second
out (1205) or ``deadlock``. MySQL's ``performance_schema.data_locks`` lists the first
transaction's locks (index, mode, the record); MariaDB has no such table: its
``information_schema.INNODB_TRX`` gives the count of lock structures and rows locked.

    python scripts/bench.py write-locks [--database-url URL ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import pymysql
from pymysql.constants.CLIENT import MULTI_STATEMENTS

from ._setup import scratch_database

DEFAULT_URLS = ["mysql://root@127.0.0.1:3306/outbox_lite",
                "mysql://root@127.0.0.1:3308/outbox_lite"]
PROBES = ("k1", "k4", "k6", "k7", "k9")
_COLUMNS = ("event_type, aggregate_type, aggregate_id, dedupe_key, payload, status,"
            " attempt_count, available_at, created_at, updated_at")
_VALUES = "'e', 'a', '1', %s, '{}', 'pending', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)"
INSERT = f"INSERT INTO outbox_event ({_COLUMNS}) VALUES ({_VALUES})"
_TAKEN_INSERT = INSERT.replace("'pending'", "IF(@taken = 0, 'pending', NULL)", 1)
#: Each candidate: what the first transaction sends for its key (in order, one round trip
#: each, except where the name says one packet: several statements sent together on a connection
#: that allows multiple statements).
CANDIDATES: dict[str, list[str]] = {
    "read, then INSERT (today, 2 round trips)": [
        "SELECT id FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key)"
        " WHERE dedupe_key = %s", INSERT],
    "plain INSERT": [INSERT],
    "INSERT ... SELECT ... WHERE NOT EXISTS": [
        f"INSERT INTO outbox_event ({_COLUMNS}) SELECT {_VALUES} FROM DUAL WHERE NOT EXISTS"
        " (SELECT 1 FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key)"
        " WHERE dedupe_key = %s)"],
    "INSERT IGNORE": [INSERT.replace("INSERT", "INSERT IGNORE", 1)],
    "INSERT ... ON DUPLICATE KEY UPDATE id = id": [INSERT + " ON DUPLICATE KEY UPDATE id = id"],
    # One packet of two statements (a connection with CLIENT.MULTI_STATEMENTS): the read
    # carried to the INSERT by a session variable; a taken key makes status NULL (1048).
    "SELECT ... INTO @v; INSERT ... IF(@v = 0, 'pending', NULL) (one packet, the library's)": [
        "SELECT COUNT(*) FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key)"
        " WHERE dedupe_key = %s INTO @taken; " + _TAKEN_INSERT],
    "SET @v = (SELECT ...); INSERT ... (one packet)": [
        "SET @taken = (SELECT COUNT(*) FROM outbox_event FORCE INDEX"
        " (uq_outbox_event_dedupe_key) WHERE dedupe_key = %s); " + _TAKEN_INSERT],
    "INSERT ... VALUES (..., IF((SELECT ...) ...)) (MySQL refuses the same table: a derived one)": [
        INSERT.replace("'pending'", "IF((SELECT COUNT(*) FROM (SELECT 1 FROM outbox_event"
                       " FORCE INDEX (uq_outbox_event_dedupe_key) WHERE dedupe_key = %s"
                       " LIMIT 1) AS taken) = 0, 'pending', NULL)", 1)],
}


def _connect(url: Any) -> Any:
    return pymysql.connect(host=url.host, port=url.port, user=url.user, password=url.password,
                           database=url.name, charset="utf8mb4", autocommit=True,
                           ssl_disabled=True, client_flag=MULTI_STATEMENTS)


def _locks(watch: Any, conn: Any, mariadb: bool) -> list[str] | dict[str, int]:
    with watch.cursor() as cur:
        if mariadb:
            cur.execute("SELECT trx_lock_structs, trx_rows_locked FROM"
                        " information_schema.INNODB_TRX WHERE trx_mysql_thread_id = %s",
                        (conn.thread_id(),))
            row = cur.fetchone()
            return {"lock_structs": int(row[0]), "rows_locked": int(row[1])} if row else {}
        cur.execute("SELECT l.index_name, l.lock_mode, l.lock_data FROM"
                    " performance_schema.data_locks l JOIN performance_schema.threads t"
                    " ON t.thread_id = l.thread_id WHERE t.processlist_id = %s"
                    " AND l.lock_type = 'RECORD' ORDER BY l.index_name, l.lock_data",
                    (conn.thread_id(),))
        return [f"{index} {mode} {data}" for index, mode, data in cur.fetchall()]


def _probe(url: Any, key: str) -> str:
    conn = _connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.begin()
            try:
                cur.execute(INSERT, (f"{key}-{os.getpid()}",))
                return "ok"
            except pymysql.MySQLError as exc:
                return {1205: "wait", 1213: "deadlock"}.get(exc.args[0], str(exc.args[0]))
            finally:
                conn.rollback()
    finally:
        conn.close()


def measure(url: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    watch = _connect(url)
    with watch.cursor() as cur:
        cur.execute("SELECT VERSION()")
        version = str(cur.fetchone()[0])
        for key in ("k2", "k5", "k8"):
            cur.execute(INSERT, (key,))
    mariadb = "mariadb" in version.lower()
    for name, statements in CANDIDATES.items():
        for key in ("k5", "k6"):
            conn = _connect(url)
            with conn.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                conn.begin()
                outcome = "written"
                for statement in statements:
                    params = (key,) * statement.count("%s")
                    try:
                        cur.execute(statement, params)
                        while cur.nextset():  # a packet of several: each result read
                            pass
                    except pymysql.MySQLError as exc:
                        outcome = f"refused ({exc.args[0]})"
                        break
                    if statement.startswith("SELECT"):
                        if cur.fetchone() is not None:
                            outcome = "found: no INSERT sent"
                            break
                    elif cur.rowcount != 1:
                        outcome = f"{cur.rowcount} rows"
                held = _locks(watch, conn, mariadb)
                probes = {probe: _probe(url, probe) for probe in PROBES}
                conn.rollback()
            conn.close()
            found[f"{name} | {key}"] = {"outcome": outcome, "locks": held, "probes": probes}
    watch.close()
    return {"server": version, "candidates": found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", action="append", dest="urls")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = []
    for text in args.urls or DEFAULT_URLS:
        with scratch_database(text, f"write_locks_{os.getpid()}") as url:
            results.append(measure(url))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for result in results:
        print(f"== {result['server']}")
        for name, seen in result["candidates"].items():
            probes = " ".join(f"{k}:{v}" for k, v in seen["probes"].items())
            print(f"{name}: {seen['outcome']}; second writer {probes}")
            print(f"    locks: {seen['locks']}")
    return 0
