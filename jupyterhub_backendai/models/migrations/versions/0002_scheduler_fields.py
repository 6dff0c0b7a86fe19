"""scheduler and batch-session fields, session dependencies

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 03:40:00
"""

from alembic import op
import sqlalchemy as sa
import jupyterhub_backendai.models.base


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('startup_command', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('batch_timeout', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('starts_at', jupyterhub_backendai.models.base.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('architecture', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('designated_agents', sa.JSON(), nullable=False, server_default='[]'))
        batch_op.add_column(sa.Column('result', sa.String(length=16), nullable=False, server_default='UNDEFINED'))
    with op.batch_alter_table('kernels', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cluster_hostname', sa.String(length=64), nullable=False, server_default='main1'))
        batch_op.add_column(sa.Column('logs', sa.Text(), nullable=True))
    with op.batch_alter_table('keypair_resource_policies', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_priority', sa.Integer(), nullable=False, server_default='100'))
    with op.batch_alter_table('resource_groups', schema=None) as batch_op:
        batch_op.add_column(sa.Column('scheduler_state', sa.JSON(), nullable=False, server_default='{}'))
    op.create_table('session_dependencies',
    sa.Column('session_id', sa.String(length=32), nullable=False),
    sa.Column('depends_on', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['depends_on'], ['sessions.id'], name=op.f('fk_session_dependencies_depends_on_sessions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_session_dependencies_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('session_id', 'depends_on', name=op.f('pk_session_dependencies'))
    )


def downgrade() -> None:
    op.drop_table('session_dependencies')
    with op.batch_alter_table('resource_groups', schema=None) as batch_op:
        batch_op.drop_column('scheduler_state')
    with op.batch_alter_table('keypair_resource_policies', schema=None) as batch_op:
        batch_op.drop_column('max_priority')
    with op.batch_alter_table('kernels', schema=None) as batch_op:
        batch_op.drop_column('logs')
        batch_op.drop_column('cluster_hostname')
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('result')
        batch_op.drop_column('designated_agents')
        batch_op.drop_column('architecture')
        batch_op.drop_column('starts_at')
        batch_op.drop_column('batch_timeout')
        batch_op.drop_column('startup_command')
