"""what an agent holds: its images and its ready pooled kernels (issues 25 and 30)

Revision ID: 0016
Revises: 0015

``agents.images``: the labelled images on the agent's engine, as its last heartbeat
said (NULL: it did not say); ``agents.pool_ready``: its ready pooled kernels per warm
pool (``{"<group>|<image>|<preset>": n}``). The scheduler prefers an agent with a ready
pooled kernel of the session's pool, then one holding the session's image.
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0016'
down_revision = '0015'

upgrade, downgrade = migration(
    AddColumns(
        "agents",
        "images      json?",
        "pool_ready  json?",
    ),
)
