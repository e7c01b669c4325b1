"""Retention (SPEC §13, issue 33 part 1): ``Relay(retain=...)``, ``outbox-lite relay --retain``
and ``Inbox(..., retain=...)`` delete what is older than the age by the server's clock, by one
session of the database at a time, and never hold a lock a writer or a claimer waits on.

Time moves through SQL only: rows are made old by setting their instants back from the
server's own clock; nothing sleeps to make time pass.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import types

import pytest
from prometheus_client import CollectorRegistry

from outbox_lite import Inbox, OutboxRepository
from outbox_lite._named_lock import try_lock
from outbox_lite.cli import main
from outbox_lite.cli._args import parse_age_or_seconds
from outbox_lite.errors import OutboxError
from outbox_lite.metrics import RelayMetrics
from outbox_lite.relay import Relay
from outbox_lite.relay._retention import LOCK_NAME, Retention

from _docs import block
from _helpers import FAMILY, capture_sql, run_threads, seed
from _relays import finish, relay_process
from _wake_publishers import accept_all

HOUR = dt.timedelta(hours=1)


@pytest.fixture
def server_repo(db):
    """The repository on the server's clock (the fixture ``repo`` has a fake one)."""
    return OutboxRepository(db)


def _set(fetch, ids, status, age=None):
    """Rows ``ids`` to ``status``, published ``age`` (SQL, e.g. "2 HOUR") before the server's
    clock now (None: not published); failed rows get an old published_at too, as a row
    written around the library might, to show the status alone keeps them."""
    published = ("NULL" if age is None
                 else f"{FAMILY.UTC_NOW} - {FAMILY.interval(age)}")
    marks = ", ".join(["%s"] * len(ids))
    fetch(f"UPDATE outbox_event SET status = %s, published_at = {published},"
          f" locked_by = CASE WHEN %s = 'processing' THEN 'w' END,"
          f" locked_at = CASE WHEN %s = 'processing' THEN {FAMILY.UTC_NOW} END"
          f" WHERE id IN ({marks})", status, status, status, *ids)


def _ids(fetch):
    return {r["id"]: r["status"] for r in fetch("SELECT id, status FROM outbox_event")}


def _mixed(server_repo, fetch):
    """Old and young published events, and every other state with an old published_at."""
    ids = seed(server_repo, 10)
    old, edge_old, edge_young, young = ids[0:3], ids[3:4], ids[4:5], ids[5:6]
    pending, processing, failed = ids[6:7], ids[7:8], ids[8:10]
    _set(fetch, old, "published", "3 HOUR")
    _set(fetch, edge_old, "published", "61 MINUTE")
    _set(fetch, edge_young, "published", "59 MINUTE")
    _set(fetch, young, "published", "1 MINUTE")
    _set(fetch, pending, "pending", "5 HOUR")
    _set(fetch, processing, "processing", "5 HOUR")
    _set(fetch, failed, "failed", "5 HOUR")
    kept = {i: s for i, s in _ids(fetch).items() if i not in old + edge_old}
    return old + edge_old, kept


def test_a_relay_deletes_exactly_the_published_events_older_than_retain(server_repo, fetch):
    gone, kept = _mixed(server_repo, fetch)
    relay = Relay(server_repo, accept_all(), retain=HOUR, progress_every=0)
    result = relay.run_once()
    assert result.retained == len(gone) == 4
    assert relay.stats.retained == 4
    assert sorted(set(kept.values())) == ["failed", "pending", "processing", "published"]
    # Young published, processing and dead letters stay; the pending one is published now.
    assert _ids(fetch) == {i: "published" if s == "pending" else s for i, s in kept.items()}
    assert relay.run_once().retained == 0  # the next pass is not due yet


def test_dead_letters_are_never_deleted_however_old(server_repo, fetch):
    ids = seed(server_repo, 5)
    _set(fetch, ids, "failed", "400 DAY")
    fetch("UPDATE outbox_event SET updated_at = published_at, created_at = published_at,"
          " available_at = published_at")
    assert Retention(server_repo, 1).run() == 0
    assert server_repo.purge_published(1) == 0
    assert _ids(fetch) == {i: "failed" for i in ids}


def test_a_pass_is_bounded_and_the_next_one_goes_on(server_repo, fetch):
    ids = seed(server_repo, 1203)
    _set(fetch, ids, "published", "2 HOUR")
    retention = Retention(server_repo, HOUR, batch_size=500, max_batches=2)
    assert retention.every == 60.0  # a tenth of an hour, at most 60 s
    assert retention.run_if_due() == 1000
    assert len(_ids(fetch)) == 203
    assert retention.due()  # a full pass: more may wait, the next round goes on
    assert retention.run_if_due() == 203
    assert not retention.due()  # not full: the next pass in 60 s
    assert retention.run_if_due() == 0
    assert _ids(fetch) == {}


