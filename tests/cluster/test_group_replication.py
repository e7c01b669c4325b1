"""The outbox on a real MySQL 9.7 Group Replication group of 3 members (SPEC §12, issue 32),
scripts/group-replication.sh's group (its mode switched online per test):

* multi-primary: a relay on every member and writers on every member; the COMMITs the group
  refuses (3101, 1180) are lock conflicts the relays survive and count; every event is
  published once at the publisher (a Redis hash counting every publish of every event,
  scripts/galera_publisher.py) and recorded once;
* single-primary: the primary SIGKILLed mid-drain together with a relay beside it (a process of
  its own); the surviving relays, on a URL listing every member, reconnect to the new primary
  (the first member of the list that takes writes); nothing is lost, none of their events is
  published twice; the dead relay's claims are taken over only once the lock timeout has
  passed by the group's clock (its events, and only those, may reach the broker twice: a
  deduping broker keeps one, by message id); the killed member rejoins and holds the same
  outbox. Measured and printed: kill → new primary, kill → first publish on it, rejoin.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

from outbox_lite import OutboxRepository
from outbox_lite._families.url import DatabaseUrl
from outbox_lite.relay import Relay

CHECKOUT = Path(__file__).resolve().parents[2]
SCRIPTS = CHECKOUT / "scripts"
GROUP_REPLICATION = SCRIPTS / "group-replication.sh"
sys.path.insert(0, str(SCRIPTS))
from galera_publisher import Recorder  # noqa: E402 - the harness's publisher, from scripts/

from _cluster import assert_each_event_once, run_case, seed_outbox  # noqa: E402


def _group(*args: str) -> float:
    began = time.monotonic()
    subprocess.run([str(GROUP_REPLICATION), *args], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - began


def _members(url: DatabaseUrl) -> dict[int, tuple[str, str]]:
    """port -> (state, role), as the member at ``url`` sees the group."""
    db = url.with_name("mysql").database()
    try:
        rows = db.execute_sql("SELECT MEMBER_PORT, MEMBER_STATE, MEMBER_ROLE FROM"
                              " performance_schema.replication_group_members").fetchall()
        return {int(port): (state, role) for port, state, role in rows}
    finally:
        db.close()


def _naive_utc(instant: dt.datetime) -> dt.datetime:
    if instant.tzinfo is not None:
        instant = instant.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return instant


# -- multi-primary: relays and writers on every member --

EVENTS = 2000  # seeded before the relays start
WRITER_EVENTS = 2000  # written on every member while they run


def test_multi_primary_relays_and_writers_on_every_member(
        group_replication_urls: list[str], harness: ModuleType, tmp_path: Path) -> None:
    _group("mode", "multi")
    row = run_case(harness, 2, group_replication_urls, "outbox_gr_test", tmp_path,
                   events=EVENTS, writer_events=WRITER_EVENTS)
    assert_each_event_once(row, EVENTS + WRITER_EVENTS)
    # Relays on three primaries claim the same rows: the group refuses some COMMITs, and the
    # relays count what they survived (outbox_relay_conflicts_total).
    assert row["relay_lock_conflicts"] > 0, row


# -- single-primary: the primary killed mid-drain --

KILL_EVENTS = 4000
LOCK_TIMEOUT = 40.0  # longer than the group's failover (about 22 s with default timeouts)
KILL_DATABASE = "outbox_gr_kill"


class TimedRecorder(Recorder):
    """The harness's Redis counter; and, for each event this relay published, when (monotonic)
    and the ``locked_at`` of the claim it published under (the group's clock)."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(url, key)
        self.times: list[float] = []
        #: (when published, time.monotonic; when the batch was claimed, the group's UTC).
        self.batches: list[tuple[float, dt.datetime]] = []
        self.claims: dict[int, Any] = {}

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        failed = super().publish(events)
        self.times.append(time.monotonic())
        self.batches.append((self.times[-1], max(_naive_utc(e.locked_at) for e in events)))
        self.claims.update((event.id, _naive_utc(event.locked_at)) for event in events)
        return failed


def _held_by(database: Any, worker: str) -> int:
    return int(database.execute_sql(
        "SELECT COUNT(*) FROM outbox_event WHERE status = 'processing' AND locked_by = %s",
        (worker,)).fetchone()[0])


def _published(database: Any) -> int:
    return int(database.execute_sql(
        "SELECT COUNT(*) FROM outbox_event WHERE status = 'published'").fetchone()[0])


def test_single_primary_failover_mid_drain(group_replication_urls: list[str],
                                           tmp_path: Path) -> None:
    import redis

    _group("mode", "single")  # member 1 the primary
    members = [DatabaseUrl.parse(url) for url in group_replication_urls]
    primary = members[0].with_name(KILL_DATABASE)
    assert _members(primary)[primary.port] == ("ONLINE", "PRIMARY")
    seed_outbox(primary, KILL_EVENTS).close()

    every = ",".join(f"{m.host}:{m.port}" for m in members)
    url = DatabaseUrl.parse(f"mysql://root@{every}/{KILL_DATABASE}")
    key = f"outbox_gr:kill-{uuid.uuid4().hex[:8]}"
    store = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    # The relay that dies with the primary: a process beside it, on the primary alone, its
    # broker slow enough that it holds claims when it dies.
    doomed_log = tmp_path / "doomed.log"
    doomed = subprocess.Popen(
        [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url", primary.secret_text(),
         "--publisher", "galera_publisher:recorder", "--batch-size", "50",
         "--lock-timeout", str(LOCK_TIMEOUT), "--worker-id", "doomed", "--progress-every", "60"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=doomed_log.open("w"),
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS), str(CHECKOUT)]),
             "OUTBOX_GALERA_REDIS_KEY": key, "OUTBOX_GALERA_PUBLISH_SECONDS": "0.05"})
    publishers = [TimedRecorder("redis://127.0.0.1:6379/0", key) for _ in range(2)]
    relays = [Relay(OutboxRepository(url.database()), publisher, worker_id=f"survivor{i + 1}",
                    batch_size=50, lock_timeout=LOCK_TIMEOUT, reconnect_pause=0.1,
                    max_reconnect_pause=1.0, progress_every=0, release_every=1.0)
              for i, publisher in enumerate(publishers)]
    stop = threading.Event()
    failures: list[BaseException] = []

    def run(relay: Relay) -> None:
        try:
            relay.run(stop)
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(relay,), daemon=True) for relay in relays]
    new_primary = None
    held: dict[int, dt.datetime] = {}
    figures: dict[str, Any] = {}
    watch = primary.database()
    try:
        deadline = time.monotonic() + 300
        while not _held_by(watch, "doomed"):  # the doomed relay is at work
            assert doomed.poll() is None, doomed_log.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for thread in threads:
            thread.start()
        while (store.hlen(key) < KILL_EVENTS // 3 or not _held_by(watch, "doomed")) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        watch.close()
        killed = time.monotonic()
        doomed.send_signal(signal.SIGKILL)
        _group("kill", "1")
        killed_utc = _naive_utc(dt.datetime.now(dt.timezone.utc))  # no claim on member 1 now
        doomed.wait()
        while new_primary is None and time.monotonic() < deadline:
            roles = _members(members[1])
            new_primary = next((port for port, (state, role) in roles.items()
                                if role == "PRIMARY" and port != primary.port
                                and state == "ONLINE"), None)
            time.sleep(0.1)
        elected = time.monotonic()
        assert new_primary is not None, "no new primary"
        survivor_db = DatabaseUrl.parse(
            f"mysql://root@127.0.0.1:{new_primary}/{KILL_DATABASE}").database()
        # A new primary takes writes once it has applied the old one's backlog: then it
        # holds every claim the dead relay committed.
        while survivor_db.execute_sql("SELECT @@super_read_only").fetchone()[0]:
            assert time.monotonic() < deadline, "the new primary stays read-only"
            time.sleep(0.05)
        writable = time.monotonic()
        held = {int(i): _naive_utc(at) for i, at in survivor_db.execute_sql(
            "SELECT id, locked_at FROM outbox_event WHERE status = 'processing'"
            " AND locked_by = 'doomed'").fetchall()}
        while _published(survivor_db) < KILL_EVENTS and time.monotonic() < deadline:
            time.sleep(0.1)  # the dead relay's claims too: recorded once taken over
        drained = time.monotonic()
        survivor_db.close()
        ports = []
        for relay in relays:  # which member each relay writes to now
            ports.append(int(relay.repository.database.execute_sql(
                "SELECT @@port").fetchone()[0]))
        rejoin = _group("restart", "1")
        rejoined = _members(members[0])
        figures = {
            "kill -> new primary elected s": round(elected - killed, 1),
            "kill -> new primary takes writes s": round(writable - killed, 1),
            "kill -> first publish of a claim on the new primary s": round(min(
                t for p in publishers for t, at in p.batches if at > killed_utc) - killed, 1),
            "kill -> drained s": round(drained - killed, 1),
            "member 1 restarted -> ONLINE s": round(rejoin, 1),
            "claims held by the dead relay": len(held),
            "reconnects": [relay.stats.reconnects for relay in relays],
            "conflicts survived": sum(relay.stats.lock_conflicts for relay in relays),
        }
    finally:
        stop.set()
        for thread in threads:
            if thread.ident is not None:
                thread.join(60)
        for relay in relays:
            relay.repository.database.close()
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait()

    counts = {int(k): int(v) for k, v in store.hgetall(key).items()}
    store.delete(key)
    twice = sorted(i for i, n in counts.items() if n > 1)
    figures |= {"published": len(counts), "published twice (raw)": len(twice),
                "of which held by the dead relay": len(set(twice) & set(held))}
    print(figures)
    assert failures == [] and not any(thread.is_alive() for thread in threads), figures
    assert len(counts) == KILL_EVENTS, figures  # nothing lost: each id at the broker
    assert set(twice) <= set(held), figures  # only what the dead relay held went twice
    assert held, figures  # the dead relay held claims: the takeover below was tried
    taken = {i: publisher.claims[i] for publisher in publishers for i in held
             if i in publisher.claims}
    assert set(taken) == set(held), figures
    early = {i: (str(held[i]), str(at)) for i, at in taken.items()
             if at < held[i] + dt.timedelta(seconds=LOCK_TIMEOUT)}
    assert early == {}, figures  # taken over only once its lock had expired
    assert ports == [new_primary, new_primary], (ports, figures)
    assert all(n >= 1 for n in figures["reconnects"]), figures
    assert rejoined[primary.port] == ("ONLINE", "SECONDARY"), rejoined
    for member in members:  # the rejoined member holds the same outbox
        check = member.with_name(KILL_DATABASE).database()
        rows = dict(check.execute_sql(
            "SELECT status, COUNT(*) FROM outbox_event GROUP BY status").fetchall())
        check.close()
        assert rows == {"published": KILL_EVENTS}, (member.port, rows)
