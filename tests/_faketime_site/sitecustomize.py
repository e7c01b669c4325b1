"""Loaded first by every process ``_skewed.skewed_env`` starts (it is on their PYTHONPATH).

libfaketime 0.9.10 makes ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``, which
``time.sleep`` uses since Python 3.11, fail with EINVAL whenever an offset is set, even with
FAKETIME_DONT_FAKE_MONOTONIC. A host whose clock is off sleeps as well as any other, so here
``time.sleep`` waits on a condition instead (its timeout is relative, which libfaketime
passes through).
"""

import threading
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


time.sleep = _sleep
