"""Databases for storage tests: SQLite in a temporary file, and a fresh database on the real PostgreSQL server
(KERNELBOT_TEST_DATABASE_URL, set by .ci/run). Without a reachable server the PostgreSQL cases are skipped
with the reason shown in the summary (pytest -ra)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from storage.engine import make_engine, normalise_url
from storage.migrate import upgrade

DEFAULT_TEST_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def _server_url() -> str:
    return os.environ.get("KERNELBOT_TEST_DATABASE_URL", DEFAULT_TEST_SERVER)


def fresh_database_url(kind: str, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty database of this kind, dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'kernelbot.db'}"
        return
    server = make_url(normalise_url(_server_url()))
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    name = f"kb_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # no server here: say so in the summary
        admin.dispose()
        pytest.skip(f"PostgreSQL not reachable at {server.render_as_string(hide_password=True)}: {exc}")
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from fresh_database_url(request.param, tmp_path)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A migrated, empty database."""
    eng = make_engine(database_url)
    upgrade(eng)
    yield eng
    eng.dispose()
