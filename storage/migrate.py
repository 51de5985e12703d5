"""Schema migrations (Alembic, shipped in the package): upgrade, and the check servers run at start."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Engine

from storage.errors import KernelbotError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class SchemaOutdated(KernelbotError, RuntimeError):
    """The database is behind the code; the message says which command upgrades it."""
    next_step = "run `kernelbot db upgrade`"


class SchemaNewer(KernelbotError, RuntimeError):
    """The database was migrated by a newer kernelbot than this one; the message says to upgrade the code."""
    next_step = "install the kernelbot version that migrated the database (`kernelbot doctor` shows both)"


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def known_revision(revision: str) -> bool:
    """Whether this code ships `revision` (a database at an unknown one was migrated by a newer kernelbot)."""
    try:
        return ScriptDirectory.from_config(_config()).get_revision(revision) is not None
    except CommandError:  # "Can't locate revision identified by ..."
        return False


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    config = _config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def revision(engine: Engine, message: str) -> None:
    """Autogenerate a new revision from the models (a developer's tool)."""
    config = _config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.revision(config, message=message, autogenerate=True)


def ensure_schema(engine: Engine, *, upgrade_if_needed: bool) -> None:
    """The embedded SQLite default upgrades itself; a shared server database is upgraded by an operator."""
    current = current_revision(engine)
    if current == head_revision():
        return
    if current is not None and not known_revision(current):
        raise SchemaNewer(f"the database schema is at {current}, which this kernelbot does not know (its newest is "
                          f"{head_revision()}): a newer kernelbot migrated it; run the same version as the others")
    if upgrade_if_needed:
        upgrade(engine)
        return
    raise SchemaOutdated(f"the database schema is at {current or 'nothing'}, the code needs {head_revision()}: "
                         "run `kernelbot db upgrade` (with the same KERNELBOT_DATABASE_URL) first")
