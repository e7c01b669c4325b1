"""The relay's /metrics and /healthz (SPEC §8), scraped over HTTP from a running relay (an
``outbox-lite relay`` process, and a Relay in this process with a registry of its own) and
read back with prometheus_client's own parser, against the database's ledger."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from outbox_lite import InvalidEventError
from outbox_lite.metrics import LAG_BUCKETS, RelayMetrics
from outbox_lite.relay import Relay

from _helpers import seed

TESTS = Path(__file__).resolve().parent
FAMILIES = {  # SPEC §8: name (as the parser names it) -> kind
    "outbox_relay_events": "counter", "outbox_relay_released": "counter",
    "outbox_relay_publish_errors": "counter", "outbox_relay_rounds": "counter",
    "outbox_relay_publish_seconds": "histogram", "outbox_relay_lag_seconds": "histogram",
    "outbox_events": "gauge", "outbox_oldest_pending_age_seconds": "gauge",
    "outbox_held_back_events": "gauge",
    # SPEC §13: retention
    "outbox_relay_retained": "counter", "outbox_oldest_published_age_seconds": "gauge"}
LABELS = {"outcome": {"published", "retried", "dead", "lost", "expired"},
          "status": {"pending", "processing", "published", "failed"}}


def _get(url: str) -> tuple[int, str]:
    """(status, body) of a GET with the standard library's HTTP client."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _scrape(base: str) -> dict[str, Any]:
    """/metrics parsed by prometheus_client: {family: {(sample name, labels): value}}."""
    status, text = _get(f"{base}/metrics")
    assert status == 200, text
    families = {}
    for family in text_string_to_metric_families(text):
        if family.name in FAMILIES:
            assert family.type == FAMILIES[family.name], family
            families[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value
                                     for s in family.samples}
    return families


def _value(families, family, sample=None, **labels):
    return families[family][(sample or family, tuple(sorted(labels.items())))]


def _histogram(families, family):
    """(count, sum, {le: cumulative count}) of a histogram family."""
    buckets = {dict(labels)["le"]: value for (name, labels), value in families[family].items()
               if name == f"{family}_bucket"}
    return (_value(families, family, f"{family}_count"), _value(families, family,
                                                                  f"{family}_sum"), buckets)


def _assert_bounded_labels(families):
    for family, samples in families.items():
        for _, labels in samples:
            for name, value in labels:
                if name == "le":
                    assert value == "+Inf" or float(value) >= 0
                else:
                    assert value in LABELS[name], (family, name, value)


def _assert_gauges_are(families, stats, *, same_clock=True):
    """The gauges say ``stats``; without ``same_clock`` (the relay on the server's clock, the
    test's repository on a fake one), the oldest publish's age only as a recent one."""
    for status in LABELS["status"]:
        assert _value(families, "outbox_events", status=status) == stats.counts[status]
    age = stats.oldest_pending_age
    assert _value(families, "outbox_oldest_pending_age_seconds") == (
        0.0 if age is None else age.total_seconds())
    assert _value(families, "outbox_held_back_events") == stats.held_back
    kept, seen = stats.oldest_published_age, _value(families,
                                                    "outbox_oldest_published_age_seconds")
    if same_clock:
        assert seen == (0.0 if kept is None else kept.total_seconds())
    else:
        assert 0.0 <= seen < 600.0


# ---------------------------------------------------------------------------
# An `outbox-lite relay` process
# ---------------------------------------------------------------------------

