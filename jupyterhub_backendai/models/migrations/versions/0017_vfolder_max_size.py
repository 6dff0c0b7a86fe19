"""a folder's own size limit (issue 26)

Revision ID: 0017
Revises: 0016

``vfolders.max_size_bytes``: the folder's own limit in bytes (NULL: only its quota
scope's limit applies), at most the scope's; Backend.AI's ``max_size`` (there in MiB).
The storage enforces it: a btrfs volume as the limit of the folder's qgroup
``0/<subvolume id>``, a vfs volume in uploads through the proxy.
"""

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('vfolders', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_size_bytes', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('vfolders', schema=None) as batch_op:
        batch_op.drop_column('max_size_bytes')
