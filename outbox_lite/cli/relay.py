"""``outbox-lite relay``: the worker loop, the broker its flags name (or a publisher
factory), its metrics endpoint, and what a stop signal does."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from typing import Any

from .. import _schema, _signals
from .._families.url import DatabaseUrl
from ..models import TABLE_NAME
from ..publishers._binding import Binding, bindings
from ..repository import OutboxRepository
from . import _databases
from ._args import (EXIT_OK, CommandError, UsageError, database_url_help, describe_error,
                    open_repository, parse_age_or_seconds, parse_port, parse_positive,
                    parse_seconds)


def add_commands(commands: Any) -> None:
    """Add relay to the ``outbox-lite`` subcommands."""
    p = commands.add_parser(
        "relay", help=f"publish events to {', '.join(b.name for b in bindings())} (or any"
                      " publisher) until stopped",
        description="Runs the worker loop: release expired claims, claim a batch, publish it "
                    "outside any transaction (renewing the claims while a publish runs long), "
                    "record the outcomes. SIGTERM or SIGINT stop it once the batch in hand "
                    "is recorded; a second SIGINT stops it at once. A progress line goes to "
                    "stderr every few seconds; payloads and credentials never do. Given "
                    "several databases (--database-url repeated, or --databases-file), it "
                    "runs a relay for each on a thread of its own: a backlog in one holds "
                    "back no other, one that cannot be reached is reported and the others "
                    "go on, and the metrics carry the label database=\"NAME\".")
    _add_database_flags(p)
    for binding in bindings():  # each shipped publisher's own flags, declared in its module
        for flag in binding.flags:
            p.add_argument(flag.flag, metavar=flag.metavar, help=flag.help)
    p.add_argument("--cloudevents", action="store_true",
                   help="send each event as a CloudEvent in binary content mode (RabbitMQ: "
                        "cloudEvents_* headers of the AMQP binding; NATS: ce-* headers)")
    p.add_argument("--cloudevents-source", metavar="URI",
                   help="the CloudEvents source of every event (default: /outbox-lite; give "
                        "each service its own, e.g. urn:shop:orders)")
    p.add_argument("--publisher", metavar="MODULE:FACTORY",
                   help="instead of a shipped broker: publish with what this callable returns"
                        " (an object with publish(events) and close()); MODULE is found in "
                        "the current directory too, as with python -m")
    p.add_argument("--batch-size", type=parse_positive, default=100,
                   help="events per claim and per publish (default: 100)")
    p.add_argument("--lock-timeout", type=parse_seconds, default=300.0, metavar="SECONDS",
                   help="claims older than this go back to other relays; a publish that runs "
                        "longer renews its claims every third of it (default: 300)")
    p.add_argument("--ordered", action="store_true",
                   help="claim only the head of each aggregate, so its events are published "
                        "one at a time in id order (every relay of the outbox must use it)")
    p.add_argument("--worker-id", metavar="ID",
                   help="the locked_by of this relay's claims (default: host:pid:random)")
    p.add_argument("--until-empty", action="store_true",
                   help="exit 0 once no event is pending or processing (with --ordered: but "
                        "those behind a dead letter of their aggregate)")
    p.add_argument("--wake-url", metavar="URL",
                   help="claim as soon as a service's repository with the same wake= rings "
                        "through this server, redis://[:password@]host:port or nats://host:"
                        "port (default: $OUTBOX_WAKE_URL); polling stays as the safety net, "
                        "with --max-idle-pause 2 s by default; needs outbox-lite[bullmq] "
                        "(redis) or [nats]")
    p.add_argument("--max-idle-pause", type=parse_seconds, metavar="SECONDS",
                   help="the longest wait between polls of an empty outbox, which bounds the "
                        "delay of an event after a quiet spell (with a wake-up: of one whose "
                        "wake-up was lost): a longer one costs the server fewer queries "
                        "(default: 0.05, about 60 queries/s; with --wake-url 2, about 1)")
    p.add_argument("--progress-every", type=parse_seconds, default=5.0, metavar="SECONDS",
                   help="seconds between progress lines (default: 5)")
    p.add_argument("--retain", type=parse_age_or_seconds, metavar="AGE",
                   help="delete published events published longer ago than AGE (90s, 30m, "
                        "12h, 7d, or seconds) by the server's clock, between rounds, in small "
                        "batches, one relay of the database at a time; dead letters are kept "
                        "(default: keep every event)")
    _add_metrics_flags(p)
    p.set_defaults(handler=_cmd_relay)


def _add_database_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url", metavar="[NAME=]URL", action="append",
        help=database_url_help() + ". Repeat it to relay for several "
             "databases, each NAME=URL or URL: NAME (1-64 letters, digits, _ . -) is the "
             "metrics' database label and the end of each relay's worker id (default: "
             "host:port/database)")
    parser.add_argument(
        "--databases-file", metavar="PATH",
        help="relay for the databases this file names, one [NAME=]URL a line (blank lines "
             "and lines starting with # ignored), instead of --database-url; re-read on "
             "SIGHUP: a database added gets a relay, one removed has its relay stopped "
             "once its batch in hand is recorded, one whose URL changed is restarted, and "
             "a file that does not read rightly is reported and changes nothing")


def _add_metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=parse_port, metavar="PORT",
                        help="serve Prometheus metrics at /metrics and a health check at "
                             "/healthz on this port (0: any free one, named at start-up); "
                             "needs outbox-lite[metrics]")
    parser.add_argument("--metrics-host", metavar="HOST",
                        help="the address to serve them on (default: 127.0.0.1; 0.0.0.0 for "
                             "every interface)")
    parser.add_argument("--stats-every", type=parse_seconds, metavar="SECONDS",
                        help="seconds between the outbox statistics read for the gauges, "
                             "one query set per relay (default: 15)")
    parser.add_argument("--stuck-after", type=parse_seconds, metavar="SECONDS",
                        help="/healthz answers 503 once the relay's loop has made no progress "
                             "for this long: a database or a publisher that does not return "
                             "(default: the lock timeout, at least 10 s)")



def _cmd_relay(args: argparse.Namespace, url: DatabaseUrl | None) -> int:
    from ..relay import Relay

    if args.databases_file and args.database_url:
        raise UsageError("--databases-file goes without --database-url: name every database"
                         " in the file")
    if url is None:  # several databases: a relay for each
        return _Relays(args).run()
    metrics = _relay_metrics(args)
    wake = args.wake_url or os.environ.get("OUTBOX_WAKE_URL") or None
    publisher = _publisher(args)
    server = None
    try:
        with open_repository(url) as repo:
            try:
                relay = Relay(repo, publisher, worker_id=args.worker_id,
                              batch_size=args.batch_size, lock_timeout=args.lock_timeout,
                              ordered=args.ordered, max_idle_pause=args.max_idle_pause,
                              progress_every=args.progress_every, metrics=metrics,
                              stuck_after=args.stuck_after, wake=wake,
                              retain=None if args.retain is None else args.retain.delta)
            except ImportError as exc:  # the wake-up's client is not installed: it says which
                raise CommandError(str(exc)) from None
            repo.stats()  # a wrong URL, a missing grant or table: one line now, not in the loop
            logging.getLogger("outbox_lite.relay").setLevel(logging.INFO)
            if metrics is not None:
                server = _serve_metrics(metrics, args.metrics_host, args.metrics_port)
            stop = threading.Event()
            with _signals.stop_on_signals(stop, _say_stopping):
                print(f"outbox-lite relay {relay.worker_id}: from {url} to {publisher!r}"
                      + (", ordered" if args.ordered else "")
                      + (f"; woken through {relay.wake!r}" if relay.wake else "")
                      + (f"; metrics on {_metrics_url(server)}/metrics" if server else ""),
                      file=sys.stderr, flush=True)
                try:
                    relay.run(stop, until_empty=args.until_empty)
                except BaseException as exc:  # stopped at once: say what is left behind
                    # an interrupt, or an error raised while unwinding from one (closing the
                    # connection it broke), which main() reports as that interrupt
                    if _signals.interruption(exc) is not None:
                        _say_left(relay)
                    raise
    finally:
        if server is not None:
            server.close()
        publisher.close()
    return EXIT_OK


def _say_left(relay: Any) -> None:
    """One line on the claims an interrupted relay leaves held, as the database counts
    them (or that they could not be counted); none when it leaves none."""
    try:
        held = relay.claims_held()
    except Exception as exc:  # noqa: BLE001 - the interrupt's exit status still follows
        said = f"its claims could not be counted ({type(exc).__name__})"
    else:
        if not held:
            return  # nothing waits for the lock timeout
        said = f"leaves {held} claim{'' if held == 1 else 's'} held"
    print(f"outbox-lite relay {relay.worker_id}: {said}, released after the lock timeout"
          f" ({relay.lock_timeout:g} s)", file=sys.stderr, flush=True)


def _relay_metrics(args: argparse.Namespace) -> Any:
    """The RelayMetrics that --metrics-port asks for (in prometheus_client's default
    registry, with the process's own metrics), or None."""
    if args.metrics_port is None:
        given = [flag for flag, value in (("--metrics-host", args.metrics_host),
                                          ("--stats-every", args.stats_every),
                                          ("--stuck-after", args.stuck_after))
                 if value is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} go{'es' if len(given) == 1 else ''}"
                             " with --metrics-port")
        return None
    try:
        from ..metrics import RelayMetrics
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    return RelayMetrics(stats_every=15.0 if args.stats_every is None else args.stats_every)