class _RelayProcess:
    """``outbox-lite relay --metrics-port 0`` with its stderr read line by line by a
    thread (so it never blocks on a full pipe); ``base`` is its metrics address."""

    def __init__(self, db_url, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
             db_url.secret_text(), "--metrics-port", "0", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(TESTS), **(env or {})})
        self.lines: list[str] = []
        first = self.process.stderr.readline()
        self.lines.append(first)
        found = re.search(r"; metrics on (http://127\.0\.0\.1:\d+)/metrics$", first.strip())
        assert found, first + self.process.stderr.read()
        self.base = found.group(1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)

    def progress(self) -> list[dict[str, int]]:
        """The counts of each progress line so far."""
        found = []
        for line in list(self.lines):
            m = re.search(r": (\d+) published, (\d+) retried, (\d+) dead, (\d+) lost, (\d+)"
                          r" released, (\d+) publish errors in (\d+) rounds \((\d+) expired",
                          line)
            if m:
                found.append(dict(zip(("published", "retried", "dead", "lost", "released",
                                       "publish_errors", "rounds", "expired"),
                                      map(int, m.groups()))))
        return found

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _until(condition, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"waited in vain for {what}"
        time.sleep(0.05)
    return result


def test_a_relay_process_counts_what_the_database_records(db, db_url, repo, fetch):
    ids = seed(repo, 240)
    relay = _RelayProcess(db_url, "--publisher", "_relay_publishers:flaky", "--batch-size",
                          "25", "--stats-every", "0.2", "--progress-every", "0.2")
    try:
        # Drained: every event published or dead (ids divisible by 5 retry once, after the
        # default backoff of about a second; those divisible by 11 are dead at once).
        _until(lambda: fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status IN"
                             " ('pending', 'processing')") == [{"n": 0}], "the drain")
        ledger = {r["status"]: r for r in fetch(
            "SELECT status, COUNT(*) AS n, SUM(attempt_count) AS attempts FROM outbox_event"
            " GROUP BY status")}
        published, dead = ledger["published"]["n"], ledger["failed"]["n"]
        assert dead == len([i for i in ids if i % 11 == 0]) and published + dead == 240
        attempts = sum(int(r["attempts"]) for r in ledger.values())
        stats = repo.stats()

        def settled():  # the last batch recorded, the gauges read after it
            families = _scrape(relay.base)
            if (_value(families, "outbox_relay_events", "outbox_relay_events_total",
                       outcome="published") == published
                    and "outbox_events" in families
                    and _value(families, "outbox_events", status="published") == published):
                return families
            return None

        families = _until(settled, "the metrics to reach the ledger")
        assert set(families) == set(FAMILIES)
        _assert_bounded_labels(families)
        events = {o: _value(families, "outbox_relay_events", "outbox_relay_events_total",
                            outcome=o) for o in LABELS["outcome"]}
        assert events == {"published": published, "dead": dead,
                          "retried": attempts - published - dead, "lost": 0, "expired": 0}
        assert events["retried"] == len([i for i in ids if i % 5 == 0 and i % 11])
        assert _value(families, "outbox_relay_publish_errors",
                      "outbox_relay_publish_errors_total") == 0
        assert _value(families, "outbox_relay_released", "outbox_relay_released_total") == 0
        rounds = _value(families, "outbox_relay_rounds", "outbox_relay_rounds_total")
        lag_count, lag_sum, lag_buckets = _histogram(families, "outbox_relay_lag_seconds")
        assert lag_count == published == lag_buckets["+Inf"] and lag_sum > 0
        assert list(lag_buckets.values()) == sorted(lag_buckets.values())
        publishes, _, _ = _histogram(families, "outbox_relay_publish_seconds")
        assert 240 / 25 + 1 <= publishes <= rounds  # batches of 25, then the retried ones
        _assert_gauges_are(families, stats, same_clock=False)
        assert _get(f"{relay.base}/healthz")[0] == 200
        # The progress lines say the same counts (rounds go on while the relay idles).
        line = _until(lambda: [p for p in relay.progress() if p["published"] == published],
                      "a progress line after the drain")[-1]
        assert {k: line[k] for k in events} == events
        assert line["publish_errors"] == 0 and line["released"] == 0
        assert relay.stop() == 0
        assert relay.progress()[-1]["rounds"] >= rounds
        assert "Traceback" not in "".join(relay.lines)
    finally:
        relay.kill()


