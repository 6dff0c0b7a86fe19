"""an image of one user: a session committed to an image (issue 27)

Revision ID: 0019
Revises: 0018

``images.owner_id``: the user whose session was committed to this image (``session
commit``); such an image is listed and started for that user only (and shown to
superadmins). NULL: an image of the installation, for everyone the catalogue shows it to.
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0019'
down_revision = '0018'

upgrade, downgrade = migration(AddColumns("images", "owner_id  str32?"))
