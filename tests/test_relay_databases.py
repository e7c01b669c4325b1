"""``outbox-lite relay`` for several databases (issue 33, SPEC §13): ``--database-url [NAME=]URL``
repeated and ``--databases-file`` re-read on SIGHUP, run as a real process. What must hold:
the reachable databases are drained while one that cannot be reached is named (by its NAME,
never with its password) in the output and the metrics; a database added to the file gets a
relay, one removed has its relay stopped; names are checked before any SQL."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from outbox_lite import OutboxRepository
from outbox_lite.cli import main
from outbox_lite.relay import database_name

from _helpers import migrated_database, new_event, seed
from _redis import free_port
from _relays import TESTS, Watched

PASSWORD = "Sekr1t-pw-do-not-show"


def _relay(*args):
    """``outbox-lite relay`` in a process of its own, its output read as it comes."""
    return Watched(subprocess.Popen(
        [sys.executable, "-m", "outbox_lite.cli", "relay", "--publisher",
         "_relay_publishers:accepting", "--progress-every", "0.5", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)}))


def _until(condition, process, what, timeout=60.0):
    """Poll ``condition`` until it returns something true, with a deadline; fail with the
    process's stderr if it ends first or the deadline passes."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            pytest.fail(f"waited in vain for {what}: " + process.communicate()[1])
        time.sleep(0.02)
    return result


def _count(database, status):
    return database.execute_sql("SELECT COUNT(*) FROM outbox_event WHERE status = %s",
                                (status,)).fetchone()[0]


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(base):
    """/metrics as {(sample name, frozenset of labels): value}, and its text."""
    status, text = _get(f"{base}/metrics")
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) if family.name.startswith("outbox")
            for s in family.samples}, text


def _metrics_base(process):
    line = process.wait_for_line(lambda line: "; metrics on " in line, "the start-up line")
    return re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", line)[1]


def _stop(process):
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    return process.returncode, err


@pytest.fixture
def second_db(db_url):
    url = db_url.with_name(f"{db_url.name}_two")
    with migrated_database(url) as database:
        yield url, database


def test_an_unreachable_database_is_named_while_the_other_is_drained(db, db_url, repo):
    ids = seed(repo, 50)
    gone = dataclasses.replace(db_url, host="127.0.0.1", port=free_port(), hosts=(),
                               password=PASSWORD)
    relay = _relay("--database-url", f"here={db_url.secret_text()}",
                   "--database-url", f"gone={gone.secret_text()}", "--metrics-port", "0",
                   "--stats-every", "0.2")
    try:
        base = _metrics_base(relay)
        _until(lambda: _count(db, "published") == len(ids), relay, "the drain")
        relay.wait_for_line(lambda line: "/gone lost the database connection" in line,
                            "a line naming the unreachable database")

        def settled():
            samples, text = _samples(base)
            counted = ("outbox_relay_events_total",
                       frozenset({("database", "here"), ("outcome", "published")}))
            gauge = ("outbox_events", frozenset({("database", "here"), ("status", "published")}))
            return (samples.get(counted) == samples.get(gauge) == len(ids)
                    and (samples, text))

        samples, text = _until(settled, relay, "the metrics of the drain")
        assert samples[("outbox_relay_rounds_total", frozenset({("database", "gone")}))] == 0
        assert {dict(labels).get("database") for _, labels in samples} == {"here", "gone"}
        status, health = _get(f"{base}/healthz")
        assert status == 200, health  # trying to reach a database is no hang (SPEC §13)
        assert re.search(r"^here: .*: ok", health, re.M) and re.search(
            r"^gone: .*: waiting for its database for [0-9.]+ s \(", health, re.M), health
        code, err = _stop(relay)
    finally:
        relay.kill()
    assert code == 0, err
    assert _count(db, "pending") == _count(db, "processing") == 0
    assert "database gone (" in err and "its relay keeps trying" in err  # the start-up line
    for said in (err, text, health):
        assert PASSWORD not in said
    assert "Traceback" not in err


