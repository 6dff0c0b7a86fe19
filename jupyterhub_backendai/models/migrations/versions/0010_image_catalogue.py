"""container registries and the image catalogue (issue 25)

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

import jupyterhub_backendai.models.base

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('container_registries',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('url', sa.String(length=512), nullable=False),
    sa.Column('project', sa.String(length=128), nullable=False),
    sa.Column('username', sa.String(length=128), nullable=False),
    sa.Column('password', sa.String(length=512), nullable=False),
    sa.Column('ca_cert', sa.Text(), nullable=False),
    sa.Column('pull_policy', sa.String(length=16), nullable=False),
    sa.Column('last_scan', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('created_at', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_container_registries'))
    )
    op.create_table('images',
    sa.Column('name', sa.String(length=512), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('repo', sa.String(length=256), nullable=False),
    sa.Column('tag', sa.String(length=128), nullable=False),
    sa.Column('digest', sa.String(length=128), nullable=False),
    sa.Column('architecture', sa.String(length=32), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('labels', sa.JSON(), nullable=False),
    sa.Column('description', sa.String(length=512), nullable=False),
    sa.Column('hidden', sa.Boolean(), nullable=False),
    sa.Column('is_default', sa.Boolean(), nullable=False),
    sa.Column('scanned_at', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_images'))
    )
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_images_source'), ['source'], unique=False)
    op.create_table('image_aliases',
    sa.Column('alias', sa.String(length=256), nullable=False),
    sa.Column('image', sa.String(length=512), nullable=False),
    sa.ForeignKeyConstraint(['image'], ['images.name'], name=op.f('fk_image_aliases_image_images'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('alias', name=op.f('pk_image_aliases'))
    )
    with op.batch_alter_table('image_aliases', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_image_aliases_image'), ['image'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('image_aliases', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_image_aliases_image'))
    op.drop_table('image_aliases')
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_images_source'))
    op.drop_table('images')
    op.drop_table('container_registries')
