#!/usr/bin/env python3
"""Break each promise once, and see the tests that concern it notice (issue 38):

    OUTBOX_TEST_DATABASE_URL=mysql://root@127.0.0.1:3306/outbox_lite_test \\
        python scripts/mutants.py [--only WORDS] [--no-baseline] [--list]

Each mutant below replaces one exact text of one library file (found exactly once, or the
mutant is stale and the run fails) by a broken one. It is applied in a temporary copy of the
project (``outbox_lite/``, ``migrations/``, ``tests/``, ``setup.cfg``, ``pyproject.toml``),
never in the working tree, and only the tests named beside it run there (``pytest -x -q``,
the copy first on ``PYTHONPATH``, ``OUTBOX_TEST_DATABASE_URL`` passed through: MariaDB at
127.0.0.1:3306 when unset). A mutant whose tests still pass *survived*: some promise has no
test that sees it breaking. SQL mutants exist per family; those of the server's family run.

First the named tests run once on the unchanged copy (``--no-baseline`` skips it): a test
that fails there proves nothing about a mutant. Then a table, promise -> break -> first
failing test -> caught, and the exit status: 0 when every mutant was caught, 1 when one
survived, its text was not found or its run broke (no test failed yet pytest did not pass).
Stdlib only. ``--only WORDS`` runs the mutants whose promise or break contains WORDS.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("outbox_lite", "migrations", "tests", "setup.cfg", "pyproject.toml")
DEFAULT_URL = "mysql://root@127.0.0.1:3306/outbox_lite_test"


@dataclasses.dataclass(frozen=True)
class Mutant:
    promise: str
    break_: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    family: str | None = None  # "mysql" or "postgresql": only on that family's servers


MYSQL, PG = "outbox_lite/_families/mysql_sql.py", "outbox_lite/_families/postgresql_sql.py"
_WHERE_HELD = "\" WHERE id = %(id)s AND status = 'processing' AND locked_by = %(locked_by)s\""
_WHERE_ANY = "\" WHERE id = %(id)s AND status = 'processing'\""
_KEY_NAMES = ("tests/test_payload_key_names.py",)


def _both(promise: str, break_: str, tests: tuple[str, ...],
          mysql: tuple[str, str], postgresql: tuple[str, str]) -> list[Mutant]:
    """One break of a statement, written for each family."""
    return [Mutant(promise, break_, MYSQL, *mysql, tests, "mysql"),
            Mutant(promise, break_, PG, *postgresql, tests, "postgresql")]


MUTANTS: list[Mutant] = [
    Mutant("a refused duplicate holds up no other writer (one packet, REPEATABLE READ)",
           "the packet's read of the key as SET @v = (SELECT ...): a locking read",
           MYSQL,
           '    "SELECT COUNT(*) FROM outbox_event FORCE INDEX (uq_outbox_event_dedupe_key)"\n'
           '    f" WHERE dedupe_key = %(dedupe_key)s INTO {TAKEN_VARIABLE};"',
           '    f"SET {TAKEN_VARIABLE} = (SELECT COUNT(*) FROM outbox_event"\n'
           '    " FORCE INDEX (uq_outbox_event_dedupe_key) WHERE dedupe_key = %(dedupe_key)s);"',
           ("tests/test_write_round_trip.py::test_a_key_in_the_gap_just_before_a_refused_duplicate",),
           "mysql"),
    Mutant("relay without tracing: a refused event is not published (§5)",
           "untraced publish ignores the failures returned",
           "outbox_lite/relay/_publishing.py",
           "            return dict(self.publisher.publish(batch))",
           "            self.publisher.publish(batch)\n            return {}",
           ("tests/test_relay.py::test_failures_retry_or_dead_letter_with_their_code",
            "tests/test_relay.py::test_the_last_attempt_dead_letters")),
    *_both("mark_failed fencing, dead letter (§2)",
           "FAILED_FOR_GOOD without AND locked_by",
           ("tests/test_outcomes.py::test_only_the_holder_can_make_a_dead_letter",
            "tests/test_expiry.py::"
            "test_a_relay_whose_claim_was_taken_over_does_not_dead_letter_the_expired_event"),
           mysql=('    " locked_at = NULL, updated_at = %(now)s"\n    ' + _WHERE_HELD,
                  '    " locked_at = NULL, updated_at = %(now)s"\n    ' + _WHERE_ANY),
           postgresql=('    " updated_at = %(now)s"\n    ' + _WHERE_HELD,
                       '    " updated_at = %(now)s"\n    ' + _WHERE_ANY)),
    *_both("a dead letter holds no lock (§2)",
           "FAILED_FOR_GOOD keeps locked_by/locked_at",
           ("tests/test_outcomes.py::test_non_retryable_failure_dead_letters_at_once",
            "tests/test_outcomes.py::test_only_the_holder_can_make_a_dead_letter"),
           mysql=(' last_error_message = %(message)s, locked_by = NULL,"\n'
                  '    " locked_at = NULL, updated_at',
                  ' last_error_message = %(message)s,"\n    " updated_at'),
           postgresql=(' last_error_message = %(message)s, locked_by = NULL, locked_at = NULL,"',
                       ' last_error_message = %(message)s,"')),
    *_both("a dead letter holds no lock (§2)",
           "retry_or_fail keeps the lock when attempts are used up",
           ("tests/test_outcomes.py::"
            "test_retryable_failure_goes_back_to_pending_with_exponential_backoff",
            "tests/test_outcomes.py::test_only_the_holder_can_make_a_dead_letter"),
           mysql=('        " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"',
                  '        " locked_by = IF(attempt_count < %(max_attempts)s, NULL, locked_by),'
                  ' locked_at = IF(attempt_count < %(max_attempts)s, NULL, locked_at),'
                  ' updated_at = %(now)s"'),
           postgresql=('        " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"',
                       '        " locked_by = CASE WHEN attempt_count < %(max_attempts)s'
                       ' THEN NULL ELSE locked_by END, locked_at = CASE WHEN attempt_count <'
                       ' %(max_attempts)s THEN NULL ELSE locked_at END, updated_at = %(now)s"')),
    *_both("a dead letter holds no lock (§2)",
           "RELEASE_EXPIRED keeps the lock when attempts are used up",
           ("tests/test_outcomes.py::"
            "test_release_expired_locks_dead_letters_when_attempts_are_exhausted",),
           mysql=(" last_error_code = 'lock_expired', locked_by = NULL, locked_at = NULL,",
                  " last_error_code = 'lock_expired',"
                  " locked_by = IF(attempt_count >= %(max_attempts)s, locked_by, NULL),"
                  " locked_at = IF(attempt_count >= %(max_attempts)s, locked_at, NULL),"),
           postgresql=(" last_error_code = 'lock_expired', locked_by = NULL, locked_at = NULL,",
                       " last_error_code = 'lock_expired', locked_by = CASE WHEN attempt_count"
                       " >= %(max_attempts)s THEN locked_by END, locked_at = CASE WHEN"
                       " attempt_count >= %(max_attempts)s THEN locked_at END,")),
    Mutant("credential key names (§2)", "'credential' removed from the words",
           "outbox_lite/_credentials.py", '"cookie", "credential", "apikey"', '"cookie", "apikey"',
           _KEY_NAMES),
    Mutant("credential key names (§2)", "'cookies' removed from the plurals",
           "outbox_lite/_credentials.py", '"credentials", "cookies", "apikeys"',
           '"credentials", "apikeys"', _KEY_NAMES),
    Mutant("credential key names (§2)", "qualifier 'sas' removed",
           "outbox_lite/_credentials.py", '"deploy", "auth", "sas"})', '"deploy", "auth"})',
           _KEY_NAMES),
    Mutant("credential key names (§2)", "'sessid' removed from the endings",
           "outbox_lite/_credentials.py", '"sessionid", "sessid")', '"sessionid")', _KEY_NAMES),
    Mutant("a round releases expired claims (§5)", "run_once never releases",
           "outbox_lite/relay/_loop.py",
           "result.released = self.repository.release_expired_locks(self.lock_timeout)",
           "result.released = 0",
           ("tests/test_relay.py::test_a_round_releases_expired_claims_and_counts_them",)),
    *_both("mark_published fencing (§2)", "MARK_PUBLISHED without AND locked_by",
           ("tests/test_outcomes.py::test_fencing_a_stale_worker_changes_nothing",),
           mysql=('" published_at = %(now)s, locked_by = NULL, locked_at = NULL,'
                  ' updated_at = %(now)s"\n    ' + _WHERE_HELD,
                  '" published_at = %(now)s, locked_by = NULL, locked_at = NULL,'
                  ' updated_at = %(now)s"\n    ' + _WHERE_ANY),
           postgresql=('    " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"\n    '
                       + _WHERE_HELD,
                       '    " locked_by = NULL, locked_at = NULL, updated_at = %(now)s"\n    '
                       + _WHERE_ANY)),
    *_both("claims skip held rows, never wait (§2)", "FOR UPDATE without SKIP LOCKED",
           ("tests/test_claims.py::test_a_held_batch_is_skipped_without_waiting",),
           mysql=(' LIMIT %(limit)s"\n    " FOR UPDATE SKIP LOCKED"',
                  ' LIMIT %(limit)s"\n    " FOR UPDATE"'),
           postgresql=(' ORDER BY id LIMIT %(limit)s"\n    " FOR UPDATE SKIP LOCKED"',
                       ' ORDER BY id LIMIT %(limit)s"\n    " FOR UPDATE"')),
    *_both("a claim counts an attempt (§2)", "claim_batch leaves attempt_count",
           ("tests/test_claims.py::"
            "test_claim_batch_claims_oldest_first_and_sets_the_claim_fields",),
           mysql=('attempt_count = attempt_count + 1,"\n    " updated_at = %(now)s WHERE id IN',
                  'attempt_count = attempt_count,"\n    " updated_at = %(now)s WHERE id IN'),
           postgresql=('attempt_count = attempt_count + 1, updated_at = %(now)s"\n'
                       '    " WHERE id = ANY(%(ids)s)"',
                       'attempt_count = attempt_count, updated_at = %(now)s"\n'
                       '    " WHERE id = ANY(%(ids)s)"')),
    *_both("find_dispatchable: oldest available_at first (§2)", "ORDER BY id only",
           ("tests/test_claims.py::"
            "test_find_dispatchable_orders_by_available_at_then_id_and_skips_the_future",),
           mysql=('" ORDER BY available_at, id LIMIT %(limit)s")',
                  '" ORDER BY id LIMIT %(limit)s")'),
           postgresql=('" ORDER BY available_at, id LIMIT %(limit)s")',
                       '" ORDER BY id LIMIT %(limit)s")')),
    Mutant("retries back off exponentially (§2)", "the delay never grows",
           "outbox_lite/backoff.py",
           "seconds = min(self.cap, self.base * self.factor ** exponent)",
           "seconds = min(self.cap, self.base)",
           ("tests/test_outcomes.py::"
            "test_retryable_failure_goes_back_to_pending_with_exponential_backoff",)),
    Mutant("claims expire after lock_timeout (§2)", "every claim counts as expired",
           "outbox_lite/repository.py",
           'cutoff = _checks.before("lock_timeout", now, timeout)', "cutoff = now",
           ("tests/test_outcomes.py::test_release_expired_locks_by_the_injected_clock",)),
    Mutant("the caller owns the transaction (§2)", "create_in_transaction commits",
           "outbox_lite/repository.py",
           "        self._ring()\n        created = aware(now)",
           "        self._ring()\n        self.database.commit()\n        created = aware(now)",
           ("tests/test_create.py::test_rollback_leaves_neither_the_job_nor_the_event",
            "tests/test_transactions.py::test_no_method_begins_commits_or_rolls_back_anything")),
    Mutant("a refused COMMIT is a lock conflict the relay outlives (§5, §12)",
           "the claim's COMMIT is Peewee's own again",
           "outbox_lite/_session.py",
           "    return _RefusedCommitIsConflict(atomic, family)",
           "    return atomic",
           ("tests/test_refused_commit.py::test_the_relay_outlives_refused_commits_and_records"
            "_every_outcome_once",)),
    Mutant("claim_batch: oldest available_at first, whatever the ids (§2)",
           "the locking read takes the whole candidate window",
           "outbox_lite/repository.py",
           "                chunk, ids = ids[:limit - len(claimed)], ids[limit - len(claimed):]",
           "                chunk, ids = ids, []",
           ("tests/test_claims.py::test_claim_batch_hands_out_the_oldest_available_at_first"
            "_whatever_the_ids",)),
    Mutant("retention: one relay of a database at a time (§13)", "the named lock is always taken",
           "outbox_lite/_named_lock.py",
           'taken = bool(execute(database, *sql.TRY_LOCK.bind({"name": name})).fetchone()[0])',
           'taken = True or execute(database, *sql.TRY_LOCK.bind({"name": name}))',
           ("tests/test_retention.py::"
            "test_a_relay_that_finds_the_lock_held_skips_the_pass_without_waiting",
            "tests/test_retention.py::"
            "test_two_relays_at_once_only_one_purges_and_the_other_does_not_wait")),
    Mutant("retention: only what is older than retain (§13)", "the relay purges at half the age",
           "outbox_lite/relay/_retention.py",
           "self.repository.purge_published(self.retain,",
           "self.repository.purge_published(self.retain / 2,",
           ("tests/test_retention.py::"
            "test_a_relay_deletes_exactly_the_published_events_older_than_retain",)),
    Mutant("a purge never holds a lock a writer waits on (§13)",
           "one DELETE per batch, however large",
           "outbox_lite/repository.py", "            for chunk in _chunks(ids):\n"
           "                deleted += self._run(self._sql.PURGE_PUBLISHED,",
           "            for chunk in [ids]:\n"
           "                deleted += self._run(self._sql.PURGE_PUBLISHED,",
           ("tests/test_retention.py::test_no_delete_of_a_purge_names_more_than_500_rows",
            "tests/test_retention.py::test_writers_and_claimers_never_wait_on_a_big_purge")),
]


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    verdict: str  # caught, SURVIVED, STALE (text not found once), BROKE (no test failed)
    first_failing: str = ""
    seconds: float = 0.0


def family_of(url: str) -> str:
    scheme = url.partition("://")[0].lower()
    return "postgresql" if scheme in ("postgresql", "postgres") else "mysql"


def project_copy(into: Path) -> Path:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, into / name)
    return into


_ORIGIN = "import importlib.util as u; print(u.find_spec('outbox_lite').origin)"


def run_tests(copy: Path, tests: tuple[str, ...], url: str) -> tuple[int, str]:
    """pytest -x -q on ``tests`` in ``copy``, its outbox_lite first on the path."""
    env = {**os.environ, "OUTBOX_TEST_DATABASE_URL": url,
           "PYTHONPATH": os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")])}
    found = subprocess.run(  # where the package is found, without running it
        [sys.executable, "-c", _ORIGIN], cwd=copy, env=env, capture_output=True, text=True,
        check=True).stdout.strip()
    if not Path(found).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"the copy's outbox_lite is not the one imported ({found})")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
         "--timeout", "120", *tests], cwd=copy, env=env, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


_FIRST_FAILING = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def try_mutant(mutant: Mutant, url: str) -> Outcome:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="outbox-mutant-") as folder:
        copy = project_copy(Path(folder))
        target = copy / mutant.file
        text = target.read_text()
        if text.count(mutant.original) != 1:
            return Outcome(mutant, "STALE", f"text found {text.count(mutant.original)} times")
        target.write_text(text.replace(mutant.original, mutant.replacement))
        status, output = run_tests(copy, mutant.tests, url)
    seconds = time.monotonic() - started
    failing = _FIRST_FAILING.search(output)
    if status == 0:
        return Outcome(mutant, "SURVIVED", "", seconds)
    if failing is None:
        tail = output.strip().splitlines()[-1:] or [f"pytest exited {status}"]
        return Outcome(mutant, "BROKE", tail[0], seconds)
    return Outcome(mutant, "caught", failing[1], seconds)


def table(outcomes: list[Outcome]) -> str:
    rows = [("promise", "break", "first failing test", "caught?")]
    rows += [(o.mutant.promise, o.mutant.break_,
              f"`{o.first_failing}`" if o.verdict == "caught" else o.first_failing or "-",
              "yes" if o.verdict == "caught" else o.verdict) for o in outcomes]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="mutants whose promise or break has this")
    parser.add_argument("--no-baseline", action="store_true",
                        help="do not first run the named tests on the unchanged copy")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    url = os.environ.get("OUTBOX_TEST_DATABASE_URL", DEFAULT_URL)
    family = family_of(url)
    chosen = [m for m in MUTANTS if m.family in (None, family)
              and args.only.lower() in f"{m.promise} {m.break_}".lower()]
    if args.list:
        for m in chosen:
            print(f"{m.promise}: {m.break_} ({m.file}) -> {', '.join(m.tests)}")
        return 0
    print(f"{len(chosen)} mutants, {family} family: {url}", flush=True)
    if not args.no_baseline:
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        with tempfile.TemporaryDirectory(prefix="outbox-mutant-") as folder:
            status, output = run_tests(project_copy(Path(folder)), tests, url)
        if status != 0:
            print(output, "\nthe named tests fail without any mutant: nothing to learn",
                  file=sys.stderr)
            return 2
        print(f"baseline: the {len(tests)} named tests pass unchanged", flush=True)
    outcomes = []
    for mutant in chosen:
        outcome = try_mutant(mutant, url)
        outcomes.append(outcome)
        print(f"  {outcome.verdict:8} {mutant.break_} ({outcome.seconds:.1f} s)", flush=True)
    print(table(outcomes))
    missed = [o for o in outcomes if o.verdict != "caught"]
    if missed:
        print(f"{len(missed)} of {len(outcomes)} mutants not caught", file=sys.stderr)
        return 1
    print(f"all {len(outcomes)} mutants caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
