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

The admin API's folder operations are here too, in two layers. The functions
taking ``(db, principal, ...)`` run inside one transaction each, like those of
:mod:`.admin`. The ``async`` ones taking the manager first join them with the
storage calls, which never run inside a transaction: a folder is written as
``provisioning``, created on the storage, then marked ``ready`` (or its row is
removed again when the storage fails); a deletion marks it ``deleting``, removes
the directory, then the row. Nothing half-made stays behind.
"""

from __future__ import annotations

import asyncio
import posixpath
import re

from sqlalchemy import and_, false, func, or_, select, true, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DBSession

from ..common.errors import (
    BackendAIError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
)
from ..common.types import UserRole, VFolderOwnership, VFolderPermission, VFolderStatus
from ..models import (
    Domain,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectResourcePolicy,
    Session,
    User,
    UserResourcePolicy,
    VFolder,
    VFolderPermissionRow,
)
from . import access, responses
from .access import Principal
from .ops import reads, writes

# A folder's name is its directory under /home/work: one path component of 1-64
# characters. One '.' may come first: Backend.AI's automount folders (``.local``,
# ``.config``, the home folder ``.home``) are mounted into every session of their owner.
NAME_RE = re.compile(r"^(?=.{1,64}$)\.?[A-Za-z0-9][A-Za-z0-9._-]*$")
# Names a mount may not take: the kernel's own files under /home/work.
RESERVED_NAMES = frozenset({"lost+found"})
# Order of strength, weakest first.
PERMISSION_ORDER = (VFolderPermission.READ_ONLY, VFolderPermission.READ_WRITE,
                    VFolderPermission.RW_DELETE)


def check_name(name) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in RESERVED_NAMES:
        raise InvalidRequest(
            f"invalid vfolder name {name!r}: 1-64 letters, digits, '.', '_', '-', "
            "starting with a letter or digit, or with one '.' before it (a folder "
            "mounted into every session of its owner)"
        )
    return name


def is_automount(name: str) -> bool:
    """Backend.AI's convention: a user's folders named ``.<name>`` are mounted into
    every session of that user at ``/home/work/.<name>``."""
    return name.startswith(".")


def _no_dot_project_folder(name: str) -> None:
    if is_automount(name):
        raise InvalidRequest(
            f"name: {name!r} begins with '.': such folders are mounted into every session of "
            "the user who owns them, so a project folder cannot have such a name")


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
    perm = None
    if folder.ownership_type == VFolderOwnership.USER:
        if folder.user_id == user.id:
            perm = folder.permission
        else:
            share = db.get(VFolderPermissionRow, (folder.id, user.id))
            perm = share.permission if share is not None else None
    else:
        proj = db.get(Project, folder.project_id)
        if proj is not None and proj.is_active and any(p.id == proj.id for p in user.projects):
            # a member's own permission where the folder was shared with them (Backend.AI's
            # `vfolder share` of a group folder), else the folder's
            share = db.get(VFolderPermissionRow, (folder.id, user.id))
            perm = share.permission if share is not None else folder.permission
    if perm is None:
        return None
    if folder.ownership_type == VFolderOwnership.USER and folder.user_id == user.id \
            and is_automount(folder.name):
        # A user's own '.'-folders (the home folder among them) can be neither shared nor
        # a project's: private space, so even a monitor keeps them writable (Jupyter
        # itself needs a writable home to start).
        return perm
    # A monitor never writes into anything shared (access.mount_permission).
    return access.mount_permission(user.role, perm)


# -- the admin API: views and rules ------------------------------------------------

USAGE_MODES = ("general", "model", "data")
# A file path inside a folder: relative, at most this long, no component "..".
MAX_PATH = 1024


def vfolder_out(db: DBSession, f: VFolder, p: Principal | None = None) -> dict:
    """A folder as the API shows it; ``my_permission`` is what the caller may do with
    its files (None: nothing, e.g. an admin looking at someone else's folder)."""
    user = db.get(User, p.user_id) if p is not None else None
    mine = mount_permission(db, user, f) if user is not None else None
    return responses.VFolder.body(responses.With(f, my_permission=mine, used_bytes=None))


async def with_usage(manager, folders: list[dict], walk: bool = False) -> list[dict]:
    """Folders as the API lists them, each with ``used_bytes`` from its storage: one
    request per storage host for all of its folders (on btrfs one read of the quota
    tree); None where the storage does not answer (the listing still comes, and the log
    says why). Usage is read where it is cheap (btrfs: its qgroups); on a vfs volume it is
    a walk of the whole folder, so only with ``walk`` (one folder's own view), and a
    listing leaves it None there."""
    cheap = None if walk else {h for h, v in (await _volumes(manager)).items()
                               if v.get("backend") == "btrfs"}
    by_host: dict[str, list[dict]] = {}
    for f in folders:
        if f.get("status") == VFolderStatus.READY and (cheap is None or f["host"] in cheap):
            by_host.setdefault(f["host"], []).append(f)

    async def one_host(host: str, fs: list[dict]) -> None:
        try:
            got = await manager.storage.folders_usage(
                host, [(f["quota_scope_id"], f["id"]) for f in fs])
        except Exception as e:
            manager.log.warning("no usage of %d folders on %s: %s", len(fs), host, e)
            got = [None] * len(fs)
        for f, usage in zip(fs, got, strict=True):
            f["used_bytes"] = int(usage["used_bytes"]) if usage else None

    await asyncio.gather(*(one_host(h, fs) for h, fs in by_host.items()))
    return folders


def folder_filter(p: Principal):
    """What lists show: superadmins all; admins and monitors their domain's; users their
    own folders, those shared with them and their projects' folders."""
    if p.is_superadmin:
        return true()
    if p.reads_domain:  # (a superadmin's own folders are not their domain's: access.py)
        return and_(VFolder.domain_name == p.domain, or_(
            VFolder.ownership_type != VFolderOwnership.USER, VFolder.user_id.is_(None),
            VFolder.user_id.not_in(select(User.id).where(User.role == UserRole.SUPERADMIN))))
    own = and_(VFolder.ownership_type == VFolderOwnership.USER, VFolder.user_id == p.user_id)
    shared = VFolder.id.in_(select(VFolderPermissionRow.vfolder_id).where(
        VFolderPermissionRow.user_id == p.user_id))
    projects = (and_(VFolder.ownership_type == VFolderOwnership.PROJECT,
                     VFolder.project_id.in_(sorted(p.project_ids)))
                if p.project_ids else false())
    return or_(own, shared, projects)


def can_see_folder(db: DBSession, p: Principal, f: VFolder) -> bool:
    if p.is_superadmin:
        return True
    if p.reads_domain:
        if f.ownership_type == VFolderOwnership.USER and f.user_id != p.user_id:
            owner = db.get(User, f.user_id) if f.user_id else None
            if owner is not None and owner.role == UserRole.SUPERADMIN:
                return False
        return f.domain_name == p.domain
    if f.ownership_type == VFolderOwnership.USER:
        return f.user_id == p.user_id or db.get(VFolderPermissionRow, (f.id, p.user_id)) is not None
    return f.project_id in p.project_ids


def can_manage_folder(p: Principal, f: VFolder) -> bool:
    """Rename, change, delete: the owner of a user folder; admins of the folder's domain
    (any folder of it); superadmins. Monitors change nothing."""
    if p.role == UserRole.MONITOR:
        return False
    if access.can_manage_domain_objects(p, f.domain_name):
        # (never a superadmin's folder, unless the caller is a superadmin: access.outranks_owner)
        from sqlalchemy.orm import object_session

        owner = object_session(f).get(User, f.user_id) if f.user_id else None
        return access.outranks_owner(p, owner)
    return f.ownership_type == VFolderOwnership.USER and f.user_id == p.user_id


def _get_folder(db: DBSession, p: Principal, fid: str) -> VFolder:
    f = db.get(VFolder, fid)
    if f is None or not can_see_folder(db, p, f):
        raise access.not_found("vfolder", fid)
    return f


def _caller(db: DBSession, p: Principal) -> tuple[User, Keypair | None]:
    user = db.get(User, p.user_id)
    if user is None:
        raise Forbidden(f"no Backend.AI user {p.username!r}")
    kp = db.get(Keypair, p.access_key) if p.access_key else None
    return user, kp


def check_path(path, field: str = "path", *, allow_root: bool = True) -> str:
    """A path inside a folder, normalized: relative, no ``..``, no NUL; '' is the root."""
    if not isinstance(path, str):
        raise InvalidRequest(f"{field} must be a string")
    if len(path) > MAX_PATH:
        raise InvalidRequest(f"{field} is longer than {MAX_PATH} characters")
    if "\x00" in path or "\\" in path:
        raise InvalidRequest(f"{field}: NUL and backslash are not allowed")
    if path.startswith("/"):
        raise InvalidRequest(f"{field} {path!r} must be relative to the folder (no leading '/')")
    parts = [x for x in path.split("/") if x not in ("", ".")]
    if ".." in parts:
        raise InvalidRequest(f"{field} {path!r} leaves the folder ('..' is not allowed)")
    out = posixpath.join(*parts) if parts else ""
    if not out and not allow_root:
        raise InvalidRequest(f"{field} must name a file or directory inside the folder")
    return out


# -- list, get -----------------------------------------------------------------------


@reads
def list_folders(db: DBSession, p: Principal, filters: dict, offset: int, limit: int) -> dict:
    stmt = select(VFolder).where(folder_filter(p))
    for key, col in (("name", VFolder.name), ("host", VFolder.host),
                     ("ownership_type", VFolder.ownership_type),
                     ("project_id", VFolder.project_id), ("user_id", VFolder.user_id),
                     ("status", VFolder.status)):
        if key in filters:
            stmt = stmt.where(col == filters[key])
    total = db.scalar(select(func.count()).select_from(stmt.subquery()))
    rows = db.scalars(stmt.order_by(VFolder.name, VFolder.id).offset(offset).limit(limit)).all()
    return {"items": [vfolder_out(db, f, p) for f in rows], "total": total,
            "offset": offset, "limit": limit}


@reads
def get_folder(db: DBSession, p: Principal, fid: str) -> dict:
    return vfolder_out(db, _get_folder(db, p, fid), p)


# -- create --------------------------------------------------------------------------


def _project_ref(db: DBSession, p: Principal, ref: str) -> Project:
    proj = db.get(Project, ref)
    if proj is None:
        proj = db.scalar(select(Project).where(Project.domain_name == p.domain, Project.name == ref))
    if proj is None or not access.can_see_project(p, proj):
        raise InvalidRequest(f"project: no project {ref!r}")
    return proj


def _limits(db: DBSession, policy_model, name: str | None) -> tuple[int, int]:
    """(max_vfolder_count, max_quota_scope_size) of a policy; 0 = unlimited."""
    pol = db.get(policy_model, name) if name else None
    if pol is None:
        return 0, 0
    return pol.max_vfolder_count or 0, pol.max_quota_scope_size or 0


def check_max_size(value, scope_limit: int, where: str) -> int | None:
    """A folder's own limit as asked (None: none): a positive number of bytes, at most
    its quota scope's limit (``scope_limit``, 0: unlimited), or a 400 that says why."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"max_size_bytes: a folder's size limit is a positive number of "
                             f"bytes, not {value!r}")
    if scope_limit and value > scope_limit:
        raise InvalidRequest(
            f"max_size_bytes: {value} bytes is more than the folder's quota scope may hold, "
            f"{scope_limit} bytes (max_quota_scope_size of the {where})")
    return value


def begin_create(db: DBSession, p: Principal, body: dict, default_host: str,
                 known_hosts: list[str], *, home: bool = False,
                 inherit_max_size: int | None = None) -> dict:
    """Check a folder creation and write its row as ``provisioning``.

    Returns what the storage step needs: the folder's view, and ``quota_bytes``
    (the size limit of its quota scope, 0 = none). ``home``: the user's home folder,
    made for them at a server's start (monitors get one too), under the same
    rules otherwise (host permission, count limit). ``max_size_bytes`` in ``body``: the
    folder's own limit, checked against the scope's; ``inherit_max_size``: a clone's
    (its source's, taken as it is).
    """
    access.require(home or p.role != UserRole.MONITOR, "create vfolders")
    user, kp = _caller(db, p)
    name = check_name(body["name"])
    host = body.get("host") or default_host
    if host not in known_hosts:
        raise InvalidRequest(
            f"host: unknown vfolder host {host!r} (known: {', '.join(known_hosts) or 'none'})")
    project = None
    if body.get("project") is not None:
        project = _project_ref(db, p, body["project"])
        _no_dot_project_folder(name)
        access.require(access.can_manage_domain_objects(p, project.domain_name),
                       f"create vfolders of project {project.name!r} (domain admins may)")
        if not project.is_active:
            raise InvalidRequest(f"project: {project.name!r} is not active")
    if body.get("permission") is not None:
        # A project folder's: what every member may do; a user folder's: what its owner
        # may do with its files, in sessions and through the API (Backend.AI's
        # `vfolder create -p ro`); others get theirs through a share.
        check_permission(body["permission"])
    if "create-vfolder" not in host_permissions(db, user, host, project, kp):
        raise Forbidden(
            f"you may not create vfolders on host {host!r}: 'create-vfolder' is not in the "
            "allowed_vfolder_hosts of your domain, "
            + ("the project" if project is not None else "your projects")
            + " or your keypair's resource policy")
    if project is None:
        scope = quota_scope_of_user(user.id)
        max_count, max_size = _limits(db, UserResourcePolicy, user.resource_policy)
        where = f"user resource policy {user.resource_policy!r}"
    else:
        scope = quota_scope_of_project(project.id)
        max_count, max_size = _limits(db, ProjectResourcePolicy, project.resource_policy)
        where = f"project resource policy {project.resource_policy!r}"
    own_limit = check_max_size(body.get("max_size_bytes"), max_size, where)
    if inherit_max_size is not None:
        own_limit = inherit_max_size
    if db.scalar(select(VFolder.id).where(VFolder.quota_scope_id == scope, VFolder.name == name)):
        owner = f"project {project.name!r} already has" if project is not None else "you already have"
        raise Conflict(f"{owner} a vfolder named {name!r}")
    if max_count:
        count = db.scalar(select(func.count()).select_from(VFolder).where(
            VFolder.quota_scope_id == scope))
        if count >= max_count:
            raise QuotaExceeded(
                f"vfolder count limit reached: {count} of {max_count} ({where})")
    f = VFolder(
        name=name, host=host, quota_scope_id=scope,
        ownership_type=VFolderOwnership.PROJECT if project is not None else VFolderOwnership.USER,
        user_id=None if project is not None else user.id,
        project_id=project.id if project is not None else None,
        domain_name=project.domain_name if project is not None else user.domain_name,
        creator=user.email, usage_mode=body.get("usage_mode", "general"),
        permission=body.get("permission") or VFolderPermission.READ_WRITE,
        status=VFolderStatus.PROVISIONING, max_size_bytes=own_limit,
    )
    db.add(f)
    db.flush()
    return {"folder": vfolder_out(db, f, p), "quota_bytes": max_size}


def _set_status(db: DBSession, fid: str, status: str) -> None:
    f = db.get(VFolder, fid)
    if f is not None:
        f.status = status
        db.flush()


def _drop_row(db: DBSession, fid: str) -> None:
    f = db.get(VFolder, fid)
    if f is not None:
        db.delete(f)
        db.flush()


def _storage_error(e: Exception, what: str) -> BackendAIError:
    if isinstance(e, BackendAIError):
        return e
    return BackendAIError(f"the storage could not {what}: {e}", status_code=503)


async def _volumes(manager, away: dict[str, str] | None = None) -> dict[str, dict]:
    """Every host the storage proxies serve now, with its volume's info; an unreachable
    proxy's hosts are left out (a folder cannot be made there anyway), and named in
    ``away`` (proxy -> why) when it is given."""
    volumes = {}
    for proxy, client in manager.storage.clients.items():
        try:
            for v in await client.volumes():
                volumes[f"{proxy}:{v['name']}"] = v
        except Exception as e:
            if away is not None:
                away[proxy] = str(getattr(e, "detail", "") or e) or type(e).__name__
    return volumes


async def _made(manager, p: Principal, body: dict, hosts: list[str], make, what,
                *, home: bool = False, inherit_max_size: int | None = None) -> dict:
    """A folder's row (``begin_create``), then ``make(folder)`` on its storage and its own
    limit there; nothing stays when a step fails. ``what(folder)``: the storage step,
    for the error."""
    try:
        out = await manager.db(begin_create, p, body, manager.default_vfolder_host, hosts,
                               home=home, inherit_max_size=inherit_max_size)
    except IntegrityError:
        # Two requests raced for the same name: the unique constraint decided.
        raise Conflict(f"a vfolder named {body.get('name')!r} exists in that scope") from None
    f = out["folder"]
    try:
        if out["quota_bytes"]:
            await manager.storage.set_quota_scope(f["host"], f["quota_scope_id"], out["quota_bytes"])
        await make(f)
        if f["max_size_bytes"] is not None:
            await manager.storage.set_folder_quota(f["host"], f["quota_scope_id"], f["id"],
                                                   f["max_size_bytes"])
    except Exception as e:
        try:
            await manager.storage.delete_folder(f["host"], f["quota_scope_id"], f["id"])
        except Exception:
            pass
        await manager.db(_drop_row, f["id"])
        raise _storage_error(e, what(f)) from e
    await manager.db(_set_status, f["id"], VFolderStatus.READY)
    f["status"] = VFolderStatus.READY
    return f


async def create(manager, p: Principal, body: dict, *, home: bool = False) -> dict:
    """Create a folder: its row, then its directory; nothing stays when either fails.
    A host whose storage proxy does not answer is said to be away (503), not unknown."""
    away: dict[str, str] = {}
    known = sorted(await _volumes(manager, away))
    host = body.get("host") or manager.default_vfolder_host
    proxy = host.partition(":")[0]
    if proxy in away:  # (none of its hosts is known then)
        raise BackendAIError(f"host: the storage proxy {proxy!r} of {host!r} does not answer "
                             f"({away[proxy]}); no folder was made", status_code=503)

    async def make(f):
        await manager.storage.create_folder(f["host"], f["quota_scope_id"], f["id"])

    return await _made(manager, p, body, known, make,
                       lambda f: f"create the folder on {f['host']!r}", home=home)


async def clone(manager, p: Principal, fid: str, body: dict) -> dict:
    """Clone a folder the caller may read (download) into a new folder made under the
    rules of :func:`create` (``body``: name, and optionally usage_mode, project,
    permission); on the source's host, where its storage makes it at once: a snapshot
    on btrfs, a copy on vfs. Nothing stays when a step fails."""
    src = await manager.db_read(file_access, p, fid, "download")
    host = body.get("host")
    if host and host != src["host"]:
        raise InvalidRequest(f"host: a clone is made on its source's host ({src['host']!r}); "
                             f"cloning to {host!r} is not supported")

    async def make(f):
        await manager.storage.clone_folder(f["host"], src["quota_scope_id"], src["id"],
                                           f["quota_scope_id"], f["id"])

    return await _made(manager, p, {**body, "host": src["host"]}, [src["host"]], make,
                       lambda f: f"clone vfolder {src['name']!r}",
                       inherit_max_size=src["max_size_bytes"])


@reads
def policy_scopes(db: DBSession, kind: str, name: str) -> list[dict]:
    """(host, quota scope, limit) of every folder's scope whose owner has the user or
    project resource policy ``name``: what a change of its max_quota_scope_size must
    reach on the storage."""
    owner, ownership, owner_col, policy = {
        "user": (User, VFolderOwnership.USER, VFolder.user_id, UserResourcePolicy),
        "project": (Project, VFolderOwnership.PROJECT, VFolder.project_id,
                    ProjectResourcePolicy),
    }.get(kind, (None,) * 4)
    if owner is None:
        return []
    owners = select(owner.id).where(owner.resource_policy == name)
    rows = db.execute(select(VFolder.host, VFolder.quota_scope_id).where(
        VFolder.ownership_type == ownership, owner_col.in_(owners)).distinct())
    limit = _limits(db, policy, name)[1]
    return [{"host": h, "quota_scope_id": q, "limit": limit or None} for h, q in rows]


async def push_quota_limits(manager, kind: str, name: str) -> None:
    """Set the scope limits of a user or project resource policy on the storage now,
    so that a volume that enforces them (btrfs) applies a change at once, to running
    sessions too (vfs reads them at the next upload anyway). A storage that does not
    answer is skipped: the next upload or folder creation sets it."""
    for s in await manager.db_read(policy_scopes, kind, name):
        try:
            await manager.storage.set_quota_scope(s["host"], s["quota_scope_id"], s["limit"])
        except Exception:
            manager.log.warning("could not set the limit of quota scope %s on %s",
                                s["quota_scope_id"], s["host"], exc_info=True)


# -- update, delete ------------------------------------------------------------------


@writes
def update_folder(db: DBSession, p: Principal, fid: str, body: dict) -> dict:
    f = _get_folder(db, p, fid)
    access.require(can_manage_folder(p, f), "change this vfolder")
    if f.status != VFolderStatus.READY:
        raise Conflict(f"vfolder {f.name!r} is {f.status}")
    if body.get("permission") is not None:
        # a user folder's: its owner's own (shares keep theirs); a project folder's: members'
        f.permission = check_permission(body["permission"])
    if "usage_mode" in body:
        f.usage_mode = body["usage_mode"]
    if "name" in body and body["name"] != f.name:
        name = check_name(body["name"])
        if f.ownership_type == VFolderOwnership.PROJECT:
            _no_dot_project_folder(name)
        elif is_automount(name) and db.scalar(select(VFolderPermissionRow.user_id).where(
                VFolderPermissionRow.vfolder_id == f.id).limit(1)):
            raise InvalidRequest(
                f"name: {name!r} begins with '.' (mounted into every session of its owner, "
                f"never shared) but vfolder {f.name!r} is shared: remove its shares first")
        if db.scalar(select(VFolder.id).where(VFolder.quota_scope_id == f.quota_scope_id,
                                              VFolder.name == name)):
            raise Conflict(f"a vfolder named {name!r} exists in the same scope")
        f.name = name
    db.flush()
    return vfolder_out(db, f, p)


@reads
def limit_change(db: DBSession, p: Principal, fid: str, value) -> dict:
    """Check a change of folder ``fid``'s own size limit to ``value`` (None: none) by
    ``p`` (who may change the folder): the folder's view and its current limit."""
    f = _get_folder(db, p, fid)
    access.require(can_manage_folder(p, f), "change this vfolder")
    if f.status != VFolderStatus.READY:
        raise Conflict(f"vfolder {f.name!r} is {f.status}")
    if f.ownership_type == VFolderOwnership.PROJECT:
        project = db.get(Project, f.project_id)
        _, scope_limit = _limits(db, ProjectResourcePolicy, project.resource_policy)
        where = f"project resource policy {project.resource_policy!r}"
    else:
        owner = db.get(User, f.user_id)
        _, scope_limit = _limits(db, UserResourcePolicy, owner.resource_policy)
        where = f"user resource policy {owner.resource_policy!r}"
    check_max_size(value, scope_limit, where)
    return {"host": f.host, "quota_scope_id": f.quota_scope_id, "id": f.id,
            "old": f.max_size_bytes}


@writes
def record_folder_limit(db: DBSession, fid: str, old: int | None, new: int | None) -> bool:
    return bool(db.execute(update(VFolder).where(
        VFolder.id == fid, VFolder.status == VFolderStatus.READY,
        VFolder.max_size_bytes.is_(None) if old is None else VFolder.max_size_bytes == old)
        .values(max_size_bytes=new).execution_options(synchronize_session=False)).rowcount)


async def change_limit(manager, p: Principal, fid: str, value: int | None) -> None:
    """A folder's own size limit changed (None removes it): checked, set on the storage,
    then in the record; the storage is put back if the record changed meanwhile."""
    f = await manager.ops.limit_change(p, fid, value)
    try:
        await manager.storage.set_folder_quota(f["host"], f["quota_scope_id"], f["id"], value)
    except Exception as e:
        raise _storage_error(e, f"set the folder's size limit on {f['host']!r}") from e
    if not await manager.ops.record_folder_limit(fid, f["old"], value):
        await manager.storage.set_folder_quota(f["host"], f["quota_scope_id"], f["id"],
                                               f["old"])
        raise Conflict("the vfolder changed meanwhile (its limit, or it was deleted); "
                       "look again and retry")


def mounted_by(db: DBSession, fid: str) -> list[str]:
    """Ids of live sessions (not yet ended) that mount the folder."""
    rows = db.execute(select(Session.id, Session.vfolder_mounts).where(
        Session.alive_marker.is_not(None)))
    return sorted(sid for sid, mounts in rows
                  if any(isinstance(m, dict) and m.get("id") == fid for m in mounts or []))


# A folder in the trash (Backend.AI 24.03+'s "delete-pending"): kept whole with its name,
# not mountable nor usable, until it is restored or purged.
TRASHED = responses.TRASHED


def begin_delete(db: DBSession, p: Principal, fid: str, *, trashed: bool = False) -> dict:
    """Mark the folder as being deleted (``trashed``: it must be in the trash, else ready)."""
    f = _get_folder(db, p, fid)
    access.require(can_manage_folder(p, f), "delete this vfolder")
    if f.status != (TRASHED if trashed else VFolderStatus.READY):
        if trashed:
            raise Conflict(f"vfolder {f.name!r} is not in the trash (it is {f.status}); "
                           "delete it first")
        raise Conflict(f"vfolder {f.name!r} is {f.status}"
                       + (" (in the trash: restore or purge it)" if f.status == TRASHED else ""))
    _refuse_if_mounted(db, f)
    f.status = VFolderStatus.DELETING
    db.flush()
    return {"host": f.host, "quota_scope_id": f.quota_scope_id, "id": f.id}


async def delete(manager, p: Principal, fid: str, *, trashed: bool = False) -> None:
    """Delete the folder and its files for good (``trashed``: one in the trash)."""
    f = await manager.db(begin_delete, p, fid, trashed=trashed)
    try:
        await manager.storage.delete_folder(f["host"], f["quota_scope_id"], f["id"])
    except Exception as e:
        await manager.db(_set_status, fid, TRASHED if trashed else VFolderStatus.READY)
        raise _storage_error(e, "delete the folder") from e
    await manager.db(_drop_row, fid)


def _refuse_if_mounted(db: DBSession, f: VFolder) -> None:
    live = mounted_by(db, f.id)
    if live:
        raise Conflict(f"vfolder {f.name!r} is mounted by live session(s) {', '.join(live)}; "
                       "end them first")


@writes
def move_to_trash(db: DBSession, p: Principal, fid: str) -> dict:
    """Backend.AI's delete since 24.03: the folder goes to the trash (its files stay)."""
    f = _get_folder(db, p, fid)
    access.require(can_manage_folder(p, f), "delete this vfolder")
    if f.status != VFolderStatus.READY:
        raise Conflict(f"vfolder {f.name!r} is {f.status}"
                       + (" (already in the trash)" if f.status == TRASHED else ""))
    _refuse_if_mounted(db, f)
    f.status = TRASHED
    db.flush()
    return vfolder_out(db, f, p)


@writes
def restore_from_trash(db: DBSession, p: Principal, fid: str) -> dict:
    f = _get_folder(db, p, fid)
    access.require(can_manage_folder(p, f), "restore this vfolder")
    if f.status != TRASHED:
        raise Conflict(f"vfolder {f.name!r} is not in the trash (it is {f.status})")
    f.status = VFolderStatus.READY
    db.flush()
    return vfolder_out(db, f, p)


# -- hosts ---------------------------------------------------------------------------


def host_view(db: DBSession, p: Principal, volumes: dict[str, dict], default_host: str) -> dict:
    """The hosts the caller may use, with what they may do on each; superadmins see every
    known host (and the volumes' paths)."""
    user, kp = _caller(db, p)
    hosts = {}
    for host, info in sorted(volumes.items()):
        perms = host_permissions(db, user, host, None, kp)
        if not perms and not p.is_superadmin:
            continue
        vol = dict(info)
        if not p.is_superadmin:
            vol.pop("path", None)
        hosts[host] = {"permissions": sorted(perms), "volume": vol}
    return responses.VFolderHosts.body({
        "default": default_host, "allowed": sorted(h for h, v in hosts.items() if v["permissions"]),
        "hosts": hosts})


async def hosts(manager, p: Principal) -> dict:
    return await manager.db_read(host_view, p, await _volumes(manager),
                                 manager.default_vfolder_host)


# -- files ---------------------------------------------------------------------------

# What each file operation needs: the folder permission(s) and the host permission.
FILE_OPS = {
    "list": ((VFolderPermission.READ_ONLY, VFolderPermission.READ_WRITE,
              VFolderPermission.RW_DELETE), None),
    "download": ((VFolderPermission.READ_ONLY, VFolderPermission.READ_WRITE,
                  VFolderPermission.RW_DELETE), "download-file"),
    "upload": ((VFolderPermission.READ_WRITE, VFolderPermission.RW_DELETE), "upload-file"),
    "write": ((VFolderPermission.READ_WRITE, VFolderPermission.RW_DELETE), None),
    "delete": ((VFolderPermission.RW_DELETE,), None),
}


@reads
def file_access(db: DBSession, p: Principal, fid: str, op: str) -> dict:
    """Check that the caller may do ``op`` on the folder's files; returns where they are.

    Who may touch files is who could mount the folder (:func:`mount_permission`),
    with that permission; the owner of a user folder may also delete.
    """
    f = _get_folder(db, p, fid)
    if f.status != VFolderStatus.READY:
        raise Conflict(f"vfolder {f.name!r} is {f.status}")
    user, kp = _caller(db, p)
    perm = mount_permission(db, user, f)
    if perm is None:
        raise Forbidden(f"you have no access to the files of vfolder {f.name!r} (only its "
                        "owner, the users it is shared with and project members have)")
    allowed, host_perm = FILE_OPS[op]
    if op != "list" and op != "download" and p.role == UserRole.MONITOR:
        raise Forbidden("your role may not change files (monitors read)")
    owner = f.ownership_type == VFolderOwnership.USER and f.user_id == user.id
    # (the owner deletes in a rw folder of their own too; not in one they made read-only)
    if perm not in allowed and not (op == "delete" and owner
                                    and perm != VFolderPermission.READ_ONLY):
        need = "wd" if op == "delete" else "rw or wd"
        raise Forbidden(f"your permission on vfolder {f.name!r} is {perm}; {op} needs {need}")
    if host_perm is not None and host_perm not in host_permissions(
            db, user, f.host, db.get(Project, f.project_id) if f.project_id else None, kp):
        raise Forbidden(f"you may not {op} files on host {f.host!r}: {host_perm!r} is not in the "
                        "allowed_vfolder_hosts of your domain, projects or keypair policy")
    out = {"host": f.host, "quota_scope_id": f.quota_scope_id, "id": f.id, "name": f.name,
           "max_size_bytes": f.max_size_bytes}
    if op == "upload":
        if f.ownership_type == VFolderOwnership.USER:
            owner_user = db.get(User, f.user_id)
            out["quota_bytes"] = _limits(db, UserResourcePolicy, owner_user.resource_policy)[1]
        else:
            proj = db.get(Project, f.project_id)
            out["quota_bytes"] = _limits(db, ProjectResourcePolicy, proj.resource_policy)[1]
    return out


@reads
def transfer_grant(db: DBSession, user_id: str, folder_id: str | None, op: str) -> None:
    """Whether a transfer token's grant still holds: its user is active (and their
    domain), and may still ``op`` (upload, download) the folder's files, which is still
    ready. Raises the refusal; asked by the storage proxy on every request of a token."""
    if op not in ("upload", "download") or not folder_id:
        raise Forbidden("this transfer token grants nothing")
    try:
        p = access.load_principal(db, user_id=user_id)
        file_access(db, p, folder_id, op)
    except (Forbidden, NotFound, Conflict) as e:
        raise Forbidden(f"this transfer token's access has ended: {e.detail}") from None


def check_permission(perm) -> str:
    """``perm`` if it is a folder permission (ro, rw, wd); refused in words otherwise."""
    if perm not in PERMISSION_ORDER:
        raise InvalidRequest(f"permission must be one of {', '.join(PERMISSION_ORDER)}, not {perm!r}")
    return perm
