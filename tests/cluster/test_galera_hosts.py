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


class _Broker:
    def __init__(self) -> None:
        self.published: list[int] = []

    def publish(self, events):  # type: ignore[no-untyped-def]
        self.published += [event.id for event in events]
        return {}

    def close(self) -> None:
        pass


def test_a_relay_on_a_node_out_of_the_group_waits_and_then_drains(galera_urls: list[str]
                                                                   ) -> None:
    """A relay whose URL names only node 3, while node 3 is out of the group (non-primary,
    every query refused with 1047): it does not die, it says it is waiting for its database
    (what /healthz shows) and claims nothing; events written on node 1 meanwhile are published
    once node 3 is Synced again, each once. A relay listing node 3 then node 1 drains through
    node 1 meanwhile."""
    import threading

    from outbox_lite import OutboxRepository
    from outbox_lite import migrate as schema
    from outbox_lite.relay import Relay

    name = "outbox_galera_non_primary"
    one, three = (DatabaseUrl.parse(galera_urls[i]).with_name(name) for i in (0, 2))
    one.drop_database()
    one.create_database()
    writer = one.database()
    schema.migrate(writer)
    _wait_synced(three.with_name("mysql"))
    admin = three.with_name("mysql").database()
    alone, listed = _Broker(), _Broker()
    stops = [threading.Event(), threading.Event()]
    failures: list[BaseException] = []
    relays = [Relay(OutboxRepository(three.database()), alone, worker_id="node3-only",
                    progress_every=0, reconnect_pause=0.1, max_reconnect_pause=0.5),
              Relay(OutboxRepository(_listing(three, one).with_name(name).database()), listed,
                    worker_id="node3-then-1", progress_every=0, reconnect_pause=0.1,
                    max_reconnect_pause=0.5, idle_pause=0.02, max_idle_pause=0.1)]

    def run(relay: Relay, stop: threading.Event) -> None:
        try:
            relay.run(stop)
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            failures.append(exc)

    def published() -> int:
        return int(writer.execute_sql("SELECT COUNT(*) FROM outbox_event WHERE status ="
                                      " 'published'").fetchone()[0])

    threads = []
    try:
        admin.execute_sql("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'")
        deadline = time.monotonic() + 30
        while _state(three.with_name("mysql")) == "Synced":
            assert time.monotonic() < deadline, "node 3 never left the group"
            time.sleep(0.2)
        threads = [threading.Thread(target=run, args=pair, daemon=True)
                   for pair in zip(relays, stops)]
        for thread in threads:
            thread.start()
        repo = OutboxRepository(writer)
        with writer.atomic():
            ids = [repo.create_in_transaction(event_type="e", aggregate_type="a",
                                              aggregate_id=str(n), payload={"n": n}).id
                   for n in range(20)]
        deadline = time.monotonic() + 60
        while published() < len(ids):  # through node 1, by the relay listing it second
            assert time.monotonic() < deadline and not failures, failures
            time.sleep(0.1)
        trouble = relays[0].database_trouble()
        assert trouble is not None and relays[0].running, trouble  # waiting, not dead
        assert alone.published == [] and sorted(listed.published) == ids
        stops[1].set()  # from now on only the relay naming node 3 alone is left
        threads[1].join(60)
        assert not threads[1].is_alive()
        with writer.atomic():
            later = [repo.create_in_transaction(event_type="e", aggregate_type="a",
                                                aggregate_id=str(n), payload={"n": n}).id
                     for n in range(20, 30)]
    finally:
        admin.execute_sql("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
        admin.close()
    try:
        _wait_synced(three.with_name("mysql"), 30)
    except AssertionError:  # not back by itself: started again, as after a crash
        subprocess.run([str(GALERA), "kill", "3"], check=True)
        subprocess.run([str(GALERA), "restart", "3"], check=True, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while published() < len(ids) + len(later):
            assert time.monotonic() < deadline and not failures, failures
            time.sleep(0.1)
        assert relays[0].database_trouble() is None  # rounds finish again
    finally:
        for stop in stops:
            stop.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures
    assert sorted(listed.published) == ids and sorted(alone.published) == later  # each once
    writer.close()
    one.drop_database()
