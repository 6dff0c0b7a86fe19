"""session lifecycle claim: owner, lease, end status, spawner wait

Revision ID: 0005
Revises: 0004
"""

from alembic import op
import sqlalchemy as sa
import jupyterhub_backendai.models.base


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('lease_until', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('end_status', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('awaited_until', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('awaited_until')
        batch_op.drop_column('end_status')
        batch_op.drop_column('lease_until')
        batch_op.drop_column('owner')