def test_a_relay_that_finds_the_lock_held_skips_the_pass_without_waiting(db, db_url,
                                                                        server_repo, fetch):
    ids = seed(server_repo, 20)
    _set(fetch, ids, "published", "2 HOUR")
    other = db_url.database()  # another relay's session, holding the lock
    try:
        with try_lock(other, LOCK_NAME) as taken:
            assert taken
            started = time.monotonic()
            assert Retention(server_repo, HOUR).run() == 0
            assert time.monotonic() - started < 1.0
            assert len(_ids(fetch)) == 20
        assert Retention(server_repo, HOUR).run() == 20  # released: the next pass purges
    finally:
        other.close()


def test_two_relays_at_once_only_one_purges_and_the_other_does_not_wait(db, server_repo,
                                                                        fetch):
    ids = seed(server_repo, 300)
    _set(fetch, ids, "published", "2 HOUR")
    finished: list[tuple[int, int, float]] = []
    entered: list[int] = []

    def relay(i):
        retention = Retention(OutboxRepository(db), HOUR)
        purge = retention.repository.purge_published

        def slow_purge(*args, **kwargs):  # holds the lock until the other pass is over
            entered.append(i)
            deadline = time.monotonic() + 10
            while not finished and time.monotonic() < deadline:
                time.sleep(0.01)
            return purge(*args, **kwargs)

        retention.repository.purge_published = slow_purge  # type: ignore[method-assign]
        started = time.monotonic()
        deleted = retention.run()
        finished.append((i, deleted, time.monotonic() - started))
        return deleted

    for _ in range(3):  # the race again, each time with old rows to purge
        finished.clear()
        entered.clear()
        results, errors = run_threads(2, relay, db)
        assert errors == []
        assert len(entered) == 1, entered  # one pass took the lock
        assert sorted(results) == [0, 300]
        loser = finished[0]
        assert loser[1] == 0 and loser[0] != entered[0]
        assert loser[2] < 1.0  # it did not wait for the winner
        assert _ids(fetch) == {}
        ids = seed(server_repo, 300)
        _set(fetch, ids, "published", "2 HOUR")


def test_writers_and_claimers_never_wait_on_a_big_purge(db, db_url, server_repo, fetch):
    """The worst case: a purge of 2,000 old published rows in one batch, its DELETEs' locks
    held in a transaction left open, while a writer inserts and a claimer claims and
    records, each waiting at most 1 s for any lock (then the server's lock-wait error).
    (One DELETE of 1,000 ids or more would scan and lock the whole table on MariaDB.)"""
    old = seed(server_repo, 2000)
    _set(fetch, old, "published", "2 HOUR")
    pending = seed(server_repo, 50)
    purger = db_url.database()
    try:
        with purger.atomic():
            assert OutboxRepository(purger).purge_published(HOUR, batch_size=2000) == 2000

            def work(i):
                FAMILY.limit_lock_waits(db, 1)
                started = time.monotonic()
                with db.atomic():
                    if i == 0:
                        made = seed(server_repo, 20)
                    else:
                        made = [e.id for e in server_repo.claim_batch("claimer", limit=100)]
                        assert server_repo.mark_published_many(made, "claimer") == len(made)
                return made, time.monotonic() - started

            results, errors = run_threads(2, work, db)
            assert errors == []
            (written, write_seconds), (claimed, claim_seconds) = results
            assert len(written) == 20 and write_seconds < 1.0
            # Every pending row was claimed: the DELETE held none of them.
            assert sorted(claimed) == pending and claim_seconds < 1.0
    finally:
        purger.close()
    statuses = _ids(fetch)
    assert len(statuses) == 50 + 20  # the purge committed; the writes and claims too
    assert [statuses[i] for i in pending] == ["published"] * 50


