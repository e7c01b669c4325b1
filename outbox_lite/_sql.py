"""The old name of :mod:`outbox_lite._families.mysql_sql`, the MySQL family's statements: this
module *is* that one (a test that patches ``outbox_lite._sql.HEADS`` patches the statement
the library runs)."""

import sys

from ._families import mysql_sql

sys.modules[__name__] = mysql_sql
