"""The errors outbox_lite raises; every one is an :class:`OutboxError`."""

from __future__ import annotations


class OutboxError(Exception): """Base class of every error outbox_lite raises."""
class TransactionRequiredError(OutboxError): """A method that needs the caller's transaction ran outside one."""
class InvalidEventError(OutboxError, ValueError): """An argument is of the wrong type, empty, too long or out of range."""
class PayloadError(InvalidEventError): """The payload is not a JSON object or array within the size limit."""
class ConnectionLostError(OutboxError): """No working connection to the server (lost, never opened, unreachable); the message says what reconnects."""
class WrongHostError(ConnectionLostError): """The server answers but cannot take writes (read-only, a standby, a cluster node not ready): reconnect, to the next host of the URL when it lists several."""
class WriteSetTooLargeError(OutboxError): """A cluster refused a transaction over its write-set limit (Galera's wsrep_max_ws_size, Group Replication's group_replication_transaction_size_limit): nothing of it was written; retrying it unchanged fails again, so make it smaller."""
class SchemaError(OutboxError): """The database's tables are not what outbox_lite needs; the message says what differs and how to repair it."""


class IsolationLevelError(OutboxError):
    """A claim ran in a transaction whose isolation level breaks its promises (SERIALIZABLE:
    claimers wait for each other and deadlock); ``isolation`` names it."""

    def __init__(self, isolation: str, method: str = "claim_batch",
                 level: str = "REPEATABLE READ",
                 why: str = "claimers would wait for each other and deadlock") -> None:
        self.isolation = isolation
        super().__init__(
            f"{method}() does not claim in a {isolation} transaction ({why}): claim in"
            f' database.atomic(isolation_level="{level}")')


class CredentialInPayloadError(PayloadError):
    """The payload carries a credential in clear text at ``path`` (the value is never shown)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"payload carries a credential at {path} ({reason}); "
            "send a reference to the secret, not the secret itself"
        )


class CredentialInHeaderError(CredentialInPayloadError):
    """An event header carries a credential: ``header`` names it (the value is never shown)."""

    def __init__(self, header: str, reason: str) -> None:
        self.header = header
        self.path = f"headers[{header!r}]"
        self.reason = reason
        PayloadError.__init__(
            self, f"header {header!r} carries a credential ({reason}); "
            "send a reference to the secret, not the secret itself")


class DuplicateEventError(OutboxError):
    """An event with ``dedupe_key`` exists already; the caller's transaction is still usable."""

    def __init__(self, dedupe_key: str) -> None:
        self.dedupe_key = dedupe_key
        super().__init__(f"an outbox event with dedupe_key {dedupe_key!r} exists already")


class LockConflictError(OutboxError):
    """The server ended a statement, or refused a COMMIT, for a conflict with another
    transaction: on MySQL and MariaDB a deadlock (1213; also Galera's certification failure at
    COMMIT), a lock-wait timeout (1205), or Group Replication's rollback at COMMIT (3101,
    1180); on PostgreSQL a deadlock (40P01), a lock not available (55P03) or a serialization
    failure (40001).

    The server rolled back the statement (deadlock, refused COMMIT: the whole transaction), so
    the caller retries the whole unit of work in a new transaction
    (:func:`outbox_lite.is_retryable` says the same of Peewee's error from a COMMIT of the
    caller's own). ``errno`` says which it was (the
    server's error number, or its SQLSTATE where it has no numbers).
    """

    retryable = True

    def __init__(self, errno: int | str, message: str, server: str = "MySQL") -> None:
        self.errno = errno
        super().__init__(f"{server} error {errno}: {message}; retry the transaction")
