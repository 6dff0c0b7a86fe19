"""resource presets (issue 29): named resource slots the spawn form offers as cards,
with three packaged ones (small, medium, large) made once, here

Revision ID: 0011
Revises: 0010
"""

import datetime as dt

from alembic import op

from jupyterhub_backendai.models.migrations.blocks import CreateTable, migration

revision = '0011'
down_revision = '0010'

# The packaged presets: within the default keypair resource policy (no limit) and a
# small agent; an admin changes or deletes them in the console (they are made once,
# by this migration, never again).
PACKAGED = [
    ("small", "For notebooks and light work", {"cpu": "1", "mem": str(2 << 30)}),
    ("medium", "For data work and small models", {"cpu": "2", "mem": str(4 << 30)}),
    ("large", "For heavier jobs", {"cpu": "4", "mem": str(8 << 30)}),
]

PRESETS = CreateTable(
    "resource_presets",
    "name            str64",
    "description     str512",
    "resource_slots  slots",
    "resource_group  str64?",
    "created_at      time",
    fk=["resource_group resource_groups.name on delete cascade"],
    index="resource_group",
)


def _make_the_packaged_presets() -> None:
    from jupyterhub_backendai.common.slots import ResourceSlot

    now = dt.datetime.now(dt.UTC)
    op.bulk_insert(PRESETS.table, [
        {"name": name, "description": text, "resource_slots": ResourceSlot(slots),
         "resource_group": None, "created_at": now} for name, text, slots in PACKAGED])


upgrade, downgrade = migration(PRESETS, _make_the_packaged_presets)
