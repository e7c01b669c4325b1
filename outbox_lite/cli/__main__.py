"""``python -m outbox_lite.cli``: the ``outbox-lite`` command."""

from . import run

run()
