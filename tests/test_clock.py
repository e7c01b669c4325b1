"""One clock decides (SPEC §1): every instant the library records or compares is the database
server's, so relays and services on hosts whose wall clocks disagree agree on lock expiry,
renewals, backoff, availability and ages.

The hosts are real processes (``_skewed.py``) whose wall clocks libfaketime puts two minutes
ahead of true time (``fast``) or behind it (``slow``); they run the library's defaults, no clock
injected. Time never passes by sleeping: a claim grows old through SQL (``locked_at`` moved
back), and the lock timeout, 200 s, is far beyond the test's own few seconds, so a claim that
is released here was released early.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import threading
import time

import pytest

from outbox_lite import Inbox, OutboxRepository, reconnect

from _brokers import SHARED_RABBITMQ
from _skewed import SkewedHost, skewed_env
from _helpers import FAMILY, capture_sql, claim_all, new_event, seed

SKEW = 120  # seconds either side of true time
LOCK_TIMEOUT = 200  # seconds: longer than the skew, far longer than any test here
UTC = dt.timezone.utc
#: How far a host's reading of the server's clock may stray (it is off by at most half the
#: round trip it was read in, well under a millisecond unless the machine is loaded).
SLACK = dt.timedelta(milliseconds=50)
SLACK_S = SLACK.total_seconds()
ROUNDS = re.compile(r" in (\d+) rounds")


@pytest.fixture(scope="module")
def hosts():
    fast, slow = SkewedHost(+SKEW), SkewedHost(-SKEW)
    yield fast, slow
    fast.close()
    slow.close()


@pytest.fixture
def fast(hosts, db_url):
    hosts[0].use(db_url, base=30, cap=600, jitter=0)
    return hosts[0]


@pytest.fixture
def slow(hosts, db_url):
    hosts[1].use(db_url, base=30, cap=600, jitter=0)
    return hosts[1]


@pytest.fixture
def outbox(db):
    """The parent's repository: the library's defaults, so the server's clock."""
    return OutboxRepository(db)


def server_now(fetch) -> dt.datetime:
    return fetch(f"SELECT {FAMILY.UTC_NOW} AS now")[0]["now"].replace(tzinfo=UTC)


def instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def seconds_from_now(fetch, column: str, where: str = "1 = 1") -> list[float]:
    """``column`` minus the server's now, in seconds, per row (in id order)."""
    return [float(r["s"]) for r in fetch(
        f"SELECT {FAMILY.seconds_from_now(column)} AS s"
        f" FROM outbox_event WHERE {where} ORDER BY id")]


# ---------------------------------------------------------------------------
# The hosts really are skewed, and the library's clock is the server's on both
# ---------------------------------------------------------------------------

def test_each_host_reads_the_servers_time_whatever_its_own_wall_clock_says(fast, slow, fetch):
    for host, sign in ((fast, +1), (slow, -1)):
        before = server_now(fetch)
        wall = host.host_now()
        library = instant(host.call("repo", "clock"))
        inbox = instant(host.call("inbox", "clock"))
        after = server_now(fetch)
        # The child's datetime.now() really is two minutes off ...
        assert abs((wall - before).total_seconds() - sign * SKEW) < 5
        # ... and the library's readings are the server's, within the call's round trip.
        for reading in (library, inbox):
            assert before - SLACK <= reading <= after + SLACK


# ---------------------------------------------------------------------------
# Lock expiry and renewals
# ---------------------------------------------------------------------------

def test_a_fast_hosts_release_leaves_a_slow_hosts_live_claim_alone(fast, slow, fetch, outbox):
    ids = seed(outbox, 10)
    before = server_now(fetch)
    claimed = slow.call("repo", "claim_batch", "slow-relay", 10, atomic=True)
    after = server_now(fetch)
    assert sorted(e["id"] for e in claimed) == ids
    assert all(before - SLACK <= instant(e["locked_at"]) <= after + SLACK for e in claimed)

    # Live for 200 s, claimed a moment ago: the fast host must not release it (today it
    # did at once: by its clock the claim was 240 s old).
    assert fast.call("repo", "release_expired_locks", LOCK_TIMEOUT) == 0
    assert fetch("SELECT status, locked_by, COUNT(*) AS n FROM outbox_event"
                 " GROUP BY status, locked_by") == [
        {"status": "processing", "locked_by": "slow-relay", "n": 10}]
    assert fast.call("repo", "stats", LOCK_TIMEOUT)["expired_claims"] == 0

    # 201 s old by the server's clock (moved through SQL): now each host releases it.
    fetch(f"UPDATE outbox_event SET locked_at = locked_at - {FAMILY.interval('201 SECOND')}")
    assert slow.call("repo", "stats", LOCK_TIMEOUT)["expired_claims"] == 10
    assert slow.call("repo", "release_expired_locks", LOCK_TIMEOUT) == 10
    assert fetch("SELECT status, last_error_code, COUNT(*) AS n FROM outbox_event"
                 " GROUP BY status, last_error_code") == [
        {"status": "pending", "last_error_code": "lock_expired", "n": 10}]


