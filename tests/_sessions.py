"""A database session in a thread of its own, for lock tests: a transaction stays open on it
while other sessions run, and its lock waits end after ``wait`` seconds with the server's
lock-wait error (MySQL 1205, PostgreSQL 55P03 lock_not_available)."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

from _helpers import FAMILY


class ThreadSession:
    """One connection on one thread; ``begin``, ``commit``/``rollback`` and ``close`` run there."""

    def __init__(self, db_url: Any, wait: int = 1) -> None:
        self.db = db_url.database()
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._txn: Any = None
        self.run(FAMILY.limit_lock_waits, self.db, wait)
        self.connection_id = self.run(FAMILY.session_id, self.db)

    def start(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        return self._pool.submit(fn, *args)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.start(fn, *args).result(timeout=30)

    def begin(self, isolation: str | None = None) -> None:
        def enter() -> None:
            self._txn = self.db.atomic(isolation_level=isolation) if isolation else (
                self.db.atomic())
            self._txn.__enter__()
        self.run(enter)

    def commit(self) -> None:
        self.run(self._txn.__exit__, None, None, None)

    def rollback(self) -> None:
        self.run(self._txn.__exit__, RuntimeError, RuntimeError("rollback"), None)

    def close(self) -> None:
        """End what the test left open (rolled back) and the connection, then the thread."""
        def end() -> None:
            if self.db.in_transaction():
                self._txn.__exit__(RuntimeError, RuntimeError("test over"), None)
            self.db.close()
        try:
            self.start(end).result(timeout=60)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
