"""One leader among `serve` processes: only it runs the notifier and the scheduler (two notifiers would race to
post the same event; two schedulers would fire every job twice).

On PostgreSQL, a session-level advisory lock (`pg_try_advisory_lock`) held by a dedicated connection: released
by the server the moment the leader's connection dies, so another process takes over. On SQLite (one host),
an exclusive `flock` on a file beside the database, released by the kernel when the process dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

log = logging.getLogger("kernelbot.leader")


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for the advisory lock."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class LeaderLock:
    def __init__(self, engine: Engine, name: str = "kernelbot-serve", lock_dir: Path | None = None):
        self.engine, self.name = engine, name
        self._conn: Any = None
        self._fd: int | None = None
        self._lock_dir = lock_dir

    @property
    def held(self) -> bool:
        return self._conn is not None or self._fd is not None

    def _lock_file(self) -> Path:
        database = make_url(self.engine.url).database or ""
        if database and database != ":memory:":
            return Path(f"{database}.{self.name}.lock")
        return (self._lock_dir or Path.home()) / f".{self.name}.lock"

    def try_acquire(self) -> bool:
        """Become the leader if nobody is; True while this process leads."""
        if self.held:
            return self.alive()
        if self.engine.dialect.name == "postgresql":
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_key(self.name)}).scalar():
                self._conn = conn
                return True
            conn.close()
            return False
        path = self._lock_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def alive(self) -> bool:
        """Still the leader? (A PostgreSQL connection that died took the lock with it.)"""
        if self._fd is not None:
            return True
        if self._conn is None:
            return False
        try:
            self._conn.execute(text("SELECT 1"))
            return True
        except Exception:  # noqa: BLE001 - any failure means the lock is gone with the connection
            log.warning("leader: lost the database connection that held the lock")
            self._drop()
            return False

    def _drop(self) -> None:
        with contextlib.suppress(Exception):  # closing a dead connection may fail; it is gone either way
            if self._conn is not None:
                self._conn.close()
        self._conn = None

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # released anyway when the connection closes
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock_key(self.name)})
            self._drop()
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