def test_a_slow_hosts_renewal_counts_from_the_servers_now(fast, slow, fetch, outbox):
    ids = seed(outbox, 10)
    slow.call("repo", "claim_batch", "slow-relay", 10, atomic=True)
    # The claim is 150 s old, live for 50 s more; the slow relay's heartbeat renews it.
    fetch(f"UPDATE outbox_event SET locked_at = locked_at - {FAMILY.interval('150 SECOND')}")
    assert slow.call("repo", "extend_locks", ids, "slow-relay") == 10
    assert all(-1 < s < SLACK_S for s in seconds_from_now(fetch, "locked_at"))
    # Renewed just now: the fast host releases nothing (today: renewed at the slow host's
    # now, 2 minutes back, and released by the fast host 61 real seconds later).
    fetch(f"UPDATE outbox_event SET locked_at = locked_at - {FAMILY.interval('61 SECOND')}")
    assert fast.call("repo", "release_expired_locks", LOCK_TIMEOUT) == 0
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'processing'"
                 " AND locked_by = 'slow-relay'") == [{"n": 10}]


def test_a_fast_hosts_expired_claim_is_released_by_a_slow_host(fast, slow, fetch, outbox):
    seed(outbox, 10)
    fast.call("repo", "claim_batch", "fast-relay", 10, atomic=True)
    assert all(-1 < s < SLACK_S for s in seconds_from_now(fetch, "locked_at"))
    assert slow.call("repo", "release_expired_locks", LOCK_TIMEOUT) == 0  # live
    fetch(f"UPDATE outbox_event SET locked_at = locked_at - {FAMILY.interval('201 SECOND')}")
    # Expired by the server's clock: released on the slow host too (today: not for another
    # 4 minutes, the fast relay's lead plus the slow host's lag).
    assert slow.call("repo", "release_expired_locks", LOCK_TIMEOUT) == 10
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'pending'") == [
        {"n": 10}]


# ---------------------------------------------------------------------------
# Availability, backoff, requeue, pending age
# ---------------------------------------------------------------------------

def test_an_event_written_on_a_fast_host_is_claimed_at_once_on_a_slow_host(fast, slow, fetch):
    before = server_now(fetch)
    created = fast.call("repo", "create_in_transaction", event_type="job.created",
                        aggregate_type="job", aggregate_id="1", payload={}, atomic=True)
    after = server_now(fetch)
    assert before - SLACK <= instant(created["created_at"]) <= after + SLACK
    assert created["available_at"] == created["created_at"]
    row = fetch("SELECT created_at, available_at FROM outbox_event")[0]
    assert row["created_at"].replace(tzinfo=UTC) == instant(created["created_at"])
    assert row["available_at"] == row["created_at"]
    # Today: invisible to the slow host's relay for 4 minutes.
    assert [e["id"] for e in slow.call("repo", "find_dispatchable")] == [created["id"]]
    claimed = slow.call("repo", "claim_batch", "slow-relay", 10, ordered=True, atomic=True)
    assert [e["id"] for e in claimed] == [created["id"]]
    assert fetch("SELECT status FROM outbox_event") == [{"status": "processing"}]


def test_the_backoff_and_a_requeue_count_from_the_servers_now(fast, slow, fetch, outbox):
    ids = seed(outbox, 2)
    # for all:
    fetch(f"UPDATE outbox_event SET available_at = available_at - {FAMILY.interval('1 HOUR')}")
    fast.call("repo", "claim_batch", "fast-relay", 1, atomic=True)
    slow.call("repo", "claim_batch", "slow-relay", 1, atomic=True)
    assert fast.call("repo", "mark_failed", ids[0], "fast-relay", "boom", "broker said no")
    assert slow.call("repo", "mark_failed", ids[1], "slow-relay", "boom", "broker said no")
    # The first retry waits the backoff's 30 s from the server's now, on either host (today
    # 150 s on the fast host and none at all on the slow one: -90 s, a retry storm).
    assert all(29 < s < 30 + SLACK_S for s in seconds_from_now(fetch, "available_at"))
    assert slow.call("repo", "find_dispatchable") == []
    assert fast.call("repo", "mark_processing", ids[0], "fast-relay") is False

    fetch(f"UPDATE outbox_event SET status = 'failed', available_at = {FAMILY.UTC_NOW}")
    assert fast.call("repo", "requeue_failed") == 2
    # Requeued events are dispatchable now (today: 2 minutes from now, on the fast host).
    assert all(-1 < s < SLACK_S for s in seconds_from_now(fetch, "available_at"))
    assert len(slow.call("repo", "find_dispatchable")) == 2


