"""warm pools (issue 30)

Revision ID: 0014
Revises: 0013

``warm_pools``: per resource group, image and resource preset, how many kernels are kept
started and unassigned, and why the pool is not full.
"""

from jupyterhub_backendai.models.migrations.blocks import CreateTable, migration

revision = '0014'
down_revision = '0013'

upgrade, downgrade = migration(
    CreateTable(
        "warm_pools",
        "resource_group  str64",
        "image           str256",
        "preset          str64",
        "size            int",
        "status_info     text",
        "updated_at      time",
        pk="resource_group image preset",
        fk=[
            "resource_group resource_groups.name on delete cascade",
            "preset resource_presets.name on delete cascade",
        ],
    ),
)
