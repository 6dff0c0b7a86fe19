"""session lifecycle claim: owner, lease, end status, spawner wait

Revision ID: 0005
Revises: 0004
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0005'
down_revision = '0004'

upgrade, downgrade = migration(
    AddColumns(
        "sessions",
        "owner          str128?",
        "lease_until    time?",
        "end_status     str16?",
        "awaited_until  time?",
    ),
)
