"""The README's example and the docs' usage snippets run verbatim after the setup of
docs/getting-started.md: the hand-written loop, the relay's (README.md and
docs/guides/relay.md, which needs Redis at 127.0.0.1:6379), RabbitMQ's and NATS's, which
print what a consumer receives, as their pages say they do, the metrics' and the inbox's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from outbox_lite._db import DEFAULT_URL
from outbox_lite._families.url import DatabaseUrl

from _docs import CONNECT, ROOT, URLS, block as docs_block, connect, family_blocks
from _helpers import FAMILY

README = ROOT / "README.md"


def _page(name: str) -> Path:
    return ROOT / name


def _first_python_block() -> str:
    """The hand-written loop of docs/guides/worker-loop.md."""
    return docs_block("docs/guides/worker-loop.md", "claim_batch(me", "while True:", lang="python")


def _relay_block() -> str:
    """README.md's example, which docs/guides/relay.md prints too, identical."""
    readme = docs_block("README.md", "Relay(outbox, publisher)", "BullMQPublisher(",
                        lang="python")
    assert docs_block("docs/guides/relay.md", "Relay(outbox, publisher)", "BullMQPublisher(",
                      lang="python") == readme
    return readme


def test_the_connection_is_what_the_setup_made():
    """The programs connect to the database the setup's ``outbox-lite migrate`` made: on
    MySQL and MariaDB the command's default URL; on PostgreSQL the URL the pages set in
    ``OUTBOX_DATABASE_URL`` first (the default stays MySQL's)."""
    default = DatabaseUrl.parse(DEFAULT_URL)
    assert (default.name, default.host, default.port, default.user, default.password) == (
        "outbox_lite", "127.0.0.1", 3306, "root", "")
    setup = DatabaseUrl.parse(URLS[FAMILY.name])
    assert (setup.name, setup.host, setup.user, setup.password) == (
        "outbox_lite", "127.0.0.1", {"mysql": "root", "postgresql": "postgres"}[FAMILY.name], "")
    assert setup.port == {"mysql": 3306, "postgresql": 5432}[FAMILY.name]
    if FAMILY.name == "mysql":
        assert setup == default
    else:  # both pages that run `outbox-lite migrate` first tell the reader to set the URL
        for page in ("README.md", "docs/getting-started.md"):
            assert f"OUTBOX_DATABASE_URL={URLS['postgresql']}" in (ROOT / page).read_text(
                encoding="utf-8"), page
    assert _first_python_block().count(CONNECT) == 1
    assert f'"{setup.name}", host="{setup.host}", user="{setup.user}"' in CONNECT


def test_the_first_usage_snippet_runs_as_written(db_url, fetch, tmp_path):
    """Run twice on a migrated database of its own, so a second run must work too."""
    ours = connect(db_url)
    script = tmp_path / "readme_usage.py"
    script.write_text(_first_python_block().replace(CONNECT, ours), encoding="utf-8")
    for job_id in (1, 2):
        result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, timeout=60,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout == f"published job.created {{'job_id': {job_id}}}\n"
    assert fetch("SELECT id, name FROM job ORDER BY id") == [
        {"id": 1, "name": "resize"}, {"id": 2, "name": "resize"}]
    rows = fetch("SELECT aggregate_id, status, attempt_count, payload FROM outbox_event"
                 " ORDER BY id")
    assert [{**row, "payload": json.loads(row["payload"])} for row in rows] == [
        {"aggregate_id": str(n), "status": "published", "attempt_count": 1,
         "payload": {"job_id": n}} for n in (1, 2)]


def test_the_relay_snippet_runs_as_written(db_url, fetch, tmp_path, rds, queue):
    block = _relay_block()
    assert block.count(CONNECT) == 1 and block.count('"domain-events"') == 1
    ours = connect(db_url)
    script = tmp_path / "readme_relay.py"
    script.write_text(block.replace(CONNECT, ours).replace('"domain-events"', repr(queue)),
                      encoding="utf-8")
    for _ in range(2):
        result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, timeout=60,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
    assert fetch("SELECT aggregate_id, status, dedupe_key FROM outbox_event ORDER BY id") == [
        {"aggregate_id": str(n), "status": "published", "dedupe_key": f"job.created:{n}"}
        for n in (1, 2)]
    for n in (1, 2):  # what the README and the relay's page say a BullMQ worker gets
        job = rds.hgetall(f"bull:{queue}:outbox-job.created%3A{n}")
        assert job["name"] == "job.created" and json.loads(job["data"]) == {"job_id": n}, job
    assert rds.llen(f"bull:{queue}:wait") == 2