def test_the_pending_age_is_the_same_on_every_host(fast, slow, fetch, outbox):
    new_event(outbox)
    fetch(f"UPDATE outbox_event SET available_at = available_at - {FAMILY.interval('30 SECOND')},"
          f" created_at = created_at - {FAMILY.interval('30 SECOND')}")
    # Today the slow host reports no pending age at all (the alert stays silent), the fast
    # one 150 s.
    for host in (slow, fast):
        age = host.call("repo", "stats")["oldest_pending_age_seconds"]
        assert age is not None and 30 - SLACK_S < age < 32


def test_a_relays_lag_metric_is_the_same_on_every_host(fast, slow, fetch, outbox):
    for host in (fast, slow):
        seed(outbox, 5)
        fetch("UPDATE outbox_event SET available_at = available_at"
              f" - {FAMILY.interval('10 SECOND')} WHERE status = 'pending'")
        lags = host.call("host", "relay_lags")
        # Today: 130 s on the fast host, -110 s (so 0 in the histogram) on the slow one.
        assert len(lags) == 5 and all(10 - SLACK_S < lag < 12 for lag in lags), lags
    assert fetch("SELECT status, COUNT(*) AS n FROM outbox_event GROUP BY status") == [
        {"status": "published", "n": 10}]


# ---------------------------------------------------------------------------
# Purges: the outbox's and the inbox's, from Python and from the command line
# ---------------------------------------------------------------------------

def test_purges_count_ages_on_the_servers_clock(fast, slow, fetch, outbox, db):
    assert outbox.mark_published_many(claim_all(outbox, "w", 4), "w") == 4
    fetch(f"UPDATE outbox_event SET published_at = {FAMILY.UTC_NOW}"
          f" - {FAMILY.interval('90 SECOND')}")
    # 90 s old: not older than 100 s on the fast host (today it purged them: 210 s by its
    # clock), older than 60 s on the slow one (today: 0, only -30 s by its clock).
    assert fast.call("repo", "purge_published", 100) == 0
    assert fast.call("host", "cli", "purge", "--older-than", "100s", "--dry-run")[1] == (
        "would purge 0 published events older than 100s (dry run: nothing changed)\n")
    assert fast.call("host", "cli", "purge", "--older-than", "100s")[0] == 0
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 4}]
    assert slow.call("host", "cli", "purge", "--older-than", "60s", "--dry-run")[1] == (
        "would purge 4 published events older than 60s (dry run: nothing changed)\n")
    assert slow.call("repo", "purge_published", 60, batch_size=3) == 4
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event") == [{"n": 0}]

    for n in range(3):
        assert fast.call("inbox", "accept", f"m{n}", atomic=True) is True
    assert all(-1 < float(r["s"]) < SLACK_S for r in fetch(
        f"SELECT {FAMILY.seconds_from_now('received_at')} AS s FROM inbox_message"))
    fetch(f"UPDATE inbox_message SET received_at = received_at - {FAMILY.interval('90 SECOND')}")
    assert fast.call("inbox", "purge", 100) == 0
    assert fast.call("inbox_module", "count_older_than", 100) == 0
    assert fast.call("host", "cli", "inbox", "purge", "--older-than", "100s")[0] == 0
    assert fetch("SELECT COUNT(*) AS n FROM inbox_message") == [{"n": 3}]
    assert slow.call("inbox_module", "count_older_than", 60) == 3
    assert slow.call("inbox_module", "purge", 60, consumer="c") == 3
    assert fetch("SELECT COUNT(*) AS n FROM inbox_message") == [{"n": 0}]


# ---------------------------------------------------------------------------
# Two real relays, a real broker
# ---------------------------------------------------------------------------

def _relay(db_url, skew, *args, env=None):
    command = [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
               db_url.secret_text(), "--batch-size", "10", "--lock-timeout", str(LOCK_TIMEOUT),
               "--until-empty", "--progress-every", "0.1", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=skewed_env(skew, **(env or {})))


def _lines(stream, into):
    for line in stream:
        into.append(line)


