#!/usr/bin/env python3
"""outbox_lite's benchmarks, one entry point: ``python scripts/bench.py SUBCOMMAND [options]``.

``python scripts/bench.py --help`` lists the subcommands; ``python scripts/bench.py SUBCOMMAND
--help`` gives one's options. The subcommands are the modules of ``scripts/benchmarks/``,
which share their setup (``benchmarks/_setup.py``) and the raw-driver twins
(``benchmarks/raw_mysql.py``, ``benchmarks/raw_pg.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout too

from benchmarks import main  # noqa: E402  (beside this script)

if __name__ == "__main__":
    sys.exit(main())
