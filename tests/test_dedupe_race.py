"""A dedupe race whose first transaction rolls back (issue 21, "said nowhere").

Two services write an event with one ``dedupe_key`` at once: the second's INSERT waits for the
first transaction (the plain read before it cannot see an uncommitted key). When the first
rolls back, the second's INSERT goes on, and the lock it waited with is handed on to the gap
the removed key leaves in ``uq_outbox_event_dedupe_key`` (InnoDB's lock inheritance, on both
servers): until the survivor's transaction ends, other writers' events whose ``dedupe_key``
sorts in that gap wait for it. No statement of ours avoids it; the README says so beside the
inbox's same note. A wait shows as the lock-wait error (MySQL 1205, PostgreSQL 55P03) after
the probes' lock wait limit of 1 s. PostgreSQL has no gap locks: there the survivor makes only
its own key wait, and the other writers go on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest

from outbox_lite import LockConflictError, OutboxRepository

from _helpers import FAMILY
from _sessions import ThreadSession

README = Path(__file__).resolve().parent.parent / "docs" / "guides" / "producing.md"


class Writer(ThreadSession):
    """A thread session that writes events; its lock waits end after ``wait`` s."""

    def __init__(self, db_url: Any, wait: int = 1) -> None:
        super().__init__(db_url, wait)
        self.repo = OutboxRepository(self.db)

    def create(self, key: str) -> int:
        return self.repo.create_in_transaction(event_type="e", aggregate_type="a",
                                               aggregate_id=key, payload={}, dedupe_key=key).id

    def end(self, commit: bool) -> None:
        if commit:
            self.commit()
        else:
            self.rollback()


@pytest.fixture
def writers(db_url):
    made: list[Writer] = []

    def make(wait: int = 1) -> Writer:
        made.append(Writer(db_url, wait))
        return made[-1]

    yield make
    for writer in made:
        writer.close()


def probe(writers: Callable[..., Writer], keys: list[str], isolation: str) -> dict[str, Any]:
    """Write an event with each key in a new transaction (rolled back): its id's truth, or
    the errno of the LockConflictError it met."""
    answers: dict[str, Any] = {}
    for key in keys:
        writer = writers()
        writer.begin(isolation)
        try:
            answers[key] = bool(writer.run(writer.create, key))
        except LockConflictError as exc:
            answers[key] = exc.errno
        finally:
            writer.end(commit=False)
    return answers


def _until_waiting(fetch, writer: Writer) -> None:
    """Until ``writer``'s transaction waits for a row lock (FAMILY.waits_for_lock)."""
    deadline = time.monotonic() + 10
    while not FAMILY.waits_for_lock(fetch, writer.connection_id):
        assert time.monotonic() < deadline, "the second writer never waited"
        time.sleep(0.15)


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "READ COMMITTED"])
def test_the_survivor_of_a_rolled_back_race_holds_the_gap_until_it_ends(writers, fetch,
                                                                        isolation):
    bounds = writers()
    bounds.begin(isolation)
    bounds.run(bounds.create, "k2")
    bounds.run(bounds.create, "k8")
    bounds.end(commit=True)
    assert probe(writers, ["k4", "k6"], isolation) == {"k4": True, "k6": True}  # no race

    first, survivor = writers(), writers(wait=30)
    first.begin(isolation)
    first.run(first.create, "k5")
    survivor.begin(isolation)
    racing = survivor.start(survivor.create, "k5")
    _until_waiting(fetch, survivor)
    first.end(commit=False)
    assert racing.result(timeout=30) > 0  # the survivor's event is written
    # InnoDB: its lock was handed on to the gap between the committed neighbours k2 and k8.
    # PostgreSQL: no gap locks, nobody else waits.
    gap = FAMILY.LOCK_WAIT if FAMILY.GAP_LOCKS else True
    assert probe(writers, ["k4", "k6", "k1", "k9"], isolation) == {
        "k4": gap, "k6": gap, "k1": True, "k9": True}
    survivor.end(commit=True)
    assert probe(writers, ["k4", "k6"], isolation) == {"k4": True, "k6": True}
    assert [r["dedupe_key"] for r in fetch(
        "SELECT dedupe_key FROM outbox_event ORDER BY dedupe_key")] == ["k2", "k5", "k8"]


def test_the_readme_says_so_beside_the_inbox_note():
    text = README.read_text(encoding="utf-8")
    errors = text[text.index("`DuplicateEventError` (`.dedupe_key`"):]
    errors = errors[:errors.index("## A COMMIT that fails")]
    assert "rolls back" in errors and "gap" in errors and "tests/test_dedupe_race.py" in errors
