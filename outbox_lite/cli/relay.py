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

from .. import _signals
from .._families.url import DatabaseUrl
from ..publishers._binding import Binding, bindings
from ._args import (EXIT_OK, CommandError, UsageError, add_database_flag, open_repository,
                    parse_age_or_seconds, parse_port, parse_positive, parse_seconds)


def add_commands(commands: Any) -> None:
    """Add relay to the ``outbox-lite`` subcommands."""
    p = commands.add_parser(
        "relay", help=f"publish events to {', '.join(b.name for b in bindings())} (or any"
                      " publisher) until stopped",
        description="Runs the worker loop: release expired claims, claim a batch, publish it "
                    "outside any transaction (renewing the claims while a publish runs long), "
                    "record the outcomes. SIGTERM or SIGINT stop it once the batch in hand "
                    "is recorded; a second SIGINT stops it at once. A progress line goes to "
                    "stderr every few seconds; payloads and credentials never do.")
    add_database_flag(p)
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



def _cmd_relay(args: argparse.Namespace, url: DatabaseUrl) -> int:
    from ..relay import Relay

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
