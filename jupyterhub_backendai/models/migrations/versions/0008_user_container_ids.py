"""users' container ids (Backend.AI 26.09)

Revision ID: 0008
Revises: 0007

``container_uid``, ``container_main_gid``, ``container_gids``: the ids Backend.AI 26.09
gives the processes of a user's kernels (``admin user add --cuid/--cgid/--cgids``); null
(every existing user): the image's kernel user.
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(sa.Column('container_uid', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('container_main_gid', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('container_gids', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.drop_column('container_gids')
        batch_op.drop_column('container_main_gid')
        batch_op.drop_column('container_uid')
