"""MariaDB and MySQL: what differs between the two servers of the MySQL family, and why, in this
one place.

outbox_lite runs the same SQL on both wherever it can; where the servers differ, the rooms
that care (the contention suite, the tests, the docs) ask :func:`server_of` and read the
answer here, so no other module branches on the kind of server. Each difference is one name
below, with the reason beside it.

What is *not* a difference, checked on MariaDB 10.11 and MySQL 9.7:

* ``information_schema.INNODB_METRICS`` counts deadlocks and row-lock waits on both, under the
  same names (``lock_deadlocks``, ``lock_row_lock_waits``). MariaDB's status variable
  ``Innodb_deadlocks`` does not exist on MySQL.
* ``EXPLAIN FORMAT=TRADITIONAL`` answers in the tabular form on both (MySQL 9.7 answers
  ``EXPLAIN`` alone in its tree format).
* An aggregate's head (``mysql_sql.HEADS``) is one index read on both when its ``ORDER BY`` names
  the aggregate index's leading columns (``ORDER BY o.id`` alone makes MySQL sort all the
  aggregate's unpublished entries). A head test per event, as a dependent subquery, would be
  cheap on MariaDB only, which caches a subquery's result per outer value; the ordered claim
  reads one head per aggregate instead, the same SQL on both.
* A missing privilege: both answer 1142 (``… command denied to user …``) for a table the user
  may not read, whether it exists or not, and 1044 for a database the user has no privilege
  on, whether it exists or not: only a user who may see it is told 1146 or 1049.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .contract import LockCounters

#: The tabular EXPLAIN on both servers.
EXPLAIN = "EXPLAIN FORMAT=TRADITIONAL"

_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.(\d+)")

Query = Callable[[str], Sequence[Sequence[Any]]]


@dataclass(frozen=True)
class Server:
    """One server, as ``SELECT VERSION()`` describes it."""

    #: What ``SELECT VERSION()`` answered, e.g. ``10.11.19-MariaDB-0+deb12u1`` or ``9.7.4-2``.
    version_text: str

    @property
    def is_mariadb(self) -> bool:
        return "mariadb" in self.version_text.lower()

    @property
    def kind(self) -> str:
        return "MariaDB" if self.is_mariadb else "MySQL"

    @property
    def version(self) -> tuple[int, int, int]:
        match = _VERSION_RE.search(self.version_text)
        if match is None:
            raise ValueError(f"cannot read a version from {self.version_text!r}")
        major, minor, patch = (int(part) for part in match.groups())
        return major, minor, patch

    def __str__(self) -> str:
        return f"{self.kind} {'.'.join(map(str, self.version))}"

    # -- how the schema reads back -----------------------------------------------------------

    @property
    def integer_display_width(self) -> bool:
        """Whether ``information_schema`` shows integer display widths (``int(10) unsigned``):
        MariaDB does; MySQL stopped in 8.0.19 (``int unsigned``)."""
        return self.is_mariadb or self.version < (8, 0, 19)

    @property
    def json_column_type(self) -> str:
        """What a ``JSON`` column is: MariaDB's JSON is an alias of LONGTEXT (with a
        ``json_valid`` CHECK) that keeps the text as written; MySQL's is a binary type that
        answers with text of its own (keys sorted, its own spacing, numbers as it holds them:
        see ``outbox_lite.payload`` for what that means for payloads)."""
        return "longtext" if self.is_mariadb else "json"

    @property
    def keeps_json_text(self) -> bool:
        """Whether a JSON column gives back the text it was given. MariaDB does. MySQL gives
        an equal JSON value in text of its own: keys sorted by length then bytes, a space
        after ``:`` and ``,`` (``{"job_id":7,"sizes":[1]}`` reads ``{"sizes": [1], "job_id":
        7}``); integers beyond 64 bits would come back as floats, which is why
        ``outbox_lite.payload`` refuses them on both servers."""
        return self.is_mariadb

    # -- lock counters ---------------------------------------------------------------------

    #: Enabled InnoDB metrics read 'enabled' on MySQL and 1 on MariaDB, in a column of its own
    #: name; an operator may disable them (innodb_monitor_disable), and then they stand still.
    @property
    def _metric_enabled(self) -> str:
        return "enabled = 1" if self.is_mariadb else "status = 'enabled'"

    def lock_counters(self, query: Query) -> LockCounters:
        """The deadlock and row-lock-wait counters, read with ``query(sql) -> rows``.

        Raises RuntimeError when the server does not count them (its InnoDB metrics
        ``lock_deadlocks`` or ``lock_row_lock_waits`` are disabled), rather than answer 0.
        """
        rows = query("SELECT name, count FROM information_schema.INNODB_METRICS"
                     " WHERE name IN ('lock_deadlocks', 'lock_row_lock_waits')"
                     f" AND {self._metric_enabled}")
        counts = {str(name): int(count) for name, count in rows}
        missing = {"lock_deadlocks", "lock_row_lock_waits"} - set(counts)
        if missing:
            raise RuntimeError(
                f"{self} does not count {', '.join(sorted(missing))}: enable it with"
                f" SET GLOBAL innodb_monitor_enable = '{sorted(missing)[0]}'")
        return LockCounters(counts["lock_deadlocks"], counts["lock_row_lock_waits"])

    # -- sessions --------------------------------------------------------------------------

    @property
    def isolation_variable(self) -> str:
        """The session variable that holds the isolation level: MariaDB before 11.1 knows
        only ``tx_isolation`` (later ones both); MySQL 8.0 removed it for
        ``transaction_isolation``. Neither shows a level set for the next transaction alone
        (``SET TRANSACTION ISOLATION LEVEL …``), before or during it."""
        return "tx_isolation" if self.is_mariadb else "transaction_isolation"

    # -- logins and TLS --------------------------------------------------------------------

    @property
    def password_plugin(self) -> str:
        """The plugin of an account made with ``CREATE USER … IDENTIFIED BY`` and no plugin
        named: MySQL 8.0 made it caching_sha2_password (MySQL 9 removed mysql_native_password);
        MariaDB keeps mysql_native_password."""
        return "mysql_native_password" if self.is_mariadb else "caching_sha2_password"

    @property
    def caches_logins(self) -> bool:
        """Whether a password login without TLS depends on the server's auth cache.

        caching_sha2_password (MySQL) answers a login from its cache, which a full
        authentication fills and a restart or ``FLUSH PRIVILEGES`` empties; without TLS, a
        login the cache cannot answer sends the password RSA-encrypted with the server's key
        (PyMySQL needs the cryptography package for that: its ``rsa`` extra). MariaDB's
        mysql_native_password is a challenge-response with no cache and no RSA.
        """
        return not self.is_mariadb

    def offers_tls(self, query: Query) -> bool:
        """Whether the server accepts TLS connections now. MySQL 8+ creates a self-signed CA
        and server certificate when its data directory is initialised and offers TLS by
        default (``performance_schema.tls_channel_status`` says so; ``have_ssl`` is gone in
        MySQL 9); MariaDB before 11.4 offers it only when given certificates
        (``have_ssl`` is YES, else DISABLED)."""
        if self.is_mariadb:
            return str(query("SELECT @@have_ssl")[0][0]) == "YES"
        rows = query("SELECT value FROM performance_schema.tls_channel_status"
                     " WHERE channel = 'mysql_main' AND property = 'Enabled'")
        return bool(rows) and str(rows[0][0]) == "Yes"


def server_of(query: Query) -> Server:
    """The server behind ``query(sql) -> rows`` (one ``SELECT VERSION()``)."""
    return Server(str(query("SELECT VERSION()")[0][0]))


def peewee_query(database: Any) -> Query:
    """``query(sql) -> rows`` on a Peewee database."""
    return lambda statement: database.execute_sql(statement).fetchall()
