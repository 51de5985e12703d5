"""Slack delivery state: the messages kernelbot posted (by key, so it edits them and never posts twice), the
inbound deliveries it handled, digests' contents and attempts, delivery errors, sessions found by thread.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('slack_messages',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('scope', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('key', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('channel', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('ts', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('content_hash', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('scope', 'key', name='ux_slack_messages_key')
    )
    with op.batch_alter_table('slack_messages', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_slack_messages_scope'), ['scope'], unique=False)
    op.create_table('slack_inbox',
    sa.Column('key', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    with op.batch_alter_table('digest_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('payload', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('attempts', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('last_error', sa.Text(), nullable=True))
    with op.batch_alter_table('event_deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_error', sa.Text(), nullable=True))
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sessions_slack_thread_ts'), ['slack_thread_ts'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sessions_slack_thread_ts'))
    with op.batch_alter_table('event_deliveries', schema=None) as batch_op:
        batch_op.drop_column('last_error')
    with op.batch_alter_table('digest_runs', schema=None) as batch_op:
        batch_op.drop_column('last_error')
        batch_op.drop_column('attempts')
        batch_op.drop_column('payload')
    op.drop_table('slack_inbox')
    with op.batch_alter_table('slack_messages', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_slack_messages_scope'))
    op.drop_table('slack_messages')
