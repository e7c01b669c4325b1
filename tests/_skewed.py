"""Hosts whose wall clocks are off: the library's real code in a process of its own whose
``time()``/``clock_gettime(CLOCK_REALTIME)`` libfaketime shifts by a fixed number of seconds
(the monotonic clock stays true, as a host's is).

Parent side: :class:`SkewedHost` starts ``python _skewed.py`` under ``LD_PRELOAD`` and runs one
call at a time there (:meth:`SkewedHost.call`), on a repository and an inbox made with the
library's defaults (no clock injected). Child side: :func:`main` reads one JSON request a line
and answers one JSON line. One child serves a whole test module: :meth:`SkewedHost.use` points
it at a test's database.

Also a publisher factory for ``outbox-lite relay --publisher _skewed:gated_rabbitmq``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

TESTS = Path(__file__).resolve().parent
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
ANSWER_TIMEOUT = 60  # seconds a call may take in the child before the test gives up on it


def skewed_env(seconds: int, **extra: str) -> dict[str, str]:
    """The environment of a process whose wall clock runs ``seconds`` off true time."""
    if not os.path.exists(FAKETIME):
        raise RuntimeError(f"{FAKETIME} is missing: apt-get install -y faketime")
    return {**os.environ, "LD_PRELOAD": FAKETIME, "FAKETIME": f"{seconds:+d}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": os.pathsep.join([str(TESTS / "_faketime_site"), str(TESTS)]), **extra}


class ChildError(Exception):
    """A call in the child raised (its type and message)."""


class SkewedHost:
    """A child process whose wall clock is ``skew`` seconds off, running library calls."""

    def __init__(self, skew: int) -> None:
        self.skew = skew
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=skewed_env(skew))

    def use(self, url: Any, **backoff: float) -> None:
        """Work on ``url``'s database from now on (a repository whose Backoff has
        ``backoff``'s settings, an inbox of consumer ``c``), both with default clocks."""
        self.call("host", "use", url.secret_text(), backoff)

    def call(self, target: str, method: str, *args: Any, atomic: bool = False,
             **kwargs: Any) -> Any:
        """``target.method(*args, **kwargs)`` in the child (target ``repo``, ``inbox``,
        ``inbox_module`` or ``host``), inside ``database.atomic()`` when ``atomic``."""
        request = {"target": target, "method": method, "args": args, "kwargs": kwargs,
                   "atomic": atomic}
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        # One answer per request, so nothing waits in the reader's buffer: select() tells.
        if not select.select([self.process.stdout], [], [], ANSWER_TIMEOUT)[0]:
            self.process.kill()
            raise ChildError(f"no answer to {method}() in {ANSWER_TIMEOUT} s; killed it")
        line = self.process.stdout.readline()
        if not line:
            self._stderr.seek(0)
            raise ChildError(f"the child ended: {self._stderr.read()[-2000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise ChildError(answer["error"])
        return answer["ok"]

    def host_now(self) -> dt.datetime:
        """The child's wall clock (``datetime.now(timezone.utc)``)."""
        return dt.datetime.fromisoformat(self.call("host", "now"))

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout,):
            if stream is not None:
                stream.close()
        self._stderr.close()


# ---------------------------------------------------------------------------
# The child
# ---------------------------------------------------------------------------

