"""a folder's own size limit (issue 26)

Revision ID: 0017
Revises: 0016

``vfolders.max_size_bytes``: the folder's own limit in bytes (NULL: only its quota
scope's limit applies), at most the scope's; Backend.AI's ``max_size`` (there in MiB).
The storage enforces it: a btrfs volume as the limit of the folder's qgroup
``0/<subvolume id>``, a vfs volume in uploads through the proxy.
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, migration

revision = '0017'
down_revision = '0016'

upgrade, downgrade = migration(AddColumns("vfolders", "max_size_bytes  bigint?"))
