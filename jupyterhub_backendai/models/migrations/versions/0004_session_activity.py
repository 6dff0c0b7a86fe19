"""session last activity

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 07:46:41.152681
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0004'
down_revision = '0003'

upgrade, downgrade = migration(AddColumns("sessions", "last_activity  time?"))