def test_the_relay_retains_while_writers_write_and_no_one_waits(db, server_repo, fetch):
    """The library's own passes (bounded DELETEs in autocommit) beside a writer and a
    claimer, all at once, with 1 s lock waits: nothing fails, and what is left is exact."""
    old = seed(server_repo, 3000)
    _set(fetch, old, "published", "2 HOUR")
    seed(server_repo, 100)

    def work(i):
        FAMILY.limit_lock_waits(db, 1)
        repo = OutboxRepository(db)
        if i == 0:
            return Retention(repo, HOUR, batch_size=200, max_batches=100).run()
        done = 0
        for _ in range(10):
            with db.atomic():
                if i == 1:
                    done += len(seed(repo, 10))
                else:
                    claimed = [e.id for e in repo.claim_batch("claimer", limit=10)]
                    done += repo.mark_published_many(claimed, "claimer")
        return done

    results, errors = run_threads(3, work, db)
    assert errors == []
    assert results == [3000, 100, 100]
    statuses = _ids(fetch)
    assert len(statuses) == 200
    assert sorted(statuses.values()).count("published") == 100


def test_metrics_count_what_retention_deleted_and_the_oldest_publish_kept(server_repo, fetch):
    gone, kept = _mixed(server_repo, fetch)
    metrics = RelayMetrics(CollectorRegistry(), stats_every=3600)
    relay = Relay(server_repo, accept_all(), retain=HOUR, metrics=metrics, progress_every=0)
    relay.run_once()
    relay._read_stats()
    families = {m.name: m for m in metrics.collect()}
    retained = families["outbox_relay_retained"].samples
    assert [(s.name, s.value) for s in retained] == [("outbox_relay_retained_total", 4.0)]
    (age,) = families["outbox_oldest_published_age_seconds"].samples
    assert 59 * 60 <= age.value < 59 * 60 + 60  # the edge's 59 minutes (seed order = ids)
    stats = server_repo.stats()
    assert stats.oldest_published_age is not None
    assert stats.as_dict()["oldest_published_age_seconds"] == pytest.approx(
        stats.oldest_published_age.total_seconds())
    fetch("DELETE FROM outbox_event WHERE status = 'published'")
    assert server_repo.stats().oldest_published_age is None
    relay._read_stats()
    families = {m.name: m for m in metrics.collect()}
    assert families["outbox_oldest_published_age_seconds"].samples[0].value == 0.0


def test_relay_options_are_checked(server_repo):
    with pytest.raises(OutboxError):
        Relay(server_repo, accept_all(), retain=0)
    with pytest.raises(OutboxError):
        Relay(server_repo, accept_all(), retain=60, retain_every=-1)
    assert Relay(server_repo, accept_all()).retention is None
    assert Relay(server_repo, accept_all(), retain=30).retention.every == 3.0
    assert Relay(server_repo, accept_all(), retain=5).retention.every == 1.0
    assert Relay(server_repo, accept_all(), retain=dt.timedelta(days=7)).retention.every == 60.0


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("12h", 43200),
                                           ("7d", 604800), ("3600", 3600), ("1.5", 1.5)])
def test_retain_takes_an_age_with_a_unit_or_seconds(text, seconds):
    assert parse_age_or_seconds(text).delta == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("value, words", [("7x", "not a duration"), ("-5", "must be positive"),
                                          ("0", "must be positive"), ("", "not a duration")])
