"""What differs between Peewee 3 and Peewee 4, kept in this one place.

Everything else outbox_lite uses (``execute_sql``, ``atomic``, models, error classes) is the
same on both lines.
"""

from __future__ import annotations

from typing import Any

import peewee as pw
import pymysql


class MySQLDatabase(pw.MySQLDatabase):
    """``peewee.MySQLDatabase`` that connects with PyMySQL's current keyword, ``database=``.

    Peewee 3 passes ``db=``, which PyMySQL 1.1+ answers with a DeprecationWarning on every
    connection; Peewee 4 connects exactly like this.
    """

    def _connect(self) -> Any:
        return pymysql.connect(database=self.database, autocommit=True, **self.connect_params)
