"""resource presets (issue 29): named resource slots the spawn form offers as cards,
with three packaged ones (small, medium, large) made once, here

Revision ID: 0011
Revises: 0010
"""

import datetime as dt

import sqlalchemy as sa
from alembic import op

import jupyterhub_backendai.models.base

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

# The packaged presets: within the default keypair resource policy (no limit) and a
# small agent; an admin changes or deletes them in the console (they are made once,
# by this migration, never again).
PACKAGED = [
    ("small", "For notebooks and light work", {"cpu": "1", "mem": str(2 << 30)}),
    ("medium", "For data work and small models", {"cpu": "2", "mem": str(4 << 30)}),
    ("large", "For heavier jobs", {"cpu": "4", "mem": str(8 << 30)}),
]


def upgrade() -> None:
    table = op.create_table('resource_presets',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('description', sa.String(length=512), nullable=False),
    sa.Column('resource_slots', jupyterhub_backendai.models.base.SlotsType(), nullable=False),
    sa.Column('resource_group', sa.String(length=64), nullable=True),
    sa.Column('created_at', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['resource_group'], ['resource_groups.name'], name=op.f('fk_resource_presets_resource_group_resource_groups'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_resource_presets'))
    )
    with op.batch_alter_table('resource_presets', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_resource_presets_resource_group'), ['resource_group'], unique=False)
    from jupyterhub_backendai.common.slots import ResourceSlot

    now = dt.datetime.now(dt.UTC)
    op.bulk_insert(table, [
        {"name": name, "description": text, "resource_slots": ResourceSlot(slots),
         "resource_group": None, "created_at": now} for name, text, slots in PACKAGED])


def downgrade() -> None:
    with op.batch_alter_table('resource_presets', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_resource_presets_resource_group'))
    op.drop_table('resource_presets')