def test_a_bad_retain_is_one_line(db_url, capsys, value, words):
    with pytest.raises(SystemExit) as exit_:
        main(["relay", "--database-url", db_url.secret_text(), "--publisher", "x:y",
              "--retain", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--retain" in err and words in err and "\n" not in err


def test_the_command_retains(db, db_url, server_repo, fetch):
    gone, kept = _mixed(server_repo, fetch)
    fetch("DELETE FROM outbox_event WHERE status = 'processing'")  # --until-empty waits
    kept = {i: s for i, s in kept.items() if s != "processing"}
    code, out, err = finish(relay_process(db_url, "--publisher", "_wake_publishers:accept_all",
                                          "--until-empty", "--retain", "1h"))
    assert code == 0, err
    assert "4 deleted by retention" in err
    statuses = _ids(fetch)
    assert set(statuses) == set(kept)  # the pending one is published now; the rest kept
    assert statuses[next(i for i, s in kept.items() if s == "pending")] == "published"


# ---------------------------------------------------------------------------
# The inbox
# ---------------------------------------------------------------------------

def _received(fetch, consumer, message_id, age):
    fetch(f"INSERT INTO inbox_message (consumer, message_id, received_at)"
          f" VALUES (%s, %s, {FAMILY.UTC_NOW} - {FAMILY.interval(age)})",
          consumer, message_id)


def _records(fetch):
    return sorted((r["consumer"], r["message_id"])
                  for r in fetch("SELECT consumer, message_id FROM inbox_message"))


def test_an_inbox_retains_its_own_old_records_one_process_at_a_time(db, db_url, fetch):
    for consumer in ("billing", "mail"):
        _received(fetch, consumer, "old", "2 HOUR")
        _received(fetch, consumer, "older", "3 DAY")
        _received(fetch, consumer, "young", "59 MINUTE")
    inbox = Inbox(db, "billing", retain=HOUR)
    twin = db_url.database()  # another process of the same consumer
    try:
        with try_lock(twin, "outbox_lite.inbox_retain/billing") as taken:
            assert taken
            started = time.monotonic()
            assert inbox.retain(now=True) == 0  # the twin's pass: skipped, no wait
            assert time.monotonic() - started < 1.0
            assert Inbox(db, "mail", retain=HOUR).retain() == 2  # another consumer's lock
        assert inbox.retain() == 0  # the skipped pass counts: the next is not due yet
        assert inbox.retain(now=True) == 2
    finally:
        twin.close()
    assert _records(fetch) == [("billing", "young"), ("mail", "young")]
    assert inbox.retain() == 0  # not due again yet
    assert Inbox(db, "billing").retain() == 0  # made without retain: keeps everything
    with db.atomic():
        with pytest.raises(OutboxError, match="outside any transaction"):
            inbox.retain(now=True)
    with db.atomic():  # accept never purges
        assert inbox.accept("new")
    assert ("billing", "new") in _records(fetch)


def test_a_purge_goes_on_when_another_deletes_its_rows_under_it(server_repo, fetch):
    """Two purges at once (an operator's and a relay's, or relays on two Galera nodes,
    whose named locks are each node's own): the rows of a page one has read may be gone
    before it reads where the next page starts."""
    ids = seed(server_repo, 35)
    _set(fetch, ids, "published", "2 HOUR")
    run = server_repo._run
    raced = []

    def racing_run(statement, **values):
        if statement is server_repo._sql.OLD_PUBLISHED_PAGES.key_of and not raced:
            raced.append(values["id"])  # the other purge deletes the page's last rows first
            fetch("DELETE FROM outbox_event WHERE id IN (%s, %s)", values["id"],
                  values["id"] - 1)
        return run(statement, **values)

    server_repo._run = racing_run  # type: ignore[method-assign]
    assert server_repo.purge_published(HOUR, batch_size=10) == 33
    assert raced == [ids[9]]
    assert _ids(fetch) == {}


def test_no_delete_of_a_purge_names_more_than_500_rows(db, server_repo, fetch):
    """MariaDB scans and locks the whole table for an IN list of 1,000 values or more
    (in_predicate_conversion_threshold): both purges cut theirs to 500, whatever the batch."""
    ids = seed(server_repo, 1200)
    _set(fetch, ids, "published", "2 HOUR")
    values = ", ".join(f"('c', 'm{n}', {FAMILY.UTC_NOW} - {FAMILY.interval('2 HOUR')})"
                       for n in range(1200))
    fetch(f"INSERT INTO inbox_message (consumer, message_id, received_at) VALUES {values}")
    with capture_sql(db) as statements:
        assert server_repo.purge_published(HOUR, batch_size=1200) == 1200
        assert Inbox(db, "c").purge(HOUR, batch_size=1200) == 1200
    deletes = [params for sql, params in statements if sql.lstrip().upper().startswith("DELETE")]
    # Parameters a DELETE binds, ids counted one by one (PostgreSQL's are one array): 500
    # ids and the cutoff (and the inbox's consumer).
    sizes = [sum(len(p) if isinstance(p, (list, tuple)) else 1 for p in params)
             for params in deletes]
    assert sizes == [501, 501, 201, 502, 502, 202], sizes
    assert _ids(fetch) == {} and _records(fetch) == []


def test_the_consuming_guides_retention_block_runs(db, fetch):
    """docs/guides/consuming.md's loop, as written, given its names: old records of the
    consumer go at the first call, the messages handled once each, a redelivery skipped."""
    _received(fetch, "billing", "last-week", "8 DAY")
    _received(fetch, "billing", "yesterday", "1 DAY")
    handled = []
    deliveries = [types.SimpleNamespace(id=i) for i in ("m1", "m2", "m1")]
    exec(block("docs/guides/consuming.md", "inbox.retain()", lang="python"),
         {"Inbox": Inbox, "dt": dt, "db": db, "deliveries": deliveries,
          "handle": lambda message: handled.append(message.id)})
    assert handled == ["m1", "m2"]
    assert _records(fetch) == [("billing", "m1"), ("billing", "m2"), ("billing", "yesterday")]
