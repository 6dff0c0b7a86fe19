"""warm pools (issue 30)

Revision ID: 0014
Revises: 0013

``warm_pools``: per resource group, image and resource preset, how many kernels are kept
started and unassigned, and why the pool is not full.
"""

import sqlalchemy as sa
from alembic import op

import jupyterhub_backendai.models.base

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'warm_pools',
        sa.Column('resource_group', sa.String(length=64), nullable=False),
        sa.Column('image', sa.String(length=256), nullable=False),
        sa.Column('preset', sa.String(length=64), nullable=False),
        sa.Column('size', sa.Integer(), nullable=False),
        sa.Column('status_info', sa.Text(), nullable=False),
        sa.Column('updated_at', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['resource_group'], ['resource_groups.name'], name=op.f('fk_warm_pools_resource_group_resource_groups'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['preset'], ['resource_presets.name'], name=op.f('fk_warm_pools_preset_resource_presets'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('resource_group', 'image', 'preset', name=op.f('pk_warm_pools')),
    )


def downgrade() -> None:
    op.drop_table('warm_pools')
