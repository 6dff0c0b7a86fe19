"""session templates and dotfiles (issue 27)

Revision ID: 0015
Revises: 0014

``session_templates``: Backend.AI's task templates (a session's options under a name);
``dotfiles``: files written into new sessions' home folders, of a user, a project or a
domain (``owner`` is ``user:<id>``, ``group:<id>`` or ``domain:<name>``).
"""

import sqlalchemy as sa
from alembic import op

import jupyterhub_backendai.models.base

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'session_templates',
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('name', sa.String(length=128), nullable=False),
        sa.Column('type', sa.String(length=16), nullable=False),
        sa.Column('user_id', sa.String(length=32), nullable=False),
        sa.Column('domain_name', sa.String(length=64), nullable=False),
        sa.Column('project_id', sa.String(length=32), nullable=True),
        sa.Column('is_active', sa.Boolean(), nullable=False),
        sa.Column('template', sa.JSON(), nullable=False),
        sa.Column('created_at', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_session_templates_user_id_users'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['domain_name'], ['domains.name'], name=op.f('fk_session_templates_domain_name_domains'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_session_templates_project_id_projects'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_session_templates')),
    )
    op.create_table(
        'dotfiles',
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('owner', sa.String(length=80), nullable=False),
        sa.Column('user_id', sa.String(length=32), nullable=True),
        sa.Column('project_id', sa.String(length=32), nullable=True),
        sa.Column('domain_name', sa.String(length=64), nullable=True),
        sa.Column('path', sa.String(length=256), nullable=False),
        sa.Column('permission', sa.String(length=4), nullable=False),
        sa.Column('data', sa.Text(), nullable=False),
        sa.Column('created_at', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_dotfiles_user_id_users'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_dotfiles_project_id_projects'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['domain_name'], ['domains.name'], name=op.f('fk_dotfiles_domain_name_domains'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_dotfiles')),
        sa.UniqueConstraint('owner', 'path', name=op.f('uq_dotfiles_owner')),
    )


def downgrade() -> None:
    op.drop_table('dotfiles')
    op.drop_table('session_templates')
