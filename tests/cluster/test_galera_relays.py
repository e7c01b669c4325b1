"""Issue 36 on a real Galera cluster, case 3 of its table, briefly: ONE ``outbox-lite relay``
on node 1 while writers on nodes 2 and 3 write, a publisher that counts every publish. The
relay must outlive the COMMITs Galera refuses (certification failures, 1213) and drain
everything, each event published once and recorded once (SPEC §5, §12).

On the code of today's main this fails: the relay dies within seconds with
``outbox-lite relay: error: (1213, 'Deadlock found ...')`` and events are left behind."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from _cluster import assert_each_event_once, run_case

EVENTS = 2000  # seeded before the relay starts
WRITER_EVENTS = 3000  # written on nodes 2 and 3 while it runs


def test_one_relay_on_node_1_outlives_writers_on_nodes_2_and_3(
        galera_urls: list[str], harness: ModuleType, tmp_path: Path) -> None:
    row = run_case(harness, 3, galera_urls, "outbox_galera_test", tmp_path, events=EVENTS,
                   writer_events=WRITER_EVENTS)
    assert_each_event_once(row, EVENTS + WRITER_EVENTS)
