"""The relay end to end, for every broker: ``outbox-lite relay`` in processes of its own, the
business transactions that feed it, and an outage at a known batch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from _helpers import FAMILY

TESTS = Path(__file__).resolve().parent


def relay_process(db_url, *args, env=None, worker_id=None):
    """``outbox-lite relay`` in a process of its own (as ``python -m outbox_lite.cli``)."""
    command = [sys.executable, "-m", "outbox_lite.cli", "relay",
               "--database-url", db_url.secret_text(), "--progress-every", "0.5", *args]
    if worker_id:
        command += ["--worker-id", worker_id]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(TESTS), **(env or {})})


def finish(process, timeout=120):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def orders(db, repo, count, aggregates=30):
    """``count`` events, each written with its business row in one transaction (two events
    per transaction, as a service writing a job and its first step would)."""
    events = []
    for n in range(0, count, 2):
        with db.atomic():
            job = FAMILY.insert_id(db, "INSERT INTO job (name) VALUES (%s)", (f"job-{n}",))
            for step in (n, n + 1):
                events.append(repo.create_in_transaction(
                    event_type="job.created" if step % 2 == 0 else "job.queued",
                    aggregate_type="job", aggregate_id=str(step % aggregates),
                    payload={"job_id": job, "step": step, "text": f"naïve café {step}"},
                    dedupe_key=f"job:{job}:{step}"))
    return events


def wait_for(condition, processes, timeout=60, state=None):
    """Poll ``condition`` until it holds; fail (with ``state()``, what was seen last, and the
    processes' stderr) if it does not within ``timeout`` s or if one of ``processes`` ends
    first. The processes are killed before their stderr is read: reading a live one's would
    block."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            seen = "" if state is None else f"{state()}; "
            for p in processes:
                p.kill()
            pytest.fail(f"waited in vain: {seen}"
                        + " | ".join(p.communicate()[1] for p in processes))
        time.sleep(0.01)


class Watched:
    """A relay process whose output is read as it comes, by threads of its own, so that a test
    can wait for one of its lines (a progress line, a signal's, a wake-up listener's) and
    still have the whole of its stderr when it ends: :func:`finish` and :func:`wait_for` take
    it as they take the process."""

    def __init__(self, process):
        self.process = process
        self.lines = []  # stderr, line by line
        self._out = []
        self._cond = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((process.stderr, self.lines),
                                              (process.stdout, self._out))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, into):
        for line in stream:
            with self._cond:
                into.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def poll(self):
        return self.process.poll()

    @property
    def returncode(self):
        return self.process.returncode

    def terminate(self):
        self.process.terminate()

    def kill(self):
        self.process.kill()

    def send_signal(self, signum):
        self.process.send_signal(signum)

    def communicate(self, timeout=None):
        """(stdout, stderr) once the process ends, as Popen's."""
        self.process.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
        return "".join(self._out), "".join(self.lines)

    def wait_for_line(self, matches, what, timeout=60):
        """The first stderr line for which ``matches(line)`` is true; fails (with the stderr
        so far) after ``timeout`` s or when the process ends first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    if matches(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or not self._readers[0].is_alive():
                    break
                self._cond.wait(min(left, 0.5))
        self.process.kill()
        pytest.fail(f"waited in vain for {what}: " + "".join(self.lines))

    def wait_for_rounds(self, count, timeout=60):
        """Until a progress line says the relay has done at least ``count`` rounds (a line
        comes after the wait that follows a round, once ``--progress-every`` has passed)."""
        def enough(line):
            found = _ROUNDS.search(line)
            return found is not None and int(found[1]) >= count
        self.wait_for_line(enough, f"a progress line of {count} rounds", timeout)


_ROUNDS = re.compile(r" in (\d+) rounds ")


def watched_relay_process(db_url, *args, env=None, worker_id=None):
    """:func:`relay_process`, :class:`Watched`."""
    return Watched(relay_process(db_url, *args, env=env, worker_id=worker_id))


class StopsServerBefore:
    """A publisher that stops the test's own broker (``server.stop()``, by its pid) just
    before its ``batch``-th publish: an outage mid-run, at a point the test knows, however
    fast the relay is."""

    def __init__(self, publisher, server, batch: int) -> None:
        self.publisher, self.server, self.batch, self.calls = publisher, server, batch, 0
        self.failed_pings = 0  # pings the stopped broker did not answer

    def publish(self, events):
        self.calls += 1
        if self.calls == self.batch:
            self.server.stop()
        return self.publisher.publish(events)

    def ping(self):
        try:
            return self.publisher.ping()
        except Exception:
            self.failed_pings += 1
            raise

    def close(self):
        self.publisher.close()
