"""Which Galera node a URL listing several connects to (SPEC §12: the first that answers and can
take writes, ``wsrep_ready`` and Synced): a node that is not Synced (desynced:
``wsrep_desync=ON``, "Donor/Desynced") and a node that is not ready (isolated from the group:
non-primary, ``wsrep_ready=OFF``, which answers every query with 1047) are passed over for the
next node of the list; once the node is Synced again, it is the one chosen again."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from outbox_lite._families.url import DatabaseUrl

GALERA = Path(__file__).resolve().parents[2] / "scripts" / "galera.sh"


def _port_chosen(url: DatabaseUrl) -> int:
    database = url.database()
    try:
        return int(database.execute_sql("SELECT @@port").fetchone()[0])
    finally:
        database.close()


def _state(node: DatabaseUrl) -> str:
    database = node.database()
    try:
        row = database.execute_sql("SHOW STATUS LIKE 'wsrep_local_state_comment'").fetchone()
        return str(row[1])
    finally:
        database.close()


def _wait_synced(node: DatabaseUrl, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while _state(node) != "Synced":
        assert time.monotonic() < deadline, f"node {node.port} not Synced again"
        time.sleep(0.2)


def _listing(first: DatabaseUrl, second: DatabaseUrl) -> DatabaseUrl:
    return DatabaseUrl.parse(f"mysql://root@{first.host}:{first.port},{second.host}:"
                             f"{second.port}/mysql")


def test_a_desynced_node_is_passed_over(galera_urls: list[str]) -> None:
    one, two = (DatabaseUrl.parse(url).with_name("mysql") for url in galera_urls[:2])
    url = _listing(one, two)
    assert _port_chosen(url) == one.port
    admin = one.database()
    try:
        admin.execute_sql("SET GLOBAL wsrep_desync = ON")
        assert _state(one) == "Donor/Desynced"
        assert _port_chosen(url) == two.port
    finally:
        admin.execute_sql("SET GLOBAL wsrep_desync = OFF")
        admin.close()
    _wait_synced(one)
    assert _port_chosen(url) == one.port


def test_a_node_out_of_the_group_is_passed_over(galera_urls: list[str]) -> None:
    three, one = (DatabaseUrl.parse(galera_urls[i]).with_name("mysql") for i in (2, 0))
    url = _listing(three, one)
    admin = three.database()
    try:
        admin.execute_sql("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'")
        deadline = time.monotonic() + 30
        while _state(three) == "Synced":  # the group notices within evs.suspect_timeout
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert _port_chosen(url) == one.port
    finally:
        admin.execute_sql("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
        admin.close()
    try:
        _wait_synced(three, 30)
    except AssertionError:  # not back by itself: started again, as after a crash
        subprocess.run([str(GALERA), "kill", "3"], check=True)
        subprocess.run([str(GALERA), "restart", "3"], check=True, stdout=subprocess.DEVNULL)
    assert _port_chosen(url) == three.port
