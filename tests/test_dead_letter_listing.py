"""``outbox-lite dead-letters`` with no action lists the dead letters (issue 17): what an
operator needs to decide (id, type, aggregate, code, the stored message, attempts, age), never
the payload; bounded by --limit; --json with each message in full."""

from __future__ import annotations

import datetime as dt
import json

from outbox_lite.cli import main

from _helpers import FAMILY, new_event


def _dead_letter(repo, n, code, message, attempts=1, failed_ago=None, fetch=None):
    event = new_event(repo, n, payload={"card": f"secret-card-{n}"})
    for attempt in range(attempts):
        assert repo.mark_processing(event.id, "w")
        last = attempt == attempts - 1
        assert repo.mark_failed(event.id, "w", code, message, retryable=not last)
        if not last:  # the retry's backoff passes (set through SQL)
            fetch("UPDATE outbox_event SET available_at = available_at"
                  f" - {FAMILY.interval('1 DAY')} WHERE id = %s", event.id)
    if failed_ago is not None:
        when = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - failed_ago
        fetch("UPDATE outbox_event SET updated_at = %s WHERE id = %s", when, event.id)
    return event.id


def test_the_listing_says_what_an_operator_needs_and_never_the_payload(
        db, db_url, repo, fetch, capsys):
    url = ["--database-url", db_url.secret_text()]
    assert main(["dead-letters", *url]) == 0
    assert capsys.readouterr().out == "no dead letters\n"
    a = _dead_letter(repo, 1, "http_500", "the broker said 500\nretry later", attempts=3,
                     failed_ago=dt.timedelta(hours=2, minutes=5), fetch=fetch)
    b = _dead_letter(repo, 2, "rejected", "password=hunter2 was refused \x1b[31mred",
                     failed_ago=dt.timedelta(seconds=90), fetch=fetch)
    c = _dead_letter(repo, 3, "rejected", "x" * 500, failed_ago=dt.timedelta(days=3),
                     fetch=fetch)
    new_event(repo, 4)  # pending: not listed

    assert main(["dead-letters", *url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "EVENT", "TYPE", "AGGREGATE", "CODE", "ATTEMPTS",
                                "FAILED", "MESSAGE"]
    assert lines[1].split()[:8] == [str(a), "job.created", "ai_job:1", "http_500", "3", "2h",
                                    "5m", "ago"]
    assert lines[1].endswith("  the broker said 500\\nretry later")  # one line each
    assert lines[2].split()[:7] == [str(b), "job.created", "ai_job:2", "rejected", "1", "1m",
                                    "30s"]
    assert "hunter2" not in lines[2] and "\x1b" not in lines[2] and "\\x1b[31mred" in lines[2]
    assert lines[3].split()[:6] == [str(c), "job.created", "ai_job:3", "rejected", "1", "3d"]
    assert lines[3].endswith("x" * 59 + "…")
    assert lines[4] == ("3 dead letters; act on them with: outbox-lite dead-letters"
                        " --requeue|--delete --id ID ...")
    assert len(lines) == 5
    assert "secret-card" not in "\n".join(lines)

    assert main(["dead-letters", "--error-code", "rejected", "--limit", "1", *url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == [str(b)]
    assert lines[-1].startswith("1 of 2 dead letters (--limit 1); ")

    assert main(["dead-letters", "--id", str(c), str(a), "999", "--json", *url]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert (listing["shown"], listing["total"], listing["limit"]) == (2, 2, 50)
    first, second = listing["dead_letters"]
    assert (first["id"], second["id"]) == (a, c)
    assert {k: first[k] for k in ("event_type", "aggregate_type", "aggregate_id",
                                  "error_code", "error_message", "attempt_count")} == {
        "event_type": "job.created", "aggregate_type": "ai_job", "aggregate_id": "1",
        "error_code": "http_500", "error_message": "the broker said 500\nretry later",
        "attempt_count": 3}
    assert second["error_message"] == "x" * 500  # in full
    assert 2 * 3600 + 290 <= first["age_seconds"] <= 2 * 3600 + 400
    assert first["failed_at"].endswith("+00:00") and "secret-card" not in json.dumps(listing)
    # The listing changed nothing; the actions still work as before.
    assert fetch("SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'failed'") == [
        {"n": 3}]
    assert main(["dead-letters", "--requeue", "--id", str(b), *url]) == 0
    assert capsys.readouterr().out == "requeued 1 dead letter\n"
    assert main(["dead-letters", "--error-code", "nope", *url]) == 0
    assert capsys.readouterr().out == "no dead letters match\n"
