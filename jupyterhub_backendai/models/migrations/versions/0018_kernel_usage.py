"""sampled use of kernels per hour (issue 29 point 7)

Revision ID: 0018
Revises: 0017

``kernel_usage``: per kernel and UTC hour, what its agent's live statistics said it
used (core-seconds, memory byte-seconds, GPU-seconds, the memory peak) over the seconds
sampled; ``kernels.usage_sampled_at``: the agent's time of the last sample counted (so
that several hubs reading the same statistics count each sample once).
"""

from jupyterhub_backendai.models.migrations.blocks import AddColumns, CreateTable, migration

revision = '0018'
down_revision = '0017'

upgrade, downgrade = migration(
    CreateTable(
        "kernel_usage",
        "kernel_id         str32",
        "hour              time",
        "session_id        str32",
        "sampled_seconds   float",
        "cpu_seconds       float",
        "mem_byte_seconds  float",
        "gpu_seconds       float",
        "mem_peak_bytes    bigint",
        pk="kernel_id hour",
        fk=["kernel_id kernels.id on delete cascade"],
        index="session_id",
    ),
    AddColumns("kernels", "usage_sampled_at  float?"),
)
