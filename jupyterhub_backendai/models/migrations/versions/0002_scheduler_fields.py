"""scheduler and batch-session fields, session dependencies

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 03:40:00
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, CreateTable, migration

revision = '0002'
down_revision = '0001'

upgrade, downgrade = migration(
    AddColumns(
        "sessions",
        "startup_command    text?",
        "batch_timeout      int?",
        "starts_at          time?",
        "architecture       str32?",
        "designated_agents  json    default=[]",
        "result             str16   default=UNDEFINED",
    ),
    AddColumns(
        "kernels",
        "cluster_hostname  str64  default=main1",
        "logs              text?",
    ),
    AddColumns("keypair_resource_policies", "max_priority  int  default=100"),
    AddColumns("resource_groups", "scheduler_state  json  default={}"),
    CreateTable(
        "session_dependencies",
        "session_id  str32",
        "depends_on  str32",
        pk="session_id depends_on",
        fk=[
            "depends_on sessions.id on delete cascade",
            "session_id sessions.id on delete cascade",
        ],
    ),
)
