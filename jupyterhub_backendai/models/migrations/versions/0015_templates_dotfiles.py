"""session templates and dotfiles (issue 27)

Revision ID: 0015
Revises: 0014

``session_templates``: Backend.AI's task templates (a session's options under a name);
``dotfiles``: files written into new sessions' home folders, of a user, a project or a
domain (``owner`` is ``user:<id>``, ``group:<id>`` or ``domain:<name>``).
"""

from jupyterhub_backendai.models.migrations.blocks import CreateTable, migration

revision = '0015'
down_revision = '0014'

upgrade, downgrade = migration(
    CreateTable(
        "session_templates",
        "id           str32",
        "name         str128",
        "type         str16",
        "user_id      str32",
        "domain_name  str64",
        "project_id   str32?",
        "is_active    bool",
        "template     json",
        "created_at   time",
        fk=[
            "user_id users.id on delete cascade",
            "domain_name domains.name on delete cascade",
            "project_id projects.id on delete cascade",
        ],
    ),
    CreateTable(
        "dotfiles",
        "id           str32",
        "owner        str80",
        "user_id      str32?",
        "project_id   str32?",
        "domain_name  str64?",
        "path         str256",
        "permission   str4",
        "data         text",
        "created_at   time",
        fk=[
            "user_id users.id on delete cascade",
            "project_id projects.id on delete cascade",
            "domain_name domains.name on delete cascade",
        ],
        unique=["owner path"],
    ),
)