def test_two_relays_on_skewed_hosts_deliver_ten_events_once_each(
        db_url, outbox, fetch, exchange, tmp_path):
    ids = seed(outbox, 10)
    # Written an hour ago: dispatchable by any host's clock, so both relays see them.
    fetch(f"UPDATE outbox_event SET available_at = available_at - {FAMILY.interval('1 HOUR')},"
          f" created_at = created_at - {FAMILY.interval('1 HOUR')}")
    gate = tmp_path / "gate"
    gate.mkdir()
    # The slow host's relay claims the ten and publishes them, then holds its live claims.
    slow = _relay(db_url, -SKEW, "--publisher", "_skewed:gated_rabbitmq", "--worker-id",
                  "slow-relay", env={"OUTBOX_TEST_RABBITMQ_URL": SHARED_RABBITMQ,
                                     "OUTBOX_TEST_EXCHANGE": exchange.name,
                                     "OUTBOX_TEST_GATE": str(gate)})
    deadline = time.monotonic() + 30
    while not (gate / "entered").exists():
        assert slow.poll() is None and time.monotonic() < deadline, slow.communicate()
        time.sleep(0.01)
    assert exchange.depth() == 10
    # The fast host's relay starts meanwhile. Today it released the slow relay's claims at
    # once and published the ten again.
    fast = _relay(db_url, +SKEW, "--rabbitmq-url", SHARED_RABBITMQ, "--exchange",
                  exchange.name, "--worker-id", "fast-relay")
    lines: list[str] = []
    reader = threading.Thread(target=_lines, args=(fast.stderr, lines), daemon=True)
    reader.start()
    # Let it run some rounds (the first releases expired claims) or end.
    while fast.poll() is None and max(
            [int(m.group(1)) for m in map(ROUNDS.search, lines) if m], default=0) < 3:
        assert time.monotonic() < deadline, lines
        time.sleep(0.01)
    (gate / "go").write_text("go")
    assert slow.wait(timeout=60) == 0, slow.communicate()
    assert fast.wait(timeout=60) == 0, lines
    reader.join(timeout=10)
    for stream in (slow.stdout, slow.stderr, fast.stdout):
        stream.close()
    assert exchange.depth() == 10  # today: 20
    assert fetch("SELECT id, status, attempt_count, locked_by, last_error_code"
                 " FROM outbox_event ORDER BY id") == [
        {"id": i, "status": "published", "attempt_count": 1, "locked_by": None,
         "last_error_code": None} for i in ids]
    assert not any("released" in line and " 0 released" not in line for line in lines), lines


# ---------------------------------------------------------------------------
# What the server clock costs: one read, then one per 10 s and per new connection
# ---------------------------------------------------------------------------

def test_the_default_clock_reads_the_server_once_then_per_refresh_and_new_connection(
        db, fetch):
    reads = lambda statements: sum(FAMILY.CLOCK_WORD in s for s, _ in statements)  # noqa: E731
    repo = OutboxRepository(db)
    inbox = Inbox(db, "c")
    with capture_sql(db) as statements:
        seed(repo, 50)
        with db.atomic():
            batch = repo.claim_batch("w", 50)
            inbox.accept("m")
        repo.mark_published_many([e.id for e in batch], "w")
        repo.stats()
    assert reads(statements) == 1  # one repository or inbox on a database share one clock
    assert sum("INSERT INTO outbox_event" in s for s, _ in statements) == 50
    reconnect(db)
    with capture_sql(db) as statements:
        new_event(repo)
        new_event(repo)
    assert reads(statements) == 1  # a new connection: read again, once
    repo.clock.refresh = 0.0  # a refresh due at every reading
    with capture_sql(db) as statements:
        new_event(repo)
    assert reads(statements) == 1
    # Each reading is the server's: within the bracket of two reads by another session, give
    # or take what the clock promises, half the round trip of the read it made (refresh 0: the
    # reading is that read, so half of the call's own time bounds it).
    before = server_now(fetch)
    started = time.monotonic()
    reading = repo.clock()
    slack = dt.timedelta(seconds=(time.monotonic() - started) / 2)
    assert before - slack <= reading <= server_now(fetch) + slack


def test_an_injected_clock_runs_no_sql_and_decides_every_instant(db, clock, fetch):
    repo = OutboxRepository(db, clock=clock)
    with capture_sql(db) as statements:
        event = new_event(repo)
    assert not any(FAMILY.CLOCK_WORD in s for s, _ in statements)
    assert fetch("SELECT created_at FROM outbox_event")[0]["created_at"] == clock.now.replace(
        tzinfo=None) == event.created_at.replace(tzinfo=None)