def test_a_relay_process_is_unhealthy_while_its_publisher_hangs(db, db_url, repo, tmp_path):
    seed(repo, 10)
    relay = _RelayProcess(db_url, "--publisher", "_relay_publishers:gated", "--stuck-after",
                          "1", env={"OUTBOX_TEST_GATE": str(tmp_path)})
    try:
        _until(lambda: (tmp_path / "entered").exists(), "the publish")  # it hangs there
        status, body = _until(lambda: (r := _get(f"{relay.base}/healthz"))[0] == 503 and r,
                              "/healthz to say 503")
        assert body.startswith("stuck\n") and "no progress for" in body
        (tmp_path / "go").write_text("go")  # the publish returns
        status, body = _until(lambda: (r := _get(f"{relay.base}/healthz"))[0] == 200 and r,
                              "/healthz to say 200 again")
        assert body.startswith("ok\n")
        assert relay.stop() == 0
    finally:
        relay.kill()


@pytest.mark.parametrize("args,words", [
    (["--stats-every", "5"], "--stats-every goes with --metrics-port"),
    (["--metrics-host", "0.0.0.0", "--stuck-after", "9"],
     "--metrics-host and --stuck-after go with --metrics-port"),
    (["--metrics-port", "70000"], "a port is from 0 to 65535"),
])
def test_metrics_flags_that_do_not_fit_are_one_line(db_url, args, words):
    result = subprocess.run(
        [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
         db_url.secret_text(), "--publisher", "_relay_publishers:flaky", *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert result.returncode == 2, result.stderr
    assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_port_in_use_is_one_line(db_url):
    with RelayMetrics(CollectorRegistry()).serve(0) as taken:
        result = subprocess.run(
            [sys.executable, "-m", "outbox_lite.cli", "relay", "--database-url",
             db_url.secret_text(), "--publisher", "_relay_publishers:flaky",
             "--metrics-port", str(taken.port)],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on 127.0.0.1:{taken.port}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------
# A Relay in this process, with a registry of its own
# ---------------------------------------------------------------------------

class _Rejecting:
    """Publishes nowhere; rejects for good the events whose payload says so."""

    def publish(self, events):
        from _relay_publishers import Rejected

        return {e.id: Rejected("no") for e in events if e.payload.get("reject")}

    def close(self):
        pass


def test_an_in_process_relay_with_its_own_registry(db, repo, clock, fetch, relay_of):
    # Four aggregates of five events; the second event of aggregate 0 is rejected, so the
    # three behind it wait (ordered claims). Every event became available at T0; the relay
    # runs 3 s later by the injected clock: every lag is exactly 3 s.
    with db.atomic():
        for n in range(20):
            repo.create_in_transaction(event_type="job.created", aggregate_type="job",
                                       aggregate_id=str(n % 4), payload={"reject": n == 4})
    clock.advance(seconds=3)
    registry = CollectorRegistry()
    metrics = RelayMetrics(registry, stats_every=3600)
    relay = relay_of(repo, _Rejecting(), worker_id="relay-m", ordered=True, metrics=metrics)
    relay.run(until_empty=True)  # returns once only the held-back events are left
    stats = repo.stats()
    assert (stats.counts["published"], stats.counts["failed"], stats.held_back) == (16, 1, 3)
    with metrics.serve(0) as server:
        families = _scrape(f"http://127.0.0.1:{server.port}")
        health = _get(f"http://127.0.0.1:{server.port}/healthz")
        assert _get(f"http://127.0.0.1:{server.port}/nothing")[0] == 404
    assert set(families) == set(FAMILIES)
    _assert_bounded_labels(families)
    assert {o: _value(families, "outbox_relay_events", "outbox_relay_events_total", outcome=o)
            for o in LABELS["outcome"]} == {"published": 16, "dead": 1, "retried": 0, "lost": 0,
                                       "expired": 0}
    assert _value(families, "outbox_relay_rounds", "outbox_relay_rounds_total") == \
        relay.stats.rounds
    count, total, buckets = _histogram(families, "outbox_relay_lag_seconds")
    assert (count, total) == (16, 48.0)
    assert buckets["2.5"] == 0 and buckets["5.0"] == 16 and buckets["+Inf"] == 16
    assert len(buckets) == len(LAG_BUCKETS) + 1
    _assert_gauges_are(families, stats)  # read by the relay's last check for work
    assert _value(families, "outbox_oldest_pending_age_seconds") == 3.0  # held back since T0
    assert health == (503, "stuck\nrelay-m: not running\nno relay is running\n")
    assert "outbox_relay_events" not in {m.name for m in REGISTRY.collect()}  # its own only


class _Blocking:
    """Publishes nowhere; each publish waits until the test opens the gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()

    def publish(self, events):
        self.entered.set()
        assert self.gate.wait(timeout=60)
        return {}

    def close(self):
        pass


def test_healthz_turns_503_while_a_publish_hangs_and_200_after(db, repo):
    metrics = RelayMetrics(CollectorRegistry())
    publisher = _Blocking()
    relay = Relay(repo, publisher, worker_id="relay-h", progress_every=0, metrics=metrics,
                  stuck_after=0.5, idle_pause=0.01, max_idle_pause=1.0)
    stop = threading.Event()
    worker = threading.Thread(target=relay.run, args=(stop,))
    with metrics.serve(0) as server:
        healthz = f"http://127.0.0.1:{server.port}/healthz"
        assert _get(healthz) == (503, "stuck\nrelay-h: not running\nno relay is running\n")
        worker.start()
        try:
            # Idle, with pauses growing to 1 s, longer than stuck_after: a pause is not a hang.
            _until(lambda: relay.running, "the relay to run")
            for _ in range(30):
                assert _get(healthz)[0] == 200
                time.sleep(0.05)
            seed(repo, 1)
            assert publisher.entered.wait(timeout=30)
            status, body = _until(lambda: (r := _get(healthz))[0] == 503 and r, "a 503")
            assert re.fullmatch(r"stuck\nrelay-h: stuck: no progress for [\d.]+ s \(more than"
                                r" 0.5 s\)\n", body), body
            assert relay.progress_age() > 0.5
            publisher.gate.set()
            status, body = _until(lambda: (r := _get(healthz))[0] == 200 and r, "a 200")
            assert body.startswith("ok\nrelay-h: ok (last progress ")
        finally:
            publisher.gate.set()
            stop.set()
            worker.join(timeout=30)
        assert relay.stats.published == 1
        assert _get(healthz)[0] == 503  # stopped: no relay is running


def test_two_relays_share_one_registrys_metrics_and_a_second_is_refused(db, repo, clock):
    registry = CollectorRegistry()
    metrics = RelayMetrics(registry)
    with pytest.raises(InvalidEventError, match="one RelayMetrics"):
        RelayMetrics(registry)
    seed(repo, 30)
    clock.advance(seconds=1.5)
    relays = [Relay(repo, _Rejecting(), worker_id=f"relay-{n}", batch_size=10,
                    progress_every=0, metrics=metrics) for n in range(2)]
    results = [relays[n % 2].run_once() for n in range(4)]  # each records its own batch
    assert sum(r.published for r in results) == 30
    lag = {s.name: s.value for f in registry.collect() for s in f.samples
           if s.name.startswith("outbox_relay_lag_seconds_")}
    assert (lag["outbox_relay_lag_seconds_count"], lag["outbox_relay_lag_seconds_sum"]) == (
        30, 45.0)
    samples = {s.name: s.value for family in registry.collect() for s in family.samples
               if s.name.startswith("outbox_relay_events") or s.name.endswith("rounds_total")}
    assert samples["outbox_relay_rounds_total"] == 4
    assert sum(r.stats.rounds for r in relays) == 4
    published = [s.value for f in registry.collect() for s in f.samples
                 if s.name == "outbox_relay_events_total" and s.labels["outcome"] == "published"]
    assert published == [30] == [sum(r.stats.published for r in relays)]


@pytest.mark.parametrize("options,error,words", [
    ({"stats_every": 0}, InvalidEventError, "stats_every"),
    ({"lag_buckets": (1, 0.5)}, InvalidEventError, "lag buckets"),
    ({"publish_buckets": ()}, InvalidEventError, "publish buckets"),
    ({"registry": object()}, TypeError, "CollectorRegistry"),
])
def test_bad_metrics_options_are_refused(options, error, words):
    options.setdefault("registry", CollectorRegistry())
    with pytest.raises(error, match=words):
        RelayMetrics(**options)


def test_a_relay_refuses_metrics_that_are_not_an_observer(db, repo):
    with pytest.raises(TypeError, match="RelayObserver"):
        Relay(repo, _Rejecting(), metrics=object())
    with pytest.raises(InvalidEventError, match="stuck_after"):
        Relay(repo, _Rejecting(), stuck_after=0)


def test_the_default_stuck_after_is_the_lock_timeout_and_at_least_ten_seconds(db, repo):
    assert Relay(repo, _Rejecting()).stuck_after == 300
    assert Relay(repo, _Rejecting(), lock_timeout=2).stuck_after == 10
    assert dt.timedelta(seconds=Relay(repo, _Rejecting(), stuck_after=42).stuck_after) == \
        dt.timedelta(seconds=42)


def test_the_readmes_alert_rules_name_only_metrics_the_relay_exports():
    readme = (TESTS.parent / "docs" / "guides" / "metrics.md").read_text(encoding="utf-8")
    [rules] = re.findall(r"^```yaml\n(groups:.*?)^```$", readme, re.DOTALL | re.MULTILINE)
    named = set(re.findall(r"\b(outbox_[a-z_]+)", rules))
    exported = set()
    for name, kind in FAMILIES.items():
        exported |= ({f"{name}_total"} if kind == "counter" else
                     {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram"
                     else {name})
    assert named and named <= exported, named - exported
    assert {"outbox_oldest_pending_age_seconds", "outbox_relay_lag_seconds_bucket",
            "outbox_events", "outbox_held_back_events"} <= named  # what the README names


def test_metrics_by_database_label_every_family_and_answer_health_for_each(db, repo):
    metrics = RelayMetrics(CollectorRegistry())
    orders = Relay(repo, _Rejecting(), metrics=metrics.database("orders"), progress_every=0)
    billing = Relay(repo, _Rejecting(), metrics=metrics.database("billing"), progress_every=0)
    seed(repo, 3)
    orders.run_once()
    assert db.execute_sql("SELECT COUNT(*) FROM outbox_event WHERE status = 'published'"
                          ).fetchone()[0] == 3
    families = {f.name: f for f in metrics.registry.collect()}
    for family in families.values():
        assert {s.labels.get("database") for s in family.samples} <= {"orders", "billing"}
    events = {(s.labels["database"], s.labels["outcome"]): s.value
              for s in families["outbox_relay_events"].samples}
    assert events[("orders", "published")] == 3 and events[("billing", "published")] == 0
    healthy, lines = metrics.health()  # neither relay runs: not healthy, each named
    assert not healthy and lines[0].startswith("billing: ") and any(
        line.startswith("orders: ") for line in lines)
    with pytest.raises(InvalidEventError, match="database"):
        Relay(repo, _Rejecting(), metrics=metrics)  # unlabelled beside labelled: refused
    metrics.forget("billing")
    assert all(s.labels.get("database") != "billing"
               for f in metrics.registry.collect() for s in f.samples)
    unlabelled = RelayMetrics(CollectorRegistry())
    kept = Relay(repo, _Rejecting(), metrics=unlabelled, progress_every=0)
    with pytest.raises(InvalidEventError, match="database"):
        unlabelled.database("orders")
    with pytest.raises(InvalidEventError):
        RelayMetrics(CollectorRegistry()).database("")
    assert billing.worker_id != orders.worker_id != kept.worker_id
