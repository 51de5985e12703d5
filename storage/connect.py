"""Opening the database at an entry point: the engine for the configured URL, with its schema checked."""

from __future__ import annotations

from sqlalchemy import Engine

from storage.engine import is_sqlite, make_engine
from storage.migrate import ensure_schema
from storage.settings import Settings


def open_database(settings: Settings) -> Engine:
    """The embedded SQLite default upgrades itself; a shared PostgreSQL must be upgraded by an operator
    (`kernelbot db upgrade`) - a process facing an older schema refuses to start and says so."""
    settings.home.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.database)
    try:
        ensure_schema(engine, upgrade_if_needed=is_sqlite(engine))
    except Exception:
        engine.dispose()
        raise
    return engine
