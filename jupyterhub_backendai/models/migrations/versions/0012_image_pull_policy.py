"""a pull policy per image (issue 25)

Revision ID: 0012
Revises: 0011

``images.pull_policy``: "digest", "tag" or "none" for this image; null (every existing
row): its registry's policy.
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0012'
down_revision = '0011'

upgrade, downgrade = migration(AddColumns("images", "pull_policy  str16?"))
