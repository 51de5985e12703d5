"""The search graph: candidates carry search bookkeeping and point at the candidate they duplicate; a session
holds each normalised lowered program once.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.add_column(sa.Column('meta', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('duplicate_of', sa.Integer(), nullable=True))
        batch_op.create_index('ux_candidates_session_ir', ['session_id', 'ir_hash'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.drop_index('ux_candidates_session_ir')
        batch_op.drop_column('duplicate_of')
        batch_op.drop_column('meta')