def _serve_metrics(metrics: Any, host: str | None, port: int) -> Any:
    host = host or "127.0.0.1"
    try:
        return metrics.serve(port, host)
    except OSError as exc:
        raise CommandError(f"--metrics-port {port}: cannot listen on {host}:{port}"
                           f" ({exc.strerror or exc})") from None


def _metrics_url(server: Any) -> str:
    host = f"[{server.host}]" if ":" in server.host else server.host
    return f"http://{host}:{server.port}"


def _name_a_broker(shipped: list[Binding]) -> str:
    """What the relay says when no broker is named: every shipped one's flags."""
    flags = ", ".join(
        " ".join([f"{b.url.flag} {b.url.metavar}", f"{b.targets[0].flag} {b.targets[0].metavar}",
                  *(f"[{t.flag} {t.metavar}]" for t in b.targets[1:])]) for b in shipped)
    variables = ", ".join(f"${b.env}" for b in shipped)
    return (f"name a broker: {flags} (each URL also from {variables}), or --publisher "
            "MODULE:FACTORY")


def _publisher(args: argparse.Namespace) -> Any:
    """The publisher the flags name: one shipped broker's, or the one MODULE:FACTORY returns.
    A broker is chosen by its flags on the command line; its URL flag may come from its
    variable. The publisher is pinged before anything is claimed: an unreachable broker, a
    wrong password, a missing exchange or stream is one line, now."""
    shipped = {b.name: b for b in bindings()}
    given = {name: [f.flag for f in b.flags if getattr(args, f.dest)]
             for name, b in shipped.items()}
    chosen = [name for name, flags in given.items() if flags]
    if args.cloudevents_source is not None and not args.cloudevents:
        raise UsageError("--cloudevents-source goes with --cloudevents")
    if args.cloudevents and (args.publisher or any(not shipped[name].cloudevents
                                                   for name in chosen)):
        takers = [b for b in shipped.values() if b.cloudevents]
        others = [b.name for b in shipped.values() if not b.cloudevents]
        raise UsageError(f"--cloudevents goes with {' or '.join(b.url.flag for b in takers)}"
                         f" (a message of {', '.join(others)} or of a publisher of your own"
                         " is no CloudEvents binding)")
    if args.publisher:
        if chosen:
            flag = given[chosen[0]][0]
            raise UsageError(f"{flag} goes with {shipped[chosen[0]].url.flag}, not with"
                             " --publisher")
        return _publisher_from_factory(args.publisher)
    if len(chosen) > 1:
        raise UsageError(f"choose one broker, not {' and '.join(chosen)} "
                         f"({', '.join(f for name in chosen for f in given[name])})")
    if not chosen:
        raise UsageError(_name_a_broker(list(shipped.values())))
    broker = shipped[chosen[0]]
    url = getattr(args, broker.url.dest) or os.environ.get(broker.env)
    target = broker.targets[0]
    if not url or not getattr(args, target.dest):
        missing = target.flag if url else f"{broker.url.flag} (or ${broker.env})"
        raise UsageError(f"{_name_a_broker(list(shipped.values()))}; {chosen[0]} also needs"
                         f" {missing}")
    try:
        publisher = broker.make(url, args)
    except ImportError as exc:  # the broker's extra is not installed: the error says which
        raise CommandError(str(exc)) from None
    try:
        publisher.ping()
    except BaseException:
        publisher.close()
        raise
    return publisher


