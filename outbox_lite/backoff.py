"""Retry backoff: exponential, capped, with jitter."""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` (1-based): ``min(cap, base * factor ** (n - 1))``, then
    reduced by a random share of up to ``jitter`` (0 = exact, 0.5 = up to half off).

    ``random`` returns floats in [0, 1); inject a fixed one for exact delays in tests.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.2
    random: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.factor >= 1 and self.cap >= self.base):
            raise ValueError("Backoff needs base > 0, factor >= 1 and cap >= base")
        if not 0 <= self.jitter < 1:
            raise ValueError("Backoff jitter must be in [0, 1)")

    def uncapped_attempts(self) -> int:
        """How many retries have a delay below the cap (those after it all wait ``cap``)."""
        n, delay = 0, self.base
        while delay < self.cap and n < 64:
            n, delay = n + 1, delay * self.factor
        return max(n, 1)

    def delay(self, attempt: int) -> dt.timedelta:
        """The delay before the retry that follows failed attempt number ``attempt``."""
        exponent = min(max(attempt, 1) - 1, 64)
        seconds = min(self.cap, self.base * self.factor ** exponent)
        seconds *= 1 - self.jitter * self.random()
        return dt.timedelta(seconds=seconds)
