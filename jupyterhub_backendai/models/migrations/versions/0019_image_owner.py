"""an image of one user: a session committed to an image (issue 27)

Revision ID: 0019
Revises: 0018

``images.owner_id``: the user whose session was committed to this image (``session
commit``); such an image is listed and started for that user only (and shown to
superadmins). NULL: an image of the installation, for everyone the catalogue shows it to.
"""

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner_id', sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.drop_column('owner_id')
