"""sampled use of kernels per hour (issue 29 point 7)

Revision ID: 0018
Revises: 0017

``kernel_usage``: per kernel and UTC hour, what its agent's live statistics said it
used (core-seconds, memory byte-seconds, GPU-seconds, the memory peak) over the seconds
sampled; ``kernels.usage_sampled_at``: the agent's time of the last sample counted (so
that several hubs reading the same statistics count each sample once).
"""

import sqlalchemy as sa
from alembic import op

from jupyterhub_backendai.models.base import UTCDateTime

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'kernel_usage',
        sa.Column('kernel_id', sa.String(length=32), nullable=False),
        sa.Column('hour', UTCDateTime(timezone=True), nullable=False),
        sa.Column('session_id', sa.String(length=32), nullable=False),
        sa.Column('sampled_seconds', sa.Float(), nullable=False),
        sa.Column('cpu_seconds', sa.Float(), nullable=False),
        sa.Column('mem_byte_seconds', sa.Float(), nullable=False),
        sa.Column('gpu_seconds', sa.Float(), nullable=False),
        sa.Column('mem_peak_bytes', sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(['kernel_id'], ['kernels.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('kernel_id', 'hour'),
    )
    op.create_index('ix_kernel_usage_session_id', 'kernel_usage', ['session_id'])
    with op.batch_alter_table('kernels', schema=None) as batch_op:
        batch_op.add_column(sa.Column('usage_sampled_at', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('kernels', schema=None) as batch_op:
        batch_op.drop_column('usage_sampled_at')
    op.drop_index('ix_kernel_usage_session_id', table_name='kernel_usage')
    op.drop_table('kernel_usage')
