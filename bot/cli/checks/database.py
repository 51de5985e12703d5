"""The database: reachable, writable, and at the schema this kernelbot migrates to."""

from __future__ import annotations

import os
from pathlib import Path

from bot.cli.checks.report import Check
from storage.settings import Settings

DATABASE_TIMEOUT_S = 5


def _shown_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _sqlite_path(url: str) -> Path | None:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _writable_dir(path: Path) -> Path | None:
    """The nearest existing directory at or above `path` if it can be written in, else None."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate if candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK) else None
    return None


def check_database(settings: Settings) -> Check:
    """Reachable and at the schema head. SQLite upgrades itself; a server database must be upgraded by hand."""
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from storage.engine import make_engine
    from storage.migrate import current_revision, head_revision, known_revision

    url = settings.database
    variable = "KERNELBOT_DATABASE_URL" if settings.database_url else "KERNELBOT_HOME"
    try:
        shown = _shown_url(url)
    except ArgumentError:
        return Check("database", "fail", f"{variable} is not a database URL", "set it like "
                     "postgresql://user@host:5432/kernelbot, or unset it for SQLite in KERNELBOT_HOME")
    sqlite_file = _sqlite_path(url)
    sqlite = url.startswith("sqlite")
    if sqlite_file is not None and not sqlite_file.exists():
        place = _writable_dir(sqlite_file.parent)
        if place is None:
            return Check("database", "fail", f"SQLite {sqlite_file} cannot be created: no writable directory on "
                         "its path", f"make {sqlite_file.parent} writable, or set {variable} to another place")
        return Check("database", "ok", f"SQLite {sqlite_file} (not created yet: it is created and migrated to "
                     f"{head_revision()} on first use)")
    engine = None
    try:
        engine = make_engine(url) if sqlite else make_engine(url, connect_args={"connect_timeout": DATABASE_TIMEOUT_S})
        current = current_revision(engine)
    except (SQLAlchemyError, ImportError) as exc:  # ImportError: a driver kernelbot does not ship
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return Check("database", "fail", f"cannot reach {shown}: {reason}",
                     f"check {variable} (a postgresql:// or sqlite:/// URL; is the server running and the database "
                     "created?)" if variable == "KERNELBOT_DATABASE_URL" else
                     f"check that {variable} ({settings.home}) holds a kernelbot SQLite database or none")
    finally:
        if engine is not None:
            engine.dispose()
    head = head_revision()
    if current == head:
        return Check("database", "ok", f"{shown} at the schema head {head}")
    if current is not None and not known_revision(current):
        return Check("database", "fail", f"{shown} is at revision {current}, which this kernelbot does not know "
                     f"(its head is {head}): a newer kernelbot migrated it",
                     f"upgrade kernelbot to the version the others use, or set {variable} to another database")
    at = f"at {current}" if current else "empty (no schema)"
    if sqlite:
        return Check("database", "ok", f"{shown} {at}; it upgrades itself to {head} at the next start")
    return Check("database", "fail", f"{shown} is {at}, the code needs {head}: processes refuse to start on it",
                 "run `kernelbot db upgrade` (with the same KERNELBOT_DATABASE_URL), then doctor again")
