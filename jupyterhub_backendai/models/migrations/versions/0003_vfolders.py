"""vfolders and their shares, session mounts

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 06:40:00
"""

import sqlalchemy as sa
from alembic import op

from jupyterhub_backendai.common.types import HOST_PERMISSIONS
from jupyterhub_backendai.models.migrations.blocks import AddColumns, CreateTable, migration

revision = '0003'
down_revision = '0002'


def _open_the_embedded_volume() -> None:
    # The embedded default's volume, open to the default domain as a fresh install has it
    # (tenancy.ensure_defaults), unless an operator already chose its hosts.
    domains = sa.table('domains', sa.column('name', sa.String), sa.column('allowed_vfolder_hosts', sa.JSON))
    conn = op.get_bind()
    row = conn.execute(sa.select(domains.c.allowed_vfolder_hosts).where(domains.c.name == 'default')).first()
    if row is not None and not row[0]:
        conn.execute(domains.update().where(domains.c.name == 'default').values(
            allowed_vfolder_hosts={'local:volume1': list(HOST_PERMISSIONS)}))


upgrade, downgrade = migration(
    CreateTable(
        "vfolders",
        "id              str32",
        "name            str64",
        "host            str128",
        "quota_scope_id  str64",
        "ownership_type  str16",
        "user_id         str32?",
        "project_id      str32?",
        "domain_name     str64",
        "creator         str128",
        "usage_mode      str16",
        "permission      str4",
        "status          str16",
        "created_at      time",
        fk=[
            "domain_name domains.name",
            "project_id projects.id on delete cascade",
            "user_id users.id on delete cascade",
        ],
        unique=["quota_scope_id name"],
        index="project_id quota_scope_id user_id",
    ),
    CreateTable(
        "vfolder_permissions",
        "vfolder_id  str32",
        "user_id     str32",
        "permission  str4",
        "created_at  time",
        pk="vfolder_id user_id",
        fk=["user_id users.id on delete cascade", "vfolder_id vfolders.id on delete cascade"],
    ),
    AddColumns("sessions", "vfolder_mounts  json  default=[]"),
    _open_the_embedded_volume,
)
