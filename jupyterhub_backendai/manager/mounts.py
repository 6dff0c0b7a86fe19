"""A session's vfolder mounts: which folders a user may mount, and the check of a
request into what the record keeps (``Session.vfolder_mounts``) and the agents get.

Three kinds, in the order the record keeps them:

- the user's *home folder* (``c.BackendAISpawner.home_folder``, default ``.home``):
  a user folder on the default vfolder host, made at the first server start
  (:func:`ensure_home`), mounted at ``/home/work`` itself so that notebooks and
  ``pip install --user`` survive a stop;
- the folders the request names, at ``/home/work/<name>``;
- *automount folders*, Backend.AI's convention: every folder of the user whose name
  begins with ``.`` (``.local``, ``.config``, ...) at ``/home/work/<name>``, in every
  session, without being asked for.
"""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import select
from sqlalchemy.orm import Session as DBSession

from ..common.errors import BackendAIError, Conflict, InvalidRequest, NotFound
from ..common.types import VFolderOwnership, VFolderStatus
from ..models import Keypair, Project, User, VFolder, VFolderPermissionRow
from . import access
from .vfolders import (
    TRASHED,
    check_name,
    create,
    host_permissions,
    is_automount,
    mount_permission,
    quota_scope_of_user,
)

MOUNT_ROOT = "/home/work"
DEFAULT_HOME_FOLDER = ".home"
# How long a start waits for a home folder that another start of the same user is making.
HOME_WAIT = 30.0


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
    if not requested:
        return []  # (the folders that could be mounted are not read: a start's most common case)
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


def _own_folder(db: DBSession, user: User, name: str) -> VFolder | None:
    return db.scalar(select(VFolder).where(VFolder.quota_scope_id == quota_scope_of_user(user.id),
                                           VFolder.name == name))


def _mountable_on_host(db: DBSession, user: User, folder: VFolder, keypair: Keypair | None) -> bool:
    return "mount-in-session" in host_permissions(db, user, folder.host, None, keypair)


def _entry(folder: VFolder, perm: str, target: str) -> dict:
    return {"id": folder.id, "name": folder.name, "host": folder.host,
            "quota_scope_id": folder.quota_scope_id, "permission": perm, "target": target}


def session_mounts(db: DBSession, user: User, project: Project | None, requested,
                   keypair: Keypair | None = None, home_folder: str | None = None) -> list[dict]:
    """Everything a new session mounts (see the module's doc): the home folder
    (when ``home_folder`` names it) at ``/home/work``, the requested folders
    (:func:`resolve_mounts`), then the user's automount folders. A requested folder
    that is also the home or an automount folder is mounted once, where those go.
    Automount folders the user may not mount now (not ready, host not allowed) are
    left out rather than failing every start."""
    out: list[dict] = []
    home = None
    if home_folder:
        home = _own_folder(db, user, home_folder)
        if home is None or home.status != VFolderStatus.READY:
            state = "missing" if home is None else home.status
            raise InvalidRequest(f"your home folder {home_folder!r} is {state}")
        if not _mountable_on_host(db, user, home, keypair):
            raise InvalidRequest(
                f"your home folder {home_folder!r} is on host {home.host!r}, where you may not "
                "mount vfolders (allowed_vfolder_hosts of your domain, projects and keypair "
                "policy need 'mount-in-session')")
        out.append(_entry(home, mount_permission(db, user, home), MOUNT_ROOT))
    auto = [f for f in db.scalars(select(VFolder).where(
        VFolder.user_id == user.id, VFolder.ownership_type == VFolderOwnership.USER,
        VFolder.status == VFolderStatus.READY).order_by(VFolder.name, VFolder.id))
        if is_automount(f.name) and (home is None or f.id != home.id)
        and _mountable_on_host(db, user, f, keypair)]
    skip = {f.id for f in auto} | ({home.id} if home is not None else set())
    available = {f.id: f for f, _ in mountable_folders(db, user, project)} if requested else {}
    explicit = []
    for ref in requested or []:
        f = available.get(ref) if isinstance(ref, str) else None
        if f is None and isinstance(ref, str):
            named = [x for x in available.values() if x.name == ref]
            f = named[0] if len(named) == 1 else None
        if f is not None and f.id in skip:
            continue  # mounted anyway, as the home or an automount folder
        explicit.append(ref)
    if requested is not None and not isinstance(requested, list | tuple):
        explicit = requested  # let resolve_mounts say what is wrong with it
    out += resolve_mounts(db, user, project, explicit, keypair)
    targets = {m["target"] for m in out}
    for f in auto:
        target = f"{MOUNT_ROOT}/{f.name}"
        if target not in targets:
            out.append(_entry(f, mount_permission(db, user, f), target))
            targets.add(target)
    return out


def _home_state(db: DBSession, username: str, name: str) -> tuple[access.Principal | None, str | None]:
    """(the user as a principal, the folder's status): the principal, which only making
    the folder needs, only when there is none."""
    user = db.scalar(select(User).where(User.username == username))
    if user is None:
        raise NotFound(f"no Backend.AI user {username!r}")
    f = _own_folder(db, user, name)
    if f is not None:
        return None, f.status
    return access.load_principal(db, user_id=user.id), None


async def ensure_home(manager, username: str, name: str) -> None:
    """Make ``username``'s home folder ``name`` unless it exists: a user folder on the
    default vfolder host, counted like any other (the user's quota scope, the
    policy's ``max_vfolder_count``, the host's ``create-vfolder`` permission). A
    refusal says why in plain words; nothing is left behind. Two starts of the same
    user at once make it once (the other waits for it to be ready)."""
    try:
        check_name(name)
    except InvalidRequest as e:
        raise InvalidRequest(f"the home folder setting (c.BackendAISpawner.home_folder) is "
                             f"wrong: {e.detail}") from None
    deadline = time.monotonic() + HOME_WAIT
    while True:
        p, status = await manager.db_read(_home_state, username, name)
        if status == VFolderStatus.READY:
            return
        if status == VFolderStatus.DELETING:
            raise Conflict(f"your home folder {name!r} is being deleted; start again once it "
                           "is gone (a new, empty one is made then)")
        if status == TRASHED:
            raise Conflict(f"your home folder {name!r} is in the trash: restore it (`backend.ai "
                           f"vfolder restore {name}`) to start with your files, or purge it "
                           "to start with a new, empty one")
        if status is None:
            try:
                await create(manager, p, {"name": name}, home=True)
                return
            except Conflict:
                pass  # another start of this user made it just now: wait for it below
            except BackendAIError as e:
                why = f"cannot make your home folder {name!r}: {e.detail}"
                if e.status_code in (403, 412):  # host not allowed, count limit reached
                    why = (f"cannot make your home folder {name!r} (a vfolder mounted at "
                           f"{MOUNT_ROOT} that keeps your files between servers): {e.detail}. "
                           "Delete a vfolder you no longer need, or ask an administrator to "
                           "raise the limit or allow the host")
                raise type(e)(why, status_code=e.status_code) from None
        if time.monotonic() > deadline:
            raise Conflict(f"your home folder {name!r} is still {status or 'being made'} "
                           f"after {HOME_WAIT:.0f} s; try again")
        await asyncio.sleep(0.1)
