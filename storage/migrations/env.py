"""Alembic environment: the connection is handed in by storage.migrate (no alembic.ini, no URL in files)."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import storage.models  # noqa: F401  (registers the tables for autogenerate)

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=SQLModel.metadata, render_as_batch=True,
                  compare_type=True)
with context.begin_transaction():
    context.run_migrations()