def _publisher_from_factory(spec: str) -> Any:
    from ..relay import is_publisher

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(
            f"--publisher {spec!r} must be MODULE:FACTORY, e.g. myapp.outbox:publisher")
    if not any(os.path.abspath(entry or os.curdir) == os.getcwd() for entry in sys.path):
        # As `python -m` does: a module beside the user is found (the console script's own
        # sys.path starts at its bin folder instead).
        sys.path.insert(0, os.getcwd())
    try:
        factory: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            factory = getattr(factory, part)
    except ImportError as exc:
        raise UsageError(f"--publisher {spec}: cannot import {module_name} ({exc})") from None
    except AttributeError:
        raise UsageError(f"--publisher {spec}: {module_name} has no {attribute}") from None
    if not callable(factory):
        raise UsageError(f"--publisher {spec} is not callable")
    publisher = factory()
    if not is_publisher(publisher):
        raise UsageError(f"--publisher {spec} returned a {type(publisher).__name__}, which has"
                         " no publish(events) and close()")
    return publisher


def _say_stopping(signum: int, first: bool) -> None:
    """What the signal that arrived does to the relay (said from the signal watcher thread,
    never from the handler: see outbox_lite._signals)."""
    name = signal.Signals(signum).name
    if not first:
        does = "already stopping after the batch in hand is recorded (SIGINT stops at once)"
    elif signum == signal.SIGINT:
        does = "stopping after the batch in hand is recorded (Ctrl-C again stops at once)"
    else:
        does = ("stopping after the batch in hand is recorded (a SIGINT stops at once,"
                " leaving that batch's claims to expire)")
    print(f"outbox-lite relay: {name}: {does}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Several databases: a relay for each (SPEC §13)
# ---------------------------------------------------------------------------

class _Running:
    """One database's relay, with the publisher and the connection it owns."""

    def __init__(self, database: _databases.Database, relay: Any, publisher: Any) -> None:
        self.database, self.relay, self.publisher = database, relay, publisher

    def close(self) -> None:
        try:
            self.publisher.close()
        finally:
            self.relay.repository.database.close()


class _Relays:
    """``outbox-lite relay`` over several databases: a :class:`RelayGroup` of one relay per
    database, each with a publisher of its own (the shipped publishers are not thread-safe),
    its metrics labelled with the database's name; ``--databases-file`` re-read on SIGHUP."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.path: str | None = args.databases_file
        databases = (_databases.from_file(self.path) if self.path
                     else _databases.from_flags(args.database_url))
        self.metrics = _relay_metrics(args)
        self.wake = args.wake_url or os.environ.get("OUTBOX_WAKE_URL") or None
        self.worker_id = args.worker_id or None
        self.running: dict[str, _Running] = {}
        self.first = databases  # started by run()

    def run(self) -> int:
        from ..relay import RelayGroup

        server = None
        try:
            for database in self.first:  # a broker or a flag that fails: one line, now
                self.running[database.name] = self._make(database)
            for running in self.running.values():
                self._check(running)
            group = RelayGroup({name: r.relay for name, r in self.running.items()})
            logging.getLogger("outbox_lite.relay").setLevel(logging.INFO)
            if self.metrics is not None:
                server = _serve_metrics(self.metrics, self.args.metrics_host,
                                        self.args.metrics_port)
            stop = threading.Event()
            reload = threading.Event() if self.path else None
            with _signals.stop_on_signals(stop, _say_stopping, reload):
                self._say_started(server)
                group.start(stop, until_empty=self.args.until_empty)
                try:
                    while group.wait(0.2):
                        if reload is not None and reload.is_set() and not stop.is_set():
                            reload.clear()
                            self._reload(group)
                except BaseException as exc:
                    stop.set()
                    if _signals.interruption(exc) is not None:
                        for running in self.running.values():
                            _say_left(running.relay)
                    raise
            if group.errors:  # each logged as it ended
                raise CommandError(f"the relay of {', '.join(sorted(group.errors))} ended with"
                                   " an error (said above); the others stopped as asked")
        finally:
            if server is not None:
                server.close()
            for running in self.running.values():
                running.close()
        return EXIT_OK

    def _make(self, database: _databases.Database) -> _Running:
        """The relay of ``database``, with a publisher of its own (pinged) and its metrics."""
        from ..relay import Relay, default_worker_id

        publisher = _publisher(self.args)
        try:
            repository = OutboxRepository(database.url.database())
            relay = Relay(repository, publisher,
                          worker_id=f"{self.worker_id or default_worker_id()}/{database.name}",
                          batch_size=self.args.batch_size, lock_timeout=self.args.lock_timeout,
                          ordered=self.args.ordered, max_idle_pause=self.args.max_idle_pause,
                          progress_every=self.args.progress_every,
                          metrics=(None if self.metrics is None
                                   else self.metrics.database(database.name)),
                          stuck_after=self.args.stuck_after, wake=self.wake,
                          retain=None if self.args.retain is None else self.args.retain.delta)
        except ImportError as exc:  # the wake-up's client is not installed: it says which
            publisher.close()
            raise CommandError(str(exc)) from None
        except BaseException:
            publisher.close()
            raise
        return _Running(database, relay, publisher)

    def _check(self, running: _Running) -> bool:
        """Read the database's outbox once, as one database's relay does at start-up: what
        is wrong (unreachable, a missing grant or table) is one line naming the database,
        and its relay starts all the same (it waits for its server; the others go on)."""
        database = running.relay.repository.database
        try:
            _schema.check(database, (TABLE_NAME,))
            running.relay.repository.stats()
        except Exception as exc:  # noqa: BLE001 - said, and the other databases go on
            if _signals.interruption(exc) is not None:
                raise
            said = describe_error(exc, running.database.url, "relay")
            print(f"outbox-lite relay {running.relay.worker_id}: database"
                  f" {running.database.name} ({running.database.url.location}): {said};"
                  " its relay keeps trying, the others go on", file=sys.stderr, flush=True)
            return False
        finally:
            database.close()  # this thread's connection: the relay's thread opens its own
        return True

    def _say_started(self, server: Any) -> None:
        names = ", ".join(self.running)
        print(f"outbox-lite relay: {len(self.running)} databases ({names})"
              + (", ordered" if self.args.ordered else "")
              + (f"; from {self.path}, re-read on SIGHUP" if self.path else "")
              + (f"; metrics on {_metrics_url(server)}/metrics" if server else ""),
              file=sys.stderr, flush=True)
        for running in self.running.values():
            self._say_running(running, "")

    @staticmethod
    def _say_running(running: _Running, why: str) -> None:
        relay = running.relay
        print(f"outbox-lite relay {relay.worker_id}: {why}database {running.database.name}"
              f" from {running.database.url} to {running.publisher!r}"
              + (f"; woken through {relay.wake!r}" if relay.wake else ""),
              file=sys.stderr, flush=True)

    # -- SIGHUP -------------------------------------------------------------------------------

    def _reload(self, group: Any) -> None:
        """Re-read the databases file: stop the relays of databases removed or whose URL
        changed, then start those added or changed. A file that does not read rightly is
        said in one line and the running set is kept."""
        assert self.path is not None
        try:
            wanted = {d.name: d for d in _databases.from_file(
                self.path, _databases.DatabasesFileError)}
        except CommandError as exc:
            print(f"outbox-lite relay: SIGHUP: {exc}; the relays of {', '.join(self.running)}"
                  " go on as they were", file=sys.stderr, flush=True)
            return
        for name in list(self.running):
            if name not in wanted or not self.running[name].database.same(wanted[name]):
                self._stop(group, name, "removed from" if name not in wanted else
                           "changed in")
        for name, database in wanted.items():
            if name not in self.running:
                self._start(group, database)
        print(f"outbox-lite relay: SIGHUP: re-read {self.path}: {len(self.running)} databases"
              f" ({', '.join(self.running)})", file=sys.stderr, flush=True)

    def _stop(self, group: Any, name: str, why: str) -> None:
        running = self.running.pop(name)
        try:
            group.remove(name)  # its batch in hand recorded first
        finally:
            running.close()
            if self.metrics is not None:
                self.metrics.forget(name)
        print(f"outbox-lite relay {running.relay.worker_id}: database {name} {why}"
              f" {self.path}: its relay stopped", file=sys.stderr, flush=True)

    def _start(self, group: Any, database: _databases.Database) -> None:
        try:
            running = self._make(database)
        except Exception as exc:  # noqa: BLE001 - a broker that fails: the others go on
            if _signals.interruption(exc) is not None:
                raise
            print(f"outbox-lite relay: SIGHUP: database {database.name} not started:"
                  f" {describe_error(exc, database.url, 'relay')}", file=sys.stderr,
                  flush=True)
            return
        self.running[database.name] = running
        self._check(running)
        group.add(running.relay, database.name)
        self._say_running(running, "added ")
