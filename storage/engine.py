"""Database engines: SQLite in the data directory by default, PostgreSQL (psycopg 3) when configured.

SQLite is made safe for several local processes: WAL journal, a busy timeout, and every transaction opened
with BEGIN IMMEDIATE so that two writers queue on the lock instead of failing half-way through.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

SQLITE_BUSY_TIMEOUT_MS = 30_000


def normalise_url(url: str) -> str:
    """postgresql:// and postgres:// mean psycopg 3 here."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str, **kwargs: Any) -> Engine:
    url = normalise_url(url)
    if make_url(url).get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **kwargs)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
                           **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below), not the driver
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
