#!/usr/bin/env python3
"""Apply outbox_lite's schema migrations: the same command as ``outbox-lite migrate``.

Usage: python scripts/migrate.py [--database-url URL] [--rollback]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout too

from outbox_lite.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["migrate", *sys.argv[1:]]))