def _broker_block(marker: str, page: str) -> tuple[str, str]:
    """The python block holding ``marker`` and what its page says it prints."""
    [found] = [b for b in family_blocks(page) if b.lang == "python" and marker in b.code]
    block = found.code
    lines = _page(page).read_text(encoding="utf-8").split("\n")
    after = "\n".join(line.strip() for line in lines[found.line + block.count("\n"):])
    printed = re.search(r"It prints `(.*?)`\n?\(", after, re.DOTALL)
    assert printed, f"{page} does not say what the {marker} block prints"
    return block, " ".join(printed.group(1).split())


def _run_block(block: str, tmp_path) -> str:
    script = tmp_path / "readme_broker.py"
    script.write_text(block, encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, timeout=60,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return " ".join(result.stdout.split())


def test_the_rabbitmq_snippet_runs_as_written_and_prints_what_it_says(db_url, fetch, tmp_path):
    from _brokers import Exchange, SHARED_RABBITMQ

    block, printed = _broker_block("RabbitMQPublisher(", "docs/guides/rabbitmq.md")
    assert block.count(CONNECT) == 1
    target = Exchange(SHARED_RABBITMQ, f"readme-{db_url.name}", f"readme-{db_url.name}-q")
    try:
        out = _run_block(block.replace(CONNECT, connect(db_url))
                         .replace('"orders"', repr(target.name))
                         .replace('"billing"', repr(target.queue)), tmp_path)
        assert out == printed
        assert target.depth() == 0  # the one message was read
    finally:
        target.delete()
    assert fetch("SELECT status FROM outbox_event") == [{"status": "published"}]


def test_the_nats_snippet_runs_as_written_and_prints_what_it_says(db_url, fetch, tmp_path):
    from _brokers import SHARED_NATS, Stream

    block, printed = _broker_block("NATSPublisher(", "docs/guides/nats.md")
    assert block.count(CONNECT) == 1
    prefix = f"readme-{db_url.name}".replace("_", "-")
    target = Stream(SHARED_NATS, f"README_{db_url.name}", prefix, [f"{prefix}.>"])
    try:
        out = _run_block(block.replace(CONNECT, connect(db_url))
                         .replace('"SHOP"', repr(target.name))
                         .replace('"shop.>"', repr(f"{prefix}.>"))
                         .replace('"shop.order.paid"', repr(f"{prefix}.order.paid"))
                         .replace('"shop"', repr(prefix)), tmp_path)
        assert out == printed.replace("shop.", f"{prefix}.", 1)
        assert target.count() == 1
    finally:
        target.delete()
    assert fetch("SELECT status FROM outbox_event") == [{"status": "published"}]


def test_the_metrics_snippet_runs_after_the_relay_snippets_setup(db_url, fetch, tmp_path,
                                                                 queue):
    """The metrics block in place of the relay block's last two lines: it publishes the
    setup's event and prints the counter that says so."""
    metrics_block = docs_block("docs/guides/metrics.md", "RelayMetrics(registry)", lang="python")
    setup = _relay_block().split("with BullMQPublisher(")[0]
    script = tmp_path / "readme_metrics.py"
    script.write_text((setup + metrics_block).replace(CONNECT, connect(db_url))
                      .replace('"domain-events"', repr(queue))
                      .replace("metrics.serve(9464)", "metrics.serve(0)"), encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, timeout=60,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "1.0\n"
    assert fetch("SELECT status FROM outbox_event") == [{"status": "published"}]


def test_the_inbox_snippet_runs_as_written(db_url, fetch, tmp_path):
    """Run twice: the second run's first delivery is a redelivery too, and writes nothing."""
    block = docs_block("docs/guides/consuming.md", 'Inbox(db, "billing")', lang="python")
    assert block.count(CONNECT) == 1
    script = tmp_path / "readme_inbox.py"
    script.write_text(block.replace(CONNECT, connect(db_url)), encoding="utf-8")
    for expected in ("True\nFalse\n", "False\nFalse\n"):
        result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, timeout=60,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout == expected
    assert fetch("SELECT order_id FROM payment") == [{"order_id": 42}]
    assert fetch("SELECT consumer, message_id FROM inbox_message") == [
        {"consumer": "billing", "message_id": "outbox-order.paid%3A42"}]
