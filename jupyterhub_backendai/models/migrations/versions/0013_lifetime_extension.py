"""sessions whose lifetime their owner extends, within the keypair policy (issue 29)

Revision ID: 0013
Revises: 0012

``keypair_resource_policies.max_lifetime_extension``: seconds a session's owner may add
to its ``max_session_lifetime`` in all (0, every existing row: no extension);
``sessions.lifetime_extension``: seconds added so far (0).
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0013'
down_revision = '0012'

upgrade, downgrade = migration(
    AddColumns("keypair_resource_policies", "max_lifetime_extension  int  default=0"),
    AddColumns("sessions", "lifetime_extension  int  default=0"),
)
