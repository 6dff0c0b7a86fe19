"""a pull policy per image (issue 25)

Revision ID: 0012
Revises: 0011

``images.pull_policy``: "digest", "tag" or "none" for this image; null (every existing
row): its registry's policy.
"""

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pull_policy', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.drop_column('pull_policy')
