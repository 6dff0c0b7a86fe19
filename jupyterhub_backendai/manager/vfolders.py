"""Virtual folders in the record: who may use which folder, on which host, and what
each may do. (The storage side is :mod:`..storageproxy`.)

How a session's mounts are resolved is :mod:`.mounts`. Rules, as in Backend.AI:

- A *user folder* belongs to its owner, who has its ``permission`` (``rw`` by
  default) and may share it with users of the same domain (``ro``, ``rw``, ``wd``).
- A *project folder* belongs to a project; every active member has the folder's
  ``permission``. Domain admins and superadmins manage them.
- Which hosts a user may use, and for what (``HOST_PERMISSIONS``), is the union of
  ``allowed_vfolder_hosts`` of their domain, their projects (for a project folder:
  that project) and their keypair's resource policy.
"""

from __future__ import annotations

import re

from sqlalchemy.orm import Session as DBSession

from ..common.errors import InvalidRequest
from ..common.types import VFolderOwnership, VFolderPermission
from ..models import (
    Domain,
    Keypair,
    KeypairResourcePolicy,
    Project,
    User,
    VFolder,
    VFolderPermissionRow,
)

# A folder's name is its directory under /home/work: one path component, no dot first.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Names a mount may not take: the kernel's own files under /home/work.
RESERVED_NAMES = frozenset({"lost+found"})
# Order of strength, weakest first.
PERMISSION_ORDER = (VFolderPermission.READ_ONLY, VFolderPermission.READ_WRITE,
                    VFolderPermission.RW_DELETE)


def check_name(name) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in RESERVED_NAMES:
        raise InvalidRequest(
            f"invalid vfolder name {name!r}: 1-64 letters, digits, '.', '_', '-', "
            "not starting with '.', '_' or '-'"
        )
    return name


def quota_scope_of_user(user_id: str) -> str:
    return f"user:{user_id}"


def quota_scope_of_project(project_id: str) -> str:
    return f"project:{project_id}"


def host_permissions(db: DBSession, user: User, host: str, project: Project | None = None,
                     keypair: Keypair | None = None) -> set[str]:
    """What ``user`` may do on ``host``: the union over their domain, ``project`` (or,
    when None, all their projects) and their keypair's policy (default keypair when
    ``keypair`` is None)."""
    grants: list[dict] = []
    domain = db.get(Domain, user.domain_name)
    if domain is not None:
        grants.append(domain.allowed_vfolder_hosts or {})
    projects = [project] if project is not None else list(user.projects)
    grants.extend(p.allowed_vfolder_hosts or {} for p in projects if p.is_active)
    if keypair is None:
        keypair = next((k for k in user.keypairs if k.is_default and k.is_active), None)
    if keypair is not None:
        pol = db.get(KeypairResourcePolicy, keypair.resource_policy)
        if pol is not None:
            grants.append(pol.allowed_vfolder_hosts or {})
    out: set[str] = set()
    for g in grants:
        out.update(g.get(host, ()))
    return out


def mount_permission(db: DBSession, user: User, folder: VFolder) -> str | None:
    """The permission ``user`` has on ``folder``'s files in a session, None if none.

    Admin roles manage folders through the API but mount only what they own, were
    given, or belong to as a project member.
    """
    if folder.ownership_type == VFolderOwnership.USER:
        if folder.user_id == user.id:
            return folder.permission
        share = db.get(VFolderPermissionRow, (folder.id, user.id))
        return share.permission if share is not None else None
    proj = db.get(Project, folder.project_id)
    if proj is not None and proj.is_active and any(p.id == proj.id for p in user.projects):
        return folder.permission
    return None
