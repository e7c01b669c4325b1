#!/usr/bin/env python3
"""The multi-worker lock contention suite: the same command as ``outbox-lite contention``.

Usage: python scripts/contention.py [--workers 8] [--events 2000] [--scenario NAME] [--json]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout too

from outbox_lite.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["contention", *sys.argv[1:]]))
