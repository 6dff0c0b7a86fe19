"""container registries and the image catalogue (issue 25)

Revision ID: 0010
Revises: 0009
"""

from jupyterhub_backendai.models.migrations.blocks import CreateTable, migration

revision = '0010'
down_revision = '0009'

upgrade, downgrade = migration(
    CreateTable(
        "container_registries",
        "name         str64",
        "url          str512",
        "project      str128",
        "username     str128",
        "password     str512",
        "ca_cert      text",
        "pull_policy  str16",
        "last_scan    time?",
        "created_at   time",
    ),
    CreateTable(
        "images",
        "name          str512",
        "source        str64",
        "repo          str256",
        "tag           str128",
        "digest        str128",
        "architecture  str32",
        "size_bytes    bigint",
        "labels        json",
        "description   str512",
        "hidden        bool",
        "is_default    bool",
        "scanned_at    time",
        index="source",
    ),
    CreateTable(
        "image_aliases",
        "alias  str256",
        "image  str512",
        fk=["image images.name on delete cascade"],
        index="image",
    ),
)
