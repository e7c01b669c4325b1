"""``python -m outbox_lite.cli``: the ``outbox-lite`` command."""

import sys

from . import main

sys.exit(main())
