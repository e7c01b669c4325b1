"""Issue 36 on a real Galera cluster, case 3 of its table, briefly: ONE ``outbox-lite relay``
on node 1 while writers on nodes 2 and 3 write, a publisher that counts every publish. The
relay must outlive the COMMITs Galera refuses (certification failures, 1213) and drain
everything, each event published once and recorded once (SPEC §5, §12).

On the code of today's main this fails: the relay dies within seconds with
``outbox-lite relay: error: (1213, 'Deadlock found ...')`` and events are left behind."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

EVENTS = 2000  # seeded before the relay starts
WRITER_EVENTS = 3000  # written on nodes 2 and 3 while it runs


def test_one_relay_on_node_1_outlives_writers_on_nodes_2_and_3(
        galera_urls: list[str], harness: ModuleType, tmp_path: Path) -> None:
    args = harness.parser().parse_args([
        "--case", "3", "--events", str(EVENTS), "--writer-events", str(WRITER_EVENTS),
        "--deadline", "60", "--database", "outbox_galera_test", "--urls", " ".join(galera_urls),
        "--logs", str(tmp_path)])
    urls = harness.node_urls(args)
    harness.prepare(urls, args.database)
    try:
        row = harness.run_case(3, 1, urls, args, tmp_path)
    finally:
        server = harness.connect(urls[0], "mysql")
        server.connect()
        server.execute_sql(f"DROP DATABASE IF EXISTS `{args.database}`")
        server.close()
    print(harness.markdown([row]))
    written = row["events_written"]
    assert written == EVENTS + WRITER_EVENTS, row["seed"] | row["writers"]
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
