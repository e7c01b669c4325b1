"""Retry backoff: exponential, capped, with jitter."""

from __future__ import annotations

import datetime as dt
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import InvalidEventError

#: The longest delay a Backoff may give: a year, far inside DATETIME's range.
MAX_DELAY = 366 * 86400.0


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidEventError(f"Backoff {name} must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidEventError(f"Backoff {name} must be finite, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` (1-based): ``min(cap, base * factor ** (n - 1))``, then
    reduced by a random share of up to ``jitter`` (0 = exact, 0.5 = up to half off).

    ``random`` returns floats in [0, 1); inject a fixed one for exact delays in tests.
    Bad values raise InvalidEventError (a ValueError) when the Backoff is made.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.2
    random: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        base, factor = _seconds("base", self.base), _seconds("factor", self.factor)
        cap, jitter = _seconds("cap", self.cap), _seconds("jitter", self.jitter)
        if not (base > 0 and factor >= 1 and cap >= base):
            raise InvalidEventError("Backoff needs base > 0, factor >= 1 and cap >= base")
        if cap > MAX_DELAY:
            raise InvalidEventError(f"Backoff cap must be at most {MAX_DELAY:.0f} s (366 days)")
        if not 0 <= jitter < 1:
            raise InvalidEventError("Backoff jitter must be in [0, 1)")
        if not callable(self.random):
            raise InvalidEventError("Backoff random must be a callable returning [0, 1)")

    def uncapped_attempts(self) -> int:
        """How many retries have a delay below the cap (those after it all wait ``cap``)."""
        n, delay = 0, self.base
        while delay < self.cap and n < 64:
            n, delay = n + 1, delay * self.factor
        return max(n, 1)

    def delay(self, attempt: int) -> dt.timedelta:
        """The delay before the retry that follows failed attempt number ``attempt``."""
        exponent = min(max(attempt, 1) - 1, 64)
        try:
            seconds = min(self.cap, self.base * self.factor ** exponent)
        except OverflowError:  # factor ** exponent beyond a float: long past the cap
            seconds = self.cap
        seconds *= 1 - self.jitter * self.random()
        return dt.timedelta(seconds=seconds)