def _plain(value: Any) -> Any:
    """``value`` as JSON: events as a dict of their id, lock and instants (ISO text)."""
    from outbox_lite import OutboxEvent, OutboxStats

    if isinstance(value, OutboxEvent):
        return {"id": value.id, "locked_by": value.locked_by,
                **{name: None if getattr(value, name) is None else getattr(value, name)
                   .isoformat() for name in ("available_at", "locked_at", "created_at")}}
    if isinstance(value, OutboxStats):
        return value.as_dict()
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _Child:
    def __init__(self) -> None:
        self.database: Any = None
        self.repo: Any = None
        self.inbox: Any = None
        from outbox_lite import inbox as inbox_module
        self.inbox_module = inbox_module

    def use(self, url: str, backoff: Mapping[str, float]) -> None:
        from outbox_lite import Backoff, Inbox, OutboxRepository
        from outbox_lite._families.url import DatabaseUrl

        if self.database is not None and not self.database.is_closed():
            self.database.close()
        self.database = DatabaseUrl.parse(url).database()
        self.repo = OutboxRepository(self.database, backoff=Backoff(**backoff))
        self.inbox = Inbox(self.database, "c")
        self.url = url

    def now(self) -> str:
        return dt.datetime.now(dt.timezone.utc).isoformat()

    def cli(self, *argv: str) -> list[Any]:
        """``outbox-lite ARGV --database-url URL`` here: [status, stdout]."""
        from outbox_lite.cli import main as cli_main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = cli_main([*argv, "--database-url", self.url])
        return [status, out.getvalue()]

    def relay_lags(self) -> list[float]:
        """Run a Relay here until the outbox is empty, publishing to nowhere, with an
        observer: the lag it is told for each published event (``at`` minus
        ``available_at``, seconds), what ``outbox_relay_lag_seconds`` observes."""
        from outbox_lite.relay import Relay

        lags: list[float] = []

        class Nowhere:
            def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
                return {}

            def close(self) -> None:
                pass

        class Observer:
            stats_every = 3600.0

            def attach(self, relay: Any) -> None:
                pass

            def counted(self, counts: Any, published: Sequence[Any], at: Any) -> None:
                lags.extend((at - e.available_at).total_seconds() for e in published)

            def round_finished(self, publish_seconds: Any) -> None:
                pass

            def outbox_stats(self, stats: Any) -> None:
                pass

        Relay(self.repo, Nowhere(), metrics=Observer(), progress_every=0).run(until_empty=True)
        return lags

    def run(self, request: Mapping[str, Any]) -> Any:
        target = {"repo": self.repo, "inbox": self.inbox, "inbox_module": self.inbox_module,
                  "host": self}[request["target"]]
        args, kwargs = request["args"], request["kwargs"]
        if request["target"] == "inbox_module":
            args = [self.database, *args]
        method = getattr(target, request["method"])
        if request["atomic"]:
            with self.database.atomic():
                return method(*args, **kwargs)
        return method(*args, **kwargs)


def main() -> None:
    child = _Child()
    for line in sys.stdin:
        try:
            answer = {"ok": _plain(child.run(json.loads(line)))}
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


# ---------------------------------------------------------------------------
# A publisher for ``outbox-lite relay --publisher _skewed:gated_rabbitmq``
# ---------------------------------------------------------------------------

class _GatedRabbitMQ:
    """RabbitMQ's publisher, which after each publish writes ``entered`` in
    ``OUTBOX_TEST_GATE`` and returns only once the test has written ``go`` there: a relay that
    holds its live claims for as long as the test wants."""

    def __init__(self, publisher: Any, folder: Path) -> None:
        self.publisher, self.folder = publisher, folder

    def publish(self, events: Sequence[Any]) -> Mapping[int, BaseException]:
        failures = self.publisher.publish(events)
        (self.folder / "entered").write_text(str(len(events)))
        deadline = time.monotonic() + 60
        while not (self.folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return failures

    def ping(self) -> None:
        self.publisher.ping()

    def close(self) -> None:
        self.publisher.close()


def gated_rabbitmq() -> _GatedRabbitMQ:
    from outbox_lite.publishers.rabbitmq import RabbitMQPublisher
    return _GatedRabbitMQ(RabbitMQPublisher(os.environ["OUTBOX_TEST_RABBITMQ_URL"],
                                            os.environ["OUTBOX_TEST_EXCHANGE"]),
                          Path(os.environ["OUTBOX_TEST_GATE"]))


if __name__ == "__main__":
    main()
