"""an agent's slots that another agent of its host holds (GPUs of another installation)

Revision ID: 0020
Revises: 0019

``agents.away_slots``: ``{slot: amount}`` of the agent's devices that another agent of
the same host has claimed (agent/hostclaims.py), as its last heartbeat said; the
scheduler counts them as taken, so a request for them waits instead of failing at the
agent. NULL: it did not say.
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0020'
down_revision = '0019'

upgrade, downgrade = migration(AddColumns("agents", "away_slots  json?"))