def test_sighup_starts_a_database_added_to_the_file_and_stops_one_removed(
        db, db_url, repo, second_db, tmp_path):
    two_url, two = second_db
    listing = tmp_path / "databases"
    listing.write_text(f"# the relay's databases\none={db_url.secret_text()}\n")
    relay = _relay("--databases-file", str(listing), "--metrics-port", "0")
    try:
        base = _metrics_base(relay)
        seed(repo, 5)
        _until(lambda: _count(db, "published") == 5, relay, "the first database's drain")
        two_repo = OutboxRepository(two)
        seed(two_repo, 7)
        assert _count(two, "pending") == 7  # no relay for it yet

        listing.write_text(f"one={db_url.secret_text()}\n\ntwo={two_url.secret_text()}\n")
        relay.send_signal(signal.SIGHUP)
        _until(lambda: _count(two, "published") == 7, relay, "the added database's drain")
        assert "two: " in _until(lambda: (h := _get(f"{base}/healthz"))[0] == 200 and h[1],
                                 relay, "/healthz naming both")

        listing.write_text("not a database url\n")  # a bad file changes nothing
        relay.send_signal(signal.SIGHUP)
        relay.wait_for_line(lambda line: "SIGHUP:" in line and "line 1" in line
                            and "go on as they were" in line, "the bad file's line")

        listing.write_text(f"one={db_url.secret_text()}\n")
        relay.send_signal(signal.SIGHUP)
        relay.wait_for_line(lambda line: "database two removed from" in line,
                            "the removed database's relay stopping")
        later = [new_event(two_repo, n).id for n in range(3)]
        marker = new_event(repo, 99).id
        # The process relays on (the first database's new event is published), and the
        # removed database's new events are nobody's.
        _until(lambda: db.execute_sql("SELECT status FROM outbox_event WHERE id = %s",
                                      (marker,)).fetchone()[0] == "published",
               relay, "the first database's new event")
        rows = two.execute_sql(
            "SELECT status, attempt_count, locked_by FROM outbox_event WHERE id IN"
            " (%s, %s, %s)", later).fetchall()
        assert sorted(rows) == [("pending", 0, None)] * 3
        status, health = _get(f"{base}/healthz")
        assert status == 200 and "two: " not in health and "one: " in health
        samples, text = _samples(base)
        assert {dict(labels).get("database") for _, labels in samples} == {"one"}
        code, err = _stop(relay)
    finally:
        relay.kill()
    assert code == 0, err
    assert _count(two, "processing") == 0 and _count(two, "published") == 7
    for said in (err, text, health):
        assert two_url.password == "" or two_url.password not in said


@pytest.mark.parametrize("values,words", [
    (["a={url}", "a={url}"], "two databases are called a"),
    (["{url}", "{url}"], "two databases are called"),
    (["a={url}", "b={url}"], "b is the database a is already"),
    (["b@d:x={url}"], "the NAME before = must be"),
    (["a=postgres:/x"], "unsupported URL scheme"),
])
def test_names_and_urls_are_checked_before_any_sql(values, words, capsys):
    url = f"mysql://root:{PASSWORD}@127.0.0.1:{free_port()}/db"  # unreachable: no SQL runs
    argv = ["relay", "--publisher", "_relay_publishers:accepting"]
    for value in values:
        argv += ["--database-url", value.format(url=url)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert PASSWORD not in err


def test_a_databases_file_goes_alone_and_names_a_database(tmp_path, capsys, db_url):
    listing = tmp_path / "databases"
    listing.write_text("# nothing yet\n\n")
    assert main(["relay", "--publisher", "_relay_publishers:accepting",
                 "--databases-file", str(listing)]) == 2
    assert "names no database" in capsys.readouterr().err
    assert main(["relay", "--publisher", "_relay_publishers:accepting", "--databases-file",
                 str(listing), "--database-url", db_url.secret_text()]) == 2
    assert "--databases-file goes without --database-url" in capsys.readouterr().err
    assert main(["relay", "--publisher", "_relay_publishers:accepting",
                 "--databases-file", str(tmp_path / "missing")]) == 1
    assert "cannot read it" in capsys.readouterr().err


def test_the_default_name_is_the_relay_groups(db, db_url):
    from outbox_lite.cli._databases import from_flags

    [database] = from_flags([db_url.secret_text()])
    assert database.name == database_name(db) == f"{db_url.host}:{db_url.port}/{db_url.name}"
