"""What differs between Peewee 3 and Peewee 4, kept in this one place.

Everything else outbox_lite uses (``execute_sql``, ``atomic``, models, error classes) is the
same on both lines. The one difference, how Peewee 3 hands PyMySQL the database name, is the
MySQL family's (:class:`outbox_lite._families.mysql.MySQLDatabase`), re-exported here.
"""

from __future__ import annotations

from ._families.mysql import MySQLDatabase

__all__ = ["MySQLDatabase"]
