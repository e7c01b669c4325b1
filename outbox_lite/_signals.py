"""Signals for the commands: SIGTERM and SIGINT turned into a stop, with no lock taken and
nothing printed in signal context.

A Python signal handler runs in the main thread between two bytecodes, wherever that thread
is: inside ``Event.wait()`` holding the Event's lock (then ``Event.set()`` in the handler
waits for that lock forever: a self-deadlock), or inside a write to ``sys.stderr`` holding
its buffer's lock (then a ``print`` in the handler raises "reentrant call"). So the handlers
here only count the signal, and raise ``KeyboardInterrupt`` for a signal that must stop at
once (as Python's own SIGINT handler does: raising takes no lock). The C-level handler also
writes the signal's number to a pipe (:func:`signal.set_wakeup_fd`, before any Python code
runs); a thread of ours reads it and, in ordinary thread context, sets the stop Event and
writes the message.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Callable, Iterator

#: ``say(signum, first)``: called in the watcher thread for each stop signal, after the stop
#: Event is set; ``first`` tells the first such signal from a later one.
Say = Callable[[int, bool], None]
_Handler = Callable[[int, "FrameType | None"], None]


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by a signal that stops a command at once; ``signum`` says
    which (``signal.Signals(signum).name``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, say: Say,
                    reload: threading.Event | None = None) -> Iterator[None]:
    """While in the block: the first SIGTERM or SIGINT sets ``stop`` (from a thread of its
    own, never from the handler); a SIGINT after an earlier stop signal raises
    :class:`Interrupted` in the main thread at once; a later SIGTERM only calls ``say``.
    With ``reload``, each SIGHUP sets that Event (and stops nothing): whoever waits on it
    re-reads its configuration. Must be entered from the main thread. The previous handlers
    and wakeup fd come back afterwards."""
    # Two views of the order of signals: the handler's (the order Python runs handlers in,
    # which for signals pending together is by number, SIGINT first) and the watcher's (the
    # order the signals arrived in). The watcher's decides; the handler's lets a second
    # SIGINT interrupt a blocking call in the main thread at once.
    handled = [0]  # stop signals whose handler ran: touched by the main thread only
    interrupt = [False]  # set by the watcher: the next handler run raises
    raised = [False]  # raise once: a later signal must not interrupt the clean-up
    main_thread = threading.main_thread().ident

    def handler(signum: int, frame: FrameType | None) -> None:
        handled[0] += 1
        at_once = interrupt[0] or (signum == signal.SIGINT and handled[0] > 1)
        if at_once and not raised[0]:
            if _in_finalizer(frame):  # raised there, it would be printed and dropped
                _again_soon(signal.SIGINT)
                return
            raised[0] = True
            raise Interrupted(signal.SIGINT)

    stops = [0]  # stop signals read by the watcher (a SIGHUP is none)

    def react(signum: int, _read: int) -> None:
        if signum == signal.SIGHUP:
            if reload is not None:
                reload.set()
            return
        stops[0] += 1
        count = stops[0]
        if count == 1:
            stop.set()
            say(signum, True)
        elif signum == signal.SIGTERM:
            say(signum, False)
        elif not interrupt[0]:  # a SIGINT after an earlier stop signal: stop at once
            interrupt[0] = True
            if main_thread is not None:  # a real signal, so a blocking call is interrupted
                signal.pthread_kill(main_thread, signal.SIGINT)

    def reread(signum: int, frame: FrameType | None) -> None:
        """Nothing in signal context: the watcher thread sets ``reload``."""

    handlers: dict[int, _Handler] = {signal.SIGTERM: handler, signal.SIGINT: handler}
    if reload is not None:
        handlers[signal.SIGHUP] = reread
    with _watching(react, handlers):
        yield


@contextlib.contextmanager
def interrupt_on(*signums: int) -> Iterator[None]:
    """While in the block, each of ``signums`` raises :class:`Interrupted` in the main
    thread, as Python's default SIGINT handler raises KeyboardInterrupt (for commands whose
    clean-up runs in ``finally`` blocks)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if _in_finalizer(frame):  # raised there, it would be printed and dropped
            _again_soon(signum)
            return
        raise Interrupted(signum)

    with _handlers(dict.fromkeys(signums, handler)):
        yield


#: Seconds before a signal whose handler ran inside a finalizer is delivered again.
_AGAIN_AFTER = 0.005


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether the main thread, interrupted at ``frame``, is running a finalizer
    (``__del__``): Python prints an exception raised there ("Exception ignored in …") and
    drops it, so an interrupt raised there would stop nothing (CI: a second Ctrl-C that
    landed in PyMySQL's MySQLResult.__del__ let the relay finish its batch, with a
    traceback)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _again_soon(signum: int) -> None:
    """Deliver ``signum`` to the main thread again in a moment, once it has left the
    finalizer (a real signal, so that a blocking call is interrupted)."""
    main_thread = threading.main_thread().ident
    if main_thread is not None:
        timer = threading.Timer(_AGAIN_AFTER, signal.pthread_kill, (main_thread, signum))
        timer.daemon = True
        timer.start()


@contextlib.contextmanager
def _handlers(handlers: dict[int, _Handler]) -> Iterator[None]:
    previous = {signum: signal.signal(signum, h) for signum, h in handlers.items()}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def _watching(react: Callable[[int, int], None], handlers: dict[int, _Handler],
              ) -> Iterator[None]:
    """``handlers`` installed, a pipe as the process's signal wakeup fd, and a thread that
    calls ``react(signum, count)`` for each of their signals read from it (``count``: how many
    so far, this one included). The watcher starts before the handlers and stops before they
    are restored, so no signal in the block goes unwatched."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C handler must never block
    count = 0

    def watch() -> None:
        nonlocal count
        try:
            while data := os.read(read_end, 64):  # b"" once the write end is closed
                for signum in data:
                    if signum in handlers:  # not another handler's sharing the fd
                        count += 1
                        react(signum, count)
        except (OSError, ValueError):  # stderr closed, or the pipe under a late read
            pass

    thread = threading.Thread(target=watch, name="outbox-lite-signals", daemon=True)
    thread.start()
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    watching = True

    def stop_watching() -> None:
        nonlocal watching
        if watching:
            watching = False
            signal.set_wakeup_fd(previous_fd)
            os.close(write_end)  # the watcher reads what is left, then b""
            thread.join(timeout=5)

    try:
        with _handlers(handlers):
            try:
                yield
            finally:
                stop_watching()  # while the handlers are still ours
    finally:
        stop_watching()
        os.close(read_end)


def interruption(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt ``exc`` was raised while unwinding from, if any (a ROLLBACK on the
    connection an interrupt broke raises InterfaceError and hides it): that error is the
    interrupt's consequence, and the interrupt must stop at once, not pass for a lost
    connection."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None
