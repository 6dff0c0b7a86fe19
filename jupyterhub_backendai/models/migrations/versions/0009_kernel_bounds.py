"""kernel bounds in keypair resource policies (issue 24)

Revision ID: 0009
Revises: 0008

``max_pids_per_kernel``: processes and threads one kernel may run; ``max_tmp_size``:
bytes of each of its /tmp and /var/tmp (tmpfs). Null (every existing policy): the
agent's own defaults (``Agent.kernel_pids_limit``, ``Agent.kernel_tmp_size``).
"""

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('keypair_resource_policies', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_pids_per_kernel', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('max_tmp_size', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('keypair_resource_policies', schema=None) as batch_op:
        batch_op.drop_column('max_tmp_size')
        batch_op.drop_column('max_pids_per_kernel')
