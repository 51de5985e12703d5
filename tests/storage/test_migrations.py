"""Migrations on SQLite and PostgreSQL: from nothing and from the previous version to head, the models agree with
them, the schema check at start, and the SQLite connection settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from sqlmodel import Session, SQLModel, select

import storage.models  # noqa: F401  (registers every table in SQLModel.metadata)
from storage.connect import open_database
from storage.engine import SQLITE_BUSY_TIMEOUT_MS, make_engine
from storage.migrate import SchemaNewer, SchemaOutdated, current_revision, ensure_schema, head_revision, upgrade
from storage.models import Job
from storage.settings import load_settings

TABLES_0001 = {"jobs", "runners", "candidates", "evaluations"}
TABLES_0002 = {"sessions", "steps", "decisions", "session_events", "event_deliveries", "schedules", "digest_runs"}
TABLES_0005 = {"slack_messages", "slack_inbox"}
TABLES_0006 = {"digest_subscriptions"}
TABLES_0007 = {"blobs"}
TABLES_0008 = {"tuned_params"}
ALL_TABLES = TABLES_0001 | TABLES_0002 | TABLES_0005 | TABLES_0006 | TABLES_0007 | TABLES_0008


@pytest.fixture
def bare_engine(database_url: str) -> Iterator[Engine]:
    """An engine on an empty database: no tables, no revision."""
    eng = make_engine(database_url)
    yield eng
    eng.dispose()


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_the_revisions_form_one_line_ending_at_the_head() -> None:
    assert head_revision() == "0008"


def test_the_migrated_schema_has_every_column_and_index_the_models_declare(bare_engine: Engine) -> None:
    upgrade(bare_engine)
    inspector = inspect(bare_engine)
    for name, table in SQLModel.metadata.tables.items():
        assert {c["name"] for c in inspector.get_columns(name)} == {c.name for c in table.columns}, name
        migrated = {i["name"] for i in inspector.get_indexes(name)}
        assert {i.name for i in table.indexes} <= migrated, name


def test_upgrading_an_empty_database_creates_every_table(bare_engine: Engine) -> None:
    assert current_revision(bare_engine) is None
    assert _tables(bare_engine) == set()
    upgrade(bare_engine)
    assert current_revision(bare_engine) == head_revision()
    assert _tables(bare_engine) == set(SQLModel.metadata.tables)
    assert set(SQLModel.metadata.tables) == ALL_TABLES


def test_upgrading_again_changes_nothing(bare_engine: Engine) -> None:
    upgrade(bare_engine)
    upgrade(bare_engine)
    assert current_revision(bare_engine) == head_revision()


def test_upgrading_from_0001_keeps_the_jobs(bare_engine: Engine) -> None:
    upgrade(bare_engine, "0001")
    assert current_revision(bare_engine) == "0001"
    assert _tables(bare_engine) == TABLES_0001
    with bare_engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (kind, payload, status, priority, dedup_key, attempts, max_attempts, fence, run_after, "
            "created_at) VALUES ('evaluate', '{\"task\": \"matmul\"}', 'queued', 7, 'matmul@v6e', 0, 3, 0, "
            "1700000000.5, 1700000000.0)"))

    upgrade(bare_engine)
    assert current_revision(bare_engine) == head_revision()
    assert _tables(bare_engine) == ALL_TABLES
    with Session(bare_engine) as s, s.begin():
        jobs = s.exec(select(Job)).all()
        assert [(j.kind, j.status, j.priority, j.dedup_key, j.payload, j.run_after) for j in jobs] == [
            ("evaluate", "queued", 7, "matmul@v6e", {"task": "matmul"}, 1700000000.5)]


def test_upgrading_from_0004_keeps_digest_runs_and_gives_them_no_attempts(bare_engine: Engine) -> None:
    upgrade(bare_engine, "0004")
    with bare_engine.begin() as conn:
        conn.execute(text("INSERT INTO digest_runs (channel, period, status, created_at) "
                          "VALUES ('C1', '2026-11-30', 'posted', 1700000000.0)"))
    upgrade(bare_engine)
    with bare_engine.connect() as conn:
        rows = conn.execute(text("SELECT channel, period, attempts, payload FROM digest_runs")).all()
    assert [tuple(r) for r in rows] == [("C1", "2026-11-30", 0, None)]


def test_upgrading_from_0005_adds_digest_subscriptions_and_keeps_the_digest_runs(bare_engine: Engine) -> None:
    upgrade(bare_engine, "0005")
    assert "digest_subscriptions" not in _tables(bare_engine)
    with bare_engine.begin() as conn:
        conn.execute(text("INSERT INTO digest_runs (channel, period, status, attempts, created_at) "
                          "VALUES ('C1', '2026-11-30', 'posted', 1, 1700000000.0)"))
    upgrade(bare_engine)
    with bare_engine.begin() as conn:
        conn.execute(text("INSERT INTO digest_subscriptions (channel, subscribed, changed_by, changed_at) "
                          "VALUES ('C2', false, 'U1', 1700000001.0)"))
        rows = conn.execute(text("SELECT channel, subscribed, changed_by FROM digest_subscriptions")).all()
        runs = conn.execute(text("SELECT channel, period, attempts FROM digest_runs")).all()
    assert [tuple(r) for r in rows] == [("C2", False, "U1")]
    assert [tuple(r) for r in runs] == [("C1", "2026-11-30", 1)]


def test_the_models_match_the_migrations(bare_engine: Engine) -> None:
    upgrade(bare_engine)
    with bare_engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                       SQLModel.metadata)
    assert differences == [], f"the models and the migrations differ on {bare_engine.dialect.name}: {differences}"


def test_ensure_schema_refuses_an_outdated_database_and_names_the_command(bare_engine: Engine) -> None:
    upgrade(bare_engine, "0001")
    with pytest.raises(SchemaOutdated, match="kernelbot db upgrade") as raised:
        ensure_schema(bare_engine, upgrade_if_needed=False)
    assert "0001" in str(raised.value) and head_revision() in str(raised.value)
    assert current_revision(bare_engine) == "0001"  # nothing was changed

    ensure_schema(bare_engine, upgrade_if_needed=True)
    assert current_revision(bare_engine) == head_revision()
    ensure_schema(bare_engine, upgrade_if_needed=False)  # up to date: no complaint


def test_ensure_schema_on_an_empty_database_says_nothing_is_there(bare_engine: Engine) -> None:
    with pytest.raises(SchemaOutdated, match="at nothing"):
        ensure_schema(bare_engine, upgrade_if_needed=False)
    assert _tables(bare_engine) == set()


def test_ensure_schema_on_a_database_a_newer_kernelbot_migrated_says_the_code_is_older(bare_engine: Engine) -> None:
    upgrade(bare_engine)
    with bare_engine.begin() as conn:  # what a later release's migration leaves behind
        conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))
    for upgrade_if_needed in (False, True):  # SQLite, which upgrades itself, must not try either
        with pytest.raises(SchemaNewer, match="at 0999, which this kernelbot does not know") as raised:
            ensure_schema(bare_engine, upgrade_if_needed=upgrade_if_needed)
        assert "newer kernelbot" in str(raised.value) and "db upgrade" not in str(raised.value)
    assert current_revision(bare_engine) == "0999"


def test_open_database_upgrades_an_embedded_sqlite_database_itself(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    engine = open_database(settings)
    try:
        assert engine.dialect.name == "sqlite"
        assert (tmp_path / "home" / "kernelbot.db").is_file()
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_open_database_upgrades_an_outdated_sqlite_database_itself(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path)})
    old = make_engine(settings.database)
    upgrade(old, "0001")
    old.dispose()
    engine = open_database(settings)
    try:
        assert current_revision(engine) == head_revision()
        assert _tables(engine) == ALL_TABLES
    finally:
        engine.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_open_database_refuses_an_outdated_postgresql_database(database_url: str, tmp_path: Path) -> None:
    old = make_engine(database_url)
    upgrade(old, "0001")
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "KERNELBOT_DATABASE_URL": database_url})
    with pytest.raises(SchemaOutdated, match="kernelbot db upgrade"):
        open_database(settings)
    assert current_revision(old) == "0001"  # an operator upgrades a shared server, not a process starting
    upgrade(old)
    engine = open_database(settings)
    try:
        assert engine.dialect.name == "postgresql"
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
        old.dispose()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_sqlite_connections_use_wal_and_a_busy_timeout(engine: Engine) -> None:
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == SQLITE_BUSY_TIMEOUT_MS == 30000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
