"""Publishers: broker clients that the relay hands claimed events to.

Each publisher lives in a module of its own and imports its broker's client only there, so
``import outbox_lite`` never needs an optional dependency. ``outbox_lite.publishers.bullmq``
(the ``[bullmq]`` extra) is the one that ships.
"""
