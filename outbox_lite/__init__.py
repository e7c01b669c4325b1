"""outbox_lite: a Transactional Outbox on Peewee and MySQL/MariaDB."""

from ._db import CONNECTION_ERRORS, is_retryable, reconnect
from ._version import __version__
from .backoff import Backoff
from .errors import (
    ConnectionLostError,
    CredentialInPayloadError,
    DuplicateEventError,
    InvalidEventError,
    IsolationLevelError,
    LockConflictError,
    OutboxError,
    PayloadError,
    SchemaError,
    TransactionRequiredError,
    WriteSetTooLargeError,
)
from .inbox import Inbox
from .models import OutboxEvent, OutboxStatus
from .repository import OutboxRepository, OutboxStats

__all__ = [
    "CONNECTION_ERRORS",
    "Backoff",
    "ConnectionLostError",
    "CredentialInPayloadError",
    "DuplicateEventError",
    "Inbox",
    "InvalidEventError",
    "IsolationLevelError",
    "LockConflictError",
    "OutboxError",
    "OutboxEvent",
    "OutboxRepository",
    "OutboxStats",
    "OutboxStatus",
    "PayloadError",
    "SchemaError",
    "TransactionRequiredError",
    "WriteSetTooLargeError",
    "is_retryable",
    "reconnect",
]
