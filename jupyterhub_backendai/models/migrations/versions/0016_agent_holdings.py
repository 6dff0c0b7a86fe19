"""what an agent holds: its images and its ready pooled kernels (issues 25 and 30)

Revision ID: 0016
Revises: 0015

``agents.images``: the labelled images on the agent's engine, as its last heartbeat
said (NULL: it did not say); ``agents.pool_ready``: its ready pooled kernels per warm
pool (``{"<group>|<image>|<preset>": n}``). The scheduler prefers an agent with a ready
pooled kernel of the session's pool, then one holding the session's image.
"""

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.add_column(sa.Column('images', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('pool_ready', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_column('pool_ready')
        batch_op.drop_column('images')
