"""What the cluster tests share, written once: a fresh outbox seeded on a node, relays run on
threads of their own with every thread's exception kept for the main thread, and a case of
scripts/galera_relays.py run and judged (each event published once, recorded once)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Sequence

from outbox_lite import OutboxRepository
from outbox_lite import migrate as schema
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.relay import Relay


def seed_outbox(url: DatabaseUrl, events: int, *, per_commit: int = 500,
                payload: Any = None) -> Any:
    """``url``'s database made anew (dropped, created, migrated) with ``events`` pending
    events, ``per_commit`` a transaction; returns its open database."""
    url.drop_database()
    url.create_database()
    database = url.database()
    schema.migrate(database)
    repo = OutboxRepository(database)
    for start in range(0, events, per_commit):
        with database.atomic():
            for n in range(start, min(events, start + per_commit)):
                repo.create_in_transaction(
                    event_type="job.created", aggregate_type="job", aggregate_id=str(n),
                    payload={"n": n} if payload is None else payload)
    return database


@contextlib.contextmanager
def running(relays: Sequence[Relay], stops: Sequence[threading.Event] | None = None,
            ) -> Iterator[tuple[list[threading.Thread], list[BaseException]]]:
    """Run each relay on a thread of its own (with its own stop Event of ``stops``, else one
    for all) while the block runs; yields (threads, failures), failures filling with every
    exception a relay's run raised. On the way out: every stop set, every thread joined."""
    stops = list(stops) if stops is not None else [threading.Event()] * len(relays)
    failures: list[BaseException] = []

    def run(relay: Relay, stop: threading.Event) -> None:
        try:
            relay.run(stop)
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=pair, daemon=True)
               for pair in zip(relays, stops)]
    for thread in threads:
        thread.start()
    try:
        yield threads, failures
    finally:
        for stop in stops:
            stop.set()
        for thread in threads:
            thread.join(60)


def run_case(harness: ModuleType, case: int, urls: Sequence[str], database: str,
             tmp_path: Path, *, events: int, writer_events: int) -> dict[str, Any]:
    """One round of scripts/galera_relays.py's ``case`` on the cluster of ``urls`` in
    ``database`` (dropped after); its row, printed as the script prints it."""
    args = harness.parser().parse_args([
        "--case", str(case), "--events", str(events), "--writer-events", str(writer_events),
        "--deadline", "60", "--database", database, "--urls", " ".join(urls),
        "--logs", str(tmp_path)])
    nodes = harness.node_urls(args)
    harness.prepare(nodes, args.database)
    try:
        row: dict[str, Any] = harness.run_case(case, 1, nodes, args, tmp_path)
    finally:
        server = harness.connect(nodes[0], "mysql")
        server.connect()
        server.execute_sql(f"DROP DATABASE IF EXISTS `{args.database}`")
        server.close()
    print(harness.markdown([row]))
    return row


def assert_each_event_once(row: dict[str, Any], written: int) -> None:
    """The case's row: no relay died, nothing left, every one of ``written`` events published
    once at the publisher and recorded published once."""
    assert row["events_written"] == written, row["seed"] | row["writers"]
    assert {
        "relays dead": [d["last_line"] for d in row["dead"]],
        "events left": row["left"],
        "published twice": row["published_twice"],
        "recorded published": row["published_db"],
        "published at the publisher": row["published_at_publisher"],
        "recorded but never published": row["recorded_never_published"],
    } == {
        "relays dead": [],
        "events left": 0,
        "published twice": 0,
        "recorded published": written,
        "published at the publisher": written,
        "recorded but never published": 0,
    }
