"""Digest subscriptions: a row per channel that subscribed to the daily digest or unsubscribed from it, with who
and when, over the channels KERNELBOT_DIGEST_CHANNELS lists (the default).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('digest_subscriptions',
    sa.Column('channel', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('subscribed', sa.Boolean(), nullable=False),
    sa.Column('changed_by', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('changed_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('channel')
    )


def downgrade() -> None:
    op.drop_table('digest_subscriptions')
