"""kernel bounds in keypair resource policies (issue 24)

Revision ID: 0009
Revises: 0008

``max_pids_per_kernel``: processes and threads one kernel may run; ``max_tmp_size``:
bytes of each of its /tmp and /var/tmp (tmpfs). Null (every existing policy): the
agent's own defaults (``Agent.kernel_pids_limit``, ``Agent.kernel_tmp_size``).
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0009'
down_revision = '0008'

upgrade, downgrade = migration(
    AddColumns(
        "keypair_resource_policies",
        "max_pids_per_kernel  int?",
        "max_tmp_size         bigint?",
    ),
)
