"""Bodies of worker processes for the fault tests (spawned, so importable at top level)."""

from __future__ import annotations

import signal
from typing import Any

from outbox_lite import DuplicateEventError, OutboxRepository
from outbox_lite._families.url import DatabaseUrl


def claim_then_hang(url: str, name: str, limit: int, ready: Any) -> None:
    """Claim a batch, "publish" all of it to the sink, mark half published, then hang
    holding the rest until the parent kills the process with SIGKILL."""
    database = DatabaseUrl.parse(url).database()
    repo = OutboxRepository(database)
    with database.atomic():
        batch = repo.claim_batch(name, limit=limit)
    if batch:
        database.execute_sql(
            "INSERT INTO sink (event_id, worker) VALUES "
            + ", ".join(["(%s, %s)"] * len(batch)),
            [v for e in batch for v in (e.id, name)])
    for event in batch[: len(batch) // 2]:
        repo.mark_published(event.id, name)
    ready.put((name, [e.id for e in batch]))
    signal.pause()  # hold the claims until the parent's SIGKILL; nothing waits for an expiry


def insert_key(url: str, key: str, barrier: Any, results: Any) -> None:
    """Race to insert the event with ``key`` together with a business row."""
    database = DatabaseUrl.parse(url).database()
    repo = OutboxRepository(database)
    barrier.wait(timeout=60)
    try:
        with database.atomic():
            database.execute_sql("INSERT INTO job (name) VALUES (%s)", (key,))
            repo.create_in_transaction(event_type="order.placed", aggregate_type="order",
                                       aggregate_id=key, payload={}, dedupe_key=key)
        results.put("inserted")
    except DuplicateEventError:
        results.put("duplicate")
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"error: {type(exc).__name__}: {exc}")
    finally:
        database.close()


def command(argv: list[str], stderr_path: str) -> None:
    """``outbox-lite ARGV`` in this process, its stderr going to ``stderr_path`` and its exit
    status to ``stderr_path + ".status"``, then exits with it (for processes forked by a
    forkserver that imported the CLI once). The status file, because a forkserver under load
    may lose a child's status and report 255 (python/cpython#140867)."""
    import os
    import sys
    from pathlib import Path

    os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
    from outbox_lite.cli import main

    status = main(argv)
    Path(stderr_path + ".status").write_text(str(status))
    sys.exit(status)
