"""A benchmark preset: another bench script's ``main`` with default servers and options.

``bench_pg.py``, ``bench_drain.py`` and ``bench_listen.py`` are each one such preset: its
``--database-url`` (repeatable) replaces the default servers, and any other option is handed
on after the defaults, so it wins (``--rounds 9``, ``--seconds 60``).
"""

from __future__ import annotations

import argparse
from typing import Callable, Sequence


def run(target: Callable[[list[str]], int], description: str, default_urls: Sequence[str],
        defaults: Sequence[str], argv: list[str] | None = None,
        only: Sequence[str] = ()) -> int:
    """``target``'s exit status for the preset's servers and options; ``only`` (measures)
    is given as ``--only`` options unless the caller names measures of its own."""
    parser = argparse.ArgumentParser(description=description, add_help=False)
    parser.add_argument("--database-url", action="append")
    ours, rest = parser.parse_known_args(argv)
    urls = [arg for url in ours.database_url or default_urls
            for arg in ("--database-url", url)]
    chosen = [] if "--only" in rest else [arg for m in only for arg in ("--only", m)]
    return target([*urls, *chosen, *defaults, *rest])  # later options win
