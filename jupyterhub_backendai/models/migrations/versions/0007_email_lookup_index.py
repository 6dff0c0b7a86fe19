"""emails looked up without case; the redundant sessions.access_key index dropped

Revision ID: 0007
Revises: 0006

- ``ix_users_email_lower``: login, sharing and uniqueness compare ``lower(email)``
  (``tenancy.email_is``), which a plain index on ``email`` cannot serve.
- ``ix_sessions_access_key`` duplicated the leading column of the unique
  ``(access_key, name, alive_marker)``: every session row version wrote one index entry
  more than it needs.
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'


def upgrade() -> None:
    op.create_index('ix_users_email_lower', 'users', [sa.text('lower(email)')], unique=False)
    op.drop_index('ix_sessions_access_key', table_name='sessions')


def downgrade() -> None:
    op.create_index('ix_sessions_access_key', 'sessions', ['access_key'], unique=False)
    op.drop_index('ix_users_email_lower', table_name='users')
