"""vfolder invitations

Revision ID: 0006
Revises: 0005
"""

from jupyterhub_backendai.models.migrations.blocks import CreateTable, migration

revision = '0006'
down_revision = '0005'

upgrade, downgrade = migration(
    CreateTable(
        "vfolder_invitations",
        "id           str32",
        "vfolder_id   str32",
        "inviter_id   str32",
        "invitee_id   str32",
        "permission   str4",
        "state        str16",
        "created_at   time",
        "modified_at  time?",
        fk=[
            "invitee_id users.id on delete cascade",
            "inviter_id users.id on delete cascade",
            "vfolder_id vfolders.id on delete cascade",
        ],
        index="invitee_id vfolder_id",
    ),
)
