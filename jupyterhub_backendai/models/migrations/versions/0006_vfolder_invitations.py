"""vfolder invitations

Revision ID: 0006
Revises: 0005
"""

from alembic import op
import sqlalchemy as sa
import jupyterhub_backendai.models.base


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('vfolder_invitations',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('vfolder_id', sa.String(length=32), nullable=False),
    sa.Column('inviter_id', sa.String(length=32), nullable=False),
    sa.Column('invitee_id', sa.String(length=32), nullable=False),
    sa.Column('permission', sa.String(length=4), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('created_at', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=False),
    sa.Column('modified_at', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['invitee_id'], ['users.id'], name=op.f('fk_vfolder_invitations_invitee_id_users'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['inviter_id'], ['users.id'], name=op.f('fk_vfolder_invitations_inviter_id_users'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['vfolder_id'], ['vfolders.id'], name=op.f('fk_vfolder_invitations_vfolder_id_vfolders'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_vfolder_invitations'))
    )
    with op.batch_alter_table('vfolder_invitations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_vfolder_invitations_invitee_id'), ['invitee_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_vfolder_invitations_vfolder_id'), ['vfolder_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('vfolder_invitations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_vfolder_invitations_vfolder_id'))
        batch_op.drop_index(batch_op.f('ix_vfolder_invitations_invitee_id'))
    op.drop_table('vfolder_invitations')
