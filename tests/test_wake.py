"""Waking the relay on commit (SPEC §10): in-process, through Redis pub/sub and NATS core, a
ring before the COMMIT, a lost ring, a storm of rings."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import urllib.request
import uuid
from typing import Any, Callable

import nats
import peewee as pw
import pytest
import redis

from outbox_lite import InvalidEventError, OutboxRepository
from outbox_lite import wake
from outbox_lite.relay import Relay

from _helpers import FAMILY
from _redis import SHARED_REDIS, free_port
from _relays import finish, relay_process, watched_relay_process

LONG = 30.0  # a poll pause no test waits out: what is published fast was woken


class _AcceptAll:
    def publish(self, events):
        return {}

    def close(self):
        pass


def _published(fetch, ids):
    rows = fetch("SELECT id FROM outbox_event WHERE status = 'published'")
    return {r["id"] for r in rows} >= set(ids)


def _wait_published(fetch, ids, timeout, processes=()):
    deadline = time.monotonic() + timeout
    while not _published(fetch, ids):
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            return False
        time.sleep(0.002)
    return True


def _until(condition, what, timeout=30.0, processes=()):
    """Poll ``condition`` until it holds; fail after ``timeout`` s, or when one of
    ``processes`` ended first."""
    deadline = time.monotonic() + timeout
    while not condition():
        ended = [p for p in processes if p.poll() is not None]
        if time.monotonic() > deadline or ended:
            pytest.fail(f"waited in vain for {what}" + (" (a relay ended)" if ended else ""))
        time.sleep(0.01)


def _subscribers(url, channel, monitor=None):
    """How many subscriptions the wake-up server of ``url`` has on ``channel`` (Redis: PUBSUB
    NUMSUB; NATS: its monitoring port ``monitor``'s /subsz)."""
    if monitor is None:
        client = redis.Redis.from_url(url)
        try:
            return int(client.pubsub_numsub(channel)[0][1])
        finally:
            client.close()
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/subsz?subs=1", timeout=5) as r:
        subscriptions = json.load(r).get("subscriptions_list") or []
    return sum(1 for sub in subscriptions if sub["subject"] == channel)


def _create(repo, n):
    with repo.database.atomic():
        return repo.create_in_transaction(event_type="job.created", aggregate_type="job",
                                          aggregate_id=str(n), payload={"n": n}).id


class _RelayThread:
    """A Relay running in a thread of this process until :meth:`stop`."""

    def __init__(self, db_url, **options):
        self.database = db_url.database()
        self.relay = Relay(OutboxRepository(self.database), _AcceptAll(), **options)
        self.stop_event = threading.Event()
        self.errors = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.relay.run(self.stop_event)
        except BaseException as exc:  # noqa: BLE001 - asserted in the main thread
            self.errors.append(exc)

    def stop(self):
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert not self.errors, self.errors
        self.relay.close()


def _settle(relay, seconds):
    """Wait until the relay waits out a pause with ``seconds`` or more of it left (its pause
    has grown, doubling from 10 ms: a poll would come late). The loop's progress mark is set
    to the end of the pause when it starts one (Relay._progress)."""
    _until(lambda: relay._progress_at - time.monotonic() >= seconds,
           f"a pause of {seconds} s or more", 60)


# ---------------------------------------------------------------------------
# The repository's ring
# ---------------------------------------------------------------------------

def test_the_repository_rings_after_the_commit_and_not_on_a_rollback(db, repo):
    """Peewee 4 has a commit hook: the ring comes after the COMMIT, none on a rollback.
    Peewee 3 has none: the ring comes at create (the relay retries after it)."""
    bell = wake.Doorbell()
    wake.listen_locally(wake.database_key(db), bell)
    try:
        hook = hasattr(pw.Database, "after_commit")
        with db.atomic():
            repo.create_in_transaction(event_type="a", aggregate_type="b", aggregate_id="1",
                                       payload={})
            assert bell.take() is (not hook)
        assert bell.take() is hook
        with pytest.raises(RuntimeError):
            with db.atomic():
                repo.create_in_transaction(event_type="a", aggregate_type="b",
                                           aggregate_id="2", payload={})
                raise RuntimeError("roll back")
        assert bell.take() is (not hook)  # Peewee 3 rang at create: a spurious ring only
        with db.atomic():  # a savepoint's event rings at the outer COMMIT
            with db.atomic():
                repo.create_in_transaction(event_type="a", aggregate_type="b",
                                           aggregate_id="3", payload={})
            assert bell.take() is (not hook)
        assert bell.take() is hook
    finally:
        wake.stop_listening_locally(wake.database_key(db), bell)


def test_a_bad_wake_url_is_one_line_of_the_relay_command_without_its_password(db_url):
    relay = relay_process(db_url, "--publisher", "_wake_publishers:accept_all",
                          "--wake-url", "http://user:s3cret@host/")
    status, _, err = finish(relay, 60)
    assert status != 0 and "wake must be a redis:// or nats:// URL" in err
    assert "s3cret" not in err and "Traceback" not in err


def test_a_bad_wake_is_refused_before_anything_and_keeps_its_password(db):
    for bad in ("http://user:s3cret@host/", "s3cret", "", 42):
        with pytest.raises(InvalidEventError) as error:
            OutboxRepository(db, wake=bad)
        assert "s3cret" not in str(error.value)
        with pytest.raises(InvalidEventError):
            Relay(OutboxRepository(db), _AcceptAll(), wake=bad)


def test_a_signal_carries_nothing_of_the_event(db_url, db):
    """What goes over Redis is an empty message on the database's channel."""
    client = redis.Redis.from_url(SHARED_REDIS)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    channel = wake.channel_of(SHARED_REDIS, db_url.name)
    pubsub.subscribe(channel)
    try:
        pubsub.get_message(timeout=1)
        repo = OutboxRepository(db, wake=SHARED_REDIS)
        _create(repo, 1)
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["type"] == "message"
        assert (message["channel"], message["data"]) == (channel.encode(), b"")
    finally:
        pubsub.close()
        client.close()


# ---------------------------------------------------------------------------
# The relay wakes
# ---------------------------------------------------------------------------

def _ring_delays(relay: Any, repo: OutboxRepository, fetch: Any,
                 before_each: Callable[[], None] = lambda: None) -> list[float]:
    """Three events written one at a time, each once ``before_each`` has run and the relay's
    pause has grown past 0.7 s (a poll would be late): each one's seconds from its write to
    its publication."""
    delays = []
    for n in range(3):
        before_each()
        _settle(relay.relay, 0.7)
        started = time.monotonic()
        event_id = _create(repo, n)
        assert _wait_published(fetch, [event_id], 5.0)
        delays.append(time.monotonic() - started)
    return delays


def test_a_relay_in_the_same_process_wakes_without_any_server(db_url, db, fetch):
    relay = _RelayThread(db_url, max_idle_pause=LONG)
    try:
        repo = OutboxRepository(db)  # no wake= at all: in-process rings need no server
        delays = _ring_delays(relay, repo, fetch)
    finally:
        relay.stop()
    # A poll would come 0.7 s or more after the write; the ring comes at once (the bound
    # leaves room for a CI machine running three suites on its two cores).
    assert max(delays) < 0.5, delays


@pytest.mark.parametrize("kind", ["redis", "nats"])
def test_a_relay_in_another_process_wakes_through_the_server(kind, db_url, db, fetch,
                                                             request):
    if kind == "redis":
        url, monitor = SHARED_REDIS, None
    else:  # a NATS of the test's own, whose monitoring port shows the relay's subscription
        monitor = free_port()
        url = request.getfixturevalue("nats_server")("-m", str(monitor)).url
    # Redis's URL as the flag, NATS's from $OUTBOX_WAKE_URL
    flag, env = (["--wake-url", url], None) if kind == "redis" else ([], {"OUTBOX_WAKE_URL": url})
    relay = watched_relay_process(db_url, "--publisher", "_wake_publishers:accept_all", *flag,
                                  "--max-idle-pause", str(LONG), env=env)
    try:
        channel = wake.channel_of(url, db_url.name)
        _until(lambda: _subscribers(url, channel, monitor) == 1,
               "the relay's subscription", 60, [relay])
        # Its pauses double from 10 ms: after the 8th round's (1.28 s) it claims once more
        # and then waits 2.56 s, 5.12 s …: a poll would be late.
        relay.wait_for_rounds(8)
        repo = OutboxRepository(db, wake=url)
        delays = []
        for n in range(5):
            started = time.monotonic()
            event_id = _create(repo, n)
            assert _wait_published(fetch, [event_id], 5.0, [relay]), f"event {n} waited"
            delays.append(time.monotonic() - started)
            time.sleep(0.1)
    finally:
        relay.terminate()
        status, _, err = finish(relay, 30)
    assert status == 0, err
    assert max(delays) < 1.0, delays  # a poll: over a second late
    assert "woken through" in err


def _insert_quietly(service: pw.Database, n: int) -> int:
    """A pending event inserted by hand in ``service``'s open transaction, ringing no one
    (the repository would ring; on PostgreSQL its INSERT notifies): the test rings."""
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    return FAMILY.insert_id(
        service, "INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id,"
        " dedupe_key, payload, status, available_at, created_at, updated_at)"
        " VALUES ('a', 'b', %s, %s, '{}', 'pending', %s, %s, %s)",
        (str(n), uuid.uuid4().hex, now, now, now))


def test_a_wake_up_before_the_commit_costs_the_event_little(db_url, fetch):
    """A ring that comes while the event's transaction is still open (Peewee 3 rings at
    create; a service may ring by hand): the relay's claim finds nothing, and it retries over
    1, 2, 4 … ms instead of waiting out its poll pause."""
    relay = _RelayThread(db_url, wake=SHARED_REDIS, max_idle_pause=LONG)
    client = redis.Redis.from_url(SHARED_REDIS)
    service = db_url.database()
    try:
        channel = wake.channel_of(SHARED_REDIS, db_url.name)
        _until(lambda: _subscribers(SHARED_REDIS, channel) == 1, "the relay's subscription")
        _settle(relay.relay, 0.3)
        delays = []
        for n, before_commit in enumerate((0.005, 0.02, 0.05)):
            with service.atomic():
                event_id = _insert_quietly(service, n)
                client.publish(channel, b"")  # the ring, before the COMMIT
                time.sleep(before_commit)  # the rest of the service's transaction
            committed = time.monotonic()
            assert _wait_published(fetch, [event_id], 10.0)
            delays.append((before_commit, time.monotonic() - committed))
            _settle(relay.relay, 0.3)
    finally:
        service.close()
        client.close()
        relay.stop()
    # The retry doubles: the event waits about as long again as its transaction had left
    # when the ring came (with room for a loaded machine), not the 30 s poll pause.
    for before_commit, delay in delays:
        assert delay < 4 * before_commit + 0.5, delays


def test_a_ring_whose_event_was_taken_already_leaves_the_relay_listening(db_url, db, fetch):
    """A ring can come after a claim took its event (a poll, or the round after a batch, ran
    between the COMMIT and the ring): answered, it finds nothing. That one miss must not
    stop the next ring from cutting the relay's wait short, or the next event waits out a
    retry pause that has doubled towards the poll pause (measured: up to 128 ms at 5
    events a second on a loaded machine)."""
    relay = _RelayThread(db_url, max_idle_pause=LONG)
    try:
        repo = OutboxRepository(db)  # in-process rings (PostgreSQL: its INSERT's NOTIFY)
        delays = _ring_delays(relay, repo, fetch, before_each=lambda: _miss(relay, db))
    finally:
        relay.stop()
    # deaf, the relay would publish it 0.7 s or more after the write
    assert max(delays) < 0.5, delays


def _miss(relay: _RelayThread, database: pw.Database) -> None:
    """A ring with nothing to claim, answered: the relay's retries then double from 1 ms
    (1, 2, 4 … 512 ms: a second, then 1.024 s …)."""
    _settle(relay.relay, 0.3)
    _ring_by_hand(relay, database)


def _ring_by_hand(relay: _RelayThread, database: pw.Database) -> None:
    """Ring ``relay`` as it listens, and wait for the claim that answers it. A relay that
    LISTENs (its native_wake: PostgreSQL's) hears no in-process ring: a NOTIFY from another
    session, delivered at once (committed alone); the others hear this process's rings.
    ``database`` is in no transaction."""
    rings, rounds = relay.relay._bell.rings, relay.relay.stats.rounds
    if relay.relay.native_wake is None:
        wake.ring_locally(wake.database_key(database))
    else:
        database.execute_sql("NOTIFY outbox_event")
    _until(lambda: relay.relay._bell.rings > rings, "the relay to hear the ring")
    _until(lambda: relay.relay.stats.rounds > rounds, "the ring's claim")


def test_a_ring_before_its_commit_late_in_a_retry_is_answered_soon(db_url, db, fetch):
    """The second miss in a row (a ring that found nothing, then one whose COMMIT had not
    happened yet, as every ring on Peewee 3) is retried after 2 ms, not after twice the
    pause the first miss's retries had grown to: that was 1.4 s or more here (a CI run saw
    2.06 s), up to the relay's longest pause."""
    relay = _RelayThread(db_url, max_idle_pause=LONG)
    service = db_url.database()
    try:
        delays = []
        for n in range(3):
            _miss(relay, db)
            _settle(relay.relay, 0.7)
            with service.atomic():
                event_id = _insert_quietly(service, n)
                _ring_by_hand(relay, db)  # before the COMMIT
            committed = time.monotonic()
            assert _wait_published(fetch, [event_id], 10.0)
            delays.append(time.monotonic() - committed)
    finally:
        service.close()
        relay.stop()
    # Its retries double from 2 ms after the claim that found nothing: the event comes about
    # as long after the COMMIT as the COMMIT came after that claim (room for a loaded machine)
    assert max(delays) < 1.0, delays


def test_a_storm_of_rings_is_one_flag_not_a_queue(db_url):
    """Thousands of rings a second with nothing to claim: the relay's claims thin out to
    log2(pause / 1 ms) and then its poll, instead of following the rings."""
    relay = _RelayThread(db_url, wake=SHARED_REDIS, max_idle_pause=LONG)
    client = redis.Redis.from_url(SHARED_REDIS)
    try:
        channel = wake.channel_of(SHARED_REDIS, db_url.name)
        _until(lambda: _subscribers(SHARED_REDIS, channel) == 1, "the relay's subscription")
        _settle(relay.relay, 0.3)
        rounds_before = relay.relay.stats.rounds
        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < 2.0:
            pipe = client.pipeline(transaction=False)
            for _ in range(200):
                pipe.publish(channel, b"")
            pipe.execute()
            sent += 200
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        _until(lambda: relay.relay._bell.rings > sent * 0.9, "the rings to arrive")
        heard = relay.relay._bell.rings
        claims = relay.relay.stats.rounds - rounds_before
    finally:
        client.close()
        relay.stop()
    # a storm, even on a loaded machine: a relay that followed the rings would claim
    # thousands of times, against the 16 allowed below
    assert sent / elapsed > 1_000, f"the test sent only {sent / elapsed:.0f} rings/s"
    assert heard > sent * 0.9  # they arrived
    assert claims <= 16, (claims, sent)  # 1, 2, 4 … 1024 ms: about 12 in two seconds


# ---------------------------------------------------------------------------
# A wake-up server that is down
# ---------------------------------------------------------------------------

def test_a_lost_wake_up_loses_no_event_and_the_wake_up_comes_back(db_url, db, fetch,
                                                                  redis_server, caplog):
    server = redis_server()
    relay = watched_relay_process(db_url, "--publisher", "_wake_publishers:accept_all",
                                  "--wake-url", server.url, "--max-idle-pause", "1")
    channel = wake.channel_of(server.url, db_url.name)
    try:
        _until(lambda: _subscribers(server.url, channel) == 1, "the relay's subscription",
               60, [relay])
        server.stop()  # our own redis-server, by its pid
        repo = OutboxRepository(db, wake=server.url)
        ids = []
        with caplog.at_level(logging.WARNING, logger="outbox_lite.wake"):
            for n in range(20):
                started = time.monotonic()
                ids.append(_create(repo, n))
                assert time.monotonic() - started < 0.2  # a write never waits on it
            assert _wait_published(fetch, ids, 10.0, [relay]), "polling did not publish them"
            warnings = [r for r in caplog.records if "failed" in r.getMessage()]
            assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
            server.start()  # the same port: both sides reconnect in the background
            deadline = time.monotonic() + 15
            while repo.wake.sent == 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # the sender sends the rings it held, once it is back
            assert repo.wake.sent >= 1
        # the relay's listener is back too (its backoff is at most 5 s): it says so
        relay.wait_for_line(lambda line: "wake-up listener" in line and "is back" in line,
                            "the relay's listener to be back", 60)
        assert _subscribers(server.url, channel) == 1
    finally:
        relay.terminate()
        status, _, err = finish(relay, 30)
    assert status == 0, err
    assert err.count("wake-up listener") == 2, err  # failed once, back once
    assert "is back" in err
