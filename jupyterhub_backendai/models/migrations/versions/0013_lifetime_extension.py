"""sessions whose lifetime their owner extends, within the keypair policy (issue 29)

Revision ID: 0013
Revises: 0012

``keypair_resource_policies.max_lifetime_extension``: seconds a session's owner may add
to its ``max_session_lifetime`` in all (0, every existing row: no extension);
``sessions.lifetime_extension``: seconds added so far (0).
"""

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('keypair_resource_policies', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_lifetime_extension', sa.Integer(), nullable=False,
                                      server_default='0'))
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lifetime_extension', sa.Integer(), nullable=False,
                                      server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('lifetime_extension')
    with op.batch_alter_table('keypair_resource_policies', schema=None) as batch_op:
        batch_op.drop_column('max_lifetime_extension')
