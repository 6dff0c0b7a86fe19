"""A session's vfolder mounts: which folders a user may mount, and the check of a
request into what the record keeps (``Session.vfolder_mounts``) and the agents get."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session as DBSession

from ..common.errors import InvalidRequest
from ..common.types import VFolderOwnership, VFolderStatus
from ..models import Keypair, Project, User, VFolder, VFolderPermissionRow
from .vfolders import host_permissions, mount_permission

MOUNT_ROOT = "/home/work"


def mountable_folders(db: DBSession, user: User, project: Project | None) -> list[tuple[VFolder, str]]:
    """(folder, permission) for every folder ``user`` could mount in a session of
    ``project``: own, shared with them, and the project's folders."""
    rows: list[VFolder] = list(db.scalars(select(VFolder).where(
        VFolder.user_id == user.id, VFolder.ownership_type == VFolderOwnership.USER)))
    rows += db.scalars(select(VFolder).join(
        VFolderPermissionRow, VFolderPermissionRow.vfolder_id == VFolder.id).where(
        VFolderPermissionRow.user_id == user.id))
    if project is not None:
        rows += db.scalars(select(VFolder).where(
            VFolder.project_id == project.id, VFolder.ownership_type == VFolderOwnership.PROJECT))
    out = []
    for f in rows:
        perm = mount_permission(db, user, f)
        if perm is not None and f.status == VFolderStatus.READY:
            out.append((f, perm))
    return sorted(out, key=lambda fp: (fp[0].name, fp[0].id))


def resolve_mounts(db: DBSession, user: User, project: Project | None, requested,
                   keypair: Keypair | None = None) -> list[dict]:
    """Check a session's requested mounts (folder names or ids) and describe them
    for the record (``Session.vfolder_mounts``); raise InvalidRequest with the
    reason otherwise. Each is mounted at ``/home/work/<name>``."""
    if requested is None:
        return []
    if not isinstance(requested, list | tuple) or not all(isinstance(r, str) for r in requested):
        raise InvalidRequest("mounts must be a list of vfolder names or ids")
    if len(requested) > 64:
        raise InvalidRequest("at most 64 vfolders can be mounted in one session")
    available = mountable_folders(db, user, project)
    out: list[dict] = []
    seen_ids: set[str] = set()
    seen_names: set[str] = set()
    for ref in requested:
        matches = [(f, p) for f, p in available if f.id == ref] or [
            (f, p) for f, p in available if f.name == ref]
        if not matches:
            where = f" in project {project.name!r}" if project is not None else ""
            raise InvalidRequest(f"no vfolder {ref!r} that you can mount{where}")
        if len(matches) > 1:
            raise InvalidRequest(
                f"vfolder name {ref!r} is ambiguous (yours, shared or the project's): "
                f"use one of the ids {', '.join(f.id for f, _ in matches)}"
            )
        folder, perm = matches[0]
        if folder.id in seen_ids:
            raise InvalidRequest(f"vfolder {folder.name!r} is requested twice")
        if folder.name in seen_names:
            raise InvalidRequest(
                f"two vfolders named {folder.name!r} would mount at {MOUNT_ROOT}/{folder.name}")
        if "mount-in-session" not in host_permissions(
            db, user, folder.host, project if folder.ownership_type == VFolderOwnership.PROJECT
            else None, keypair,
        ):
            raise InvalidRequest(
                f"you may not mount vfolders of host {folder.host!r} in sessions "
                "(allowed_vfolder_hosts of your domain, project and keypair policy)"
            )
        seen_ids.add(folder.id)
        seen_names.add(folder.name)
        out.append({
            "id": folder.id,
            "name": folder.name,
            "host": folder.host,
            "quota_scope_id": folder.quota_scope_id,
            "permission": perm,
            "target": f"{MOUNT_ROOT}/{folder.name}",
        })
    return out
