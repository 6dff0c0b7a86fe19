"""users' container ids (Backend.AI 26.09)

Revision ID: 0008
Revises: 0007

``container_uid``, ``container_main_gid``, ``container_gids``: the ids Backend.AI 26.09
gives the processes of a user's kernels (``admin user add --cuid/--cgid/--cgids``); null
(every existing user): the image's kernel user.
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0008'
down_revision = '0007'

upgrade, downgrade = migration(
    AddColumns(
        "users",
        "container_uid       int?",
        "container_main_gid  int?",
        "container_gids      json?",
    ),
)
