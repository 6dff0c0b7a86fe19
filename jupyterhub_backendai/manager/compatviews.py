"""The operations of Backend.AI's client API (``api/compat/``): the record as Backend.AI's
clients name and see it.

The compat handlers and the GraphQL resolvers (``api/compat/gql.py``) parse and check
the request, then call these by name (``await manager.ops.<name>(...)``); each runs in
one transaction of the kind it declares (:mod:`.ops`). They find sessions and folders
the way Backend.AI's clients name them (by name or id, dashed or hex) within the
caller's view (:mod:`.access`, :func:`.vfolders.folder_filter`), and shape rows as
Backend.AI's ``ComputeSession``, ``VirtualFolder``, ``User`` and ``KeyPair`` nodes, from
the same services and access rules as the admin REST API (:mod:`.admin`,
:mod:`.vfolders`, :mod:`.apiviews`). A refusal is a :class:`BackendAIError` in words;
the GraphQL resolvers answer it as a GraphQL error in the same words.
"""

from __future__ import annotations

import json
import uuid

from sqlalchemy import func, select
from sqlalchemy.orm import selectinload

from ..common.errors import Conflict, InvalidRequest, NotFound
from ..common.types import SessionStatus
from ..models import (
    Agent,
    Keypair,
    Project,
    ResourceGroup,
    Session,
    User,
    VFolder,
    VFolderPermissionRow,
)
from . import access, admin, apiviews, capacity, responses, vfolders
from .ops import reads, writes

ALL = 10_000  # the unpaginated lists (domains, groups, ...): at most this many


# -- Backend.AI's shapes ------------------------------------------------------------------


def dashed(hex_id: str | None) -> str | None:
    """Our 32-hex ids as Backend.AI's dashed UUIDs (what its clients parse)."""
    if not hex_id:
        return None
    try:
        return str(uuid.UUID(hex_id))
    except ValueError:
        return hex_id


def as_hex(ref: str) -> str | None:
    """A dashed or hex UUID as our 32-hex id; None when ``ref`` is not a UUID."""
    try:
        return uuid.UUID(ref).hex
    except (ValueError, AttributeError):
        return None


def bai_status(status: str) -> str:
    return "PREPARING" if status == SessionStatus.CREATING else status


def session_item(db, s: Session) -> dict:
    """A session in the shape of Backend.AI's ``ComputeSession`` node."""
    out = responses.Session.body(s)
    owner = db.get(User, s.user_id)
    proj = db.get(Project, s.project_id) if s.project_id else None
    slots = {k: str(v) for k, v in (out["requested_slots"] or {}).items()}
    n = max(1, int(s.cluster_size or 1))
    total = {}
    for k, v in slots.items():
        try:
            total[k] = str(type(v)(v) if n == 1 else float(v) * n)
        except (TypeError, ValueError):
            total[k] = v
    kernels = out["kernels"]
    main = next((k for k in kernels if k["cluster_role"] in ("main", None)), kernels[0] if kernels
                else None)
    return {
        "id": dashed(s.id), "main_kernel_id": dashed(main["id"]) if main else None,
        "tag": None, "name": s.name, "type": s.session_type.upper(), "image": s.image,
        "registry": None, "cluster_template": None, "cluster_mode": s.cluster_mode,
        "cluster_size": s.cluster_size, "domain_name": s.domain_name,
        "group_name": proj.name if proj else None, "group_id": dashed(s.project_id),
        "agent_ids": sorted({k["agent_id"] for k in kernels if k["agent_id"]}),
        "user_email": owner.email if owner else None, "user_id": dashed(s.user_id),
        "access_key": s.access_key, "created_user_email": owner.email if owner else None,
        "created_user_id": dashed(s.user_id), "status": bai_status(s.status),
        "status_info": s.status_info, "status_data": "{}",
        "status_changed": out["terminated_at"] or out["created_at"],
        "created_at": out["created_at"], "terminated_at": out["terminated_at"],
        "starts_at": out["starts_at"], "scheduled_at": None,
        "startup_command": s.startup_command, "result": s.result, "resource_opts": "{}",
        "scaling_group": s.resource_group, "service_ports": "[]",
        "mounts": [m["name"] for m in out["vfolder_mounts"]],
        "occupying_slots": json.dumps(total), "abusing_reports": [], "idle_checks": "{}",
        "dependencies": [{"id": dashed(d.id), "name": d.name, "status": bai_status(d.status)}
                         for d in s.dependencies],
        "containers": [{
            "id": dashed(k["id"]), "cluster_role": k["cluster_role"],
            "cluster_idx": k["cluster_idx"], "cluster_hostname": k["cluster_hostname"],
            "session_id": dashed(s.id), "image": s.image, "registry": None,
            "status": bai_status(k["status"]), "status_info": None, "status_data": "{}",
            "status_changed": None, "agent": k["agent_id"], "container_id": None,
            "resource_opts": "{}", "occupied_slots": json.dumps(slots), "preopen_ports": [],
            "live_stat": None, "last_stat": None,
        } for k in kernels],
    }


def mib(size_bytes: int | None) -> int:
    """Backend.AI's ``max_size``: MiB, rounded up (0: no limit of the folder's own)."""
    return -(-size_bytes // 2**20) if size_bytes else 0


def folder_item(db, p, f: VFolder) -> dict:
    """A folder in the shape of Backend.AI's ``VirtualFolder`` node."""
    out = vfolders.vfolder_out(db, f, p)
    owner = db.get(User, f.user_id) if f.user_id else None
    proj = db.get(Project, f.project_id) if f.project_id else None
    return {
        "id": dashed(f.id), "host": f.host, "quota_scope_id": f.quota_scope_id, "name": f.name,
        "user": dashed(f.user_id), "user_email": owner.email if owner else None,
        "group": dashed(f.project_id), "group_name": proj.name if proj else None,
        "creator": f.creator, "domain_name": f.domain_name, "unmanaged_path": None,
        "usage_mode": f.usage_mode, "permission": out["my_permission"] or f.permission,
        "ownership_type": "group" if f.ownership_type == "project" else f.ownership_type,
        "max_files": 0, "max_size": mib(f.max_size_bytes),
        "created_at": out["created_at"], "last_used": None, "num_files": None, "cur_size": None,
        "cloneable": True, "status": f.status,
    }


def user_item(db, u: dict) -> dict:
    """A user (the admin API's) in the shape of Backend.AI's ``User`` node."""
    row = db.get(User, u["id"])
    main = admin.main_keypair(row) if row is not None else None
    groups = [db.get(Project, pid) for pid in u["project_ids"]]
    return {**u, "id": dashed(u["id"]), "uuid": dashed(u["id"]), "description": None,
            "status_info": None, "is_active": u["status"] == "active", "modified_at": None,
            "groups": [{"id": dashed(g.id), "name": g.name} for g in groups if g is not None],
            "totp_activated": False, "sudo_session_enabled": False,
            "main_access_key": main.access_key if main is not None else None}


def keypair_item(db, kp: Keypair) -> dict:
    """A keypair in the shape of Backend.AI's ``KeyPair`` node (never its secret key)."""
    owner = db.get(User, kp.user_id)
    live = db.scalar(select(func.count()).select_from(Session).where(
        Session.access_key == kp.access_key, Session.alive_marker.is_not(None)))
    return {"user_id": owner.email if owner else dashed(kp.user_id),
            "access_key": kp.access_key, "secret_key": None, "is_active": kp.is_active,
            "is_admin": bool(kp.is_admin), "resource_policy": kp.resource_policy,
            "rate_limit": kp.rate_limit, "num_queries": kp.num_queries,
            "created_at": kp.created_at.isoformat() if kp.created_at else None,
            "last_used": kp.last_used.isoformat() if kp.last_used else None,
            "modified_at": None, "concurrency_used": live,
            "projects": sorted(p.name for p in owner.projects) if owner else [],
            "user_info": {"email": owner.email if owner else None,
                          "full_name": owner.full_name if owner else None}}


def _keypair_items(db, rows: list[dict]) -> list[dict]:
    return [keypair_item(db, db.get(Keypair, k["access_key"])) for k in rows]


# -- sessions and folders as the REST routes name them ----------------------------------


@reads
def resolve_session(db, p: access.Principal, ref: str) -> str:
    """A session id from a name or an id (dashed or hex), within what the caller sees.
    A name means the caller's own session of that name (a live one before ended ones,
    then the newest)."""
    hexid = as_hex(ref)
    if hexid:
        s = db.get(Session, hexid)
        if s is not None and access.can_see_session(p, s):
            return s.id
    s = db.scalars(
        select(Session).where(access.session_filter(p), Session.name == ref)
        .order_by((Session.user_id == p.user_id).desc(), Session.alive_marker.is_(None),
                  Session.created_at.desc())
        .limit(1)).first()
    if s is None:
        raise NotFound(f"no session {ref!r}")
    return s.id


@reads
def live_session_named(db, user_id: str, name: str) -> str | None:
    """The id of the user's queued or running session called ``name``, or None."""
    return db.scalars(select(Session.id).where(
        Session.user_id == user_id, Session.name == name,
        Session.alive_marker.is_not(None)).limit(1)).first()


@reads
def bai_session(db, p: access.Principal, sid: str) -> dict:
    """A session as Backend.AI's ``session info`` shows it."""
    return session_item(db, admin._get_session(db, p, sid))


@reads
def resolve_folder(db, p: access.Principal, ref: str) -> str:
    """A folder id from a name or an id (dashed or hex): the caller's own folder of that
    name first, then one shared with them or of their projects; ambiguity is a 409."""
    hexid = as_hex(ref)
    if hexid:
        f = db.get(VFolder, hexid)
        if f is not None and vfolders.can_see_folder(db, p, f):
            return f.id
    rows = db.scalars(select(VFolder).where(vfolders.folder_filter(p), VFolder.name == ref)
                      .order_by(VFolder.created_at)).all()
    own = [f for f in rows if f.user_id == p.user_id and f.ownership_type == "user"]
    if own:
        return own[0].id
    if len(rows) > 1:
        raise Conflict(f"{len(rows)} folders named {ref!r} are visible to you; name it by id "
                       f"({', '.join(dashed(f.id) for f in rows[:5])})")
    if not rows:
        raise NotFound(f"no vfolder {ref!r}")
    return rows[0].id


@reads
def folder_rest(db, p, fid: str) -> dict:
    """A folder as Backend.AI's ``GET /folders/{name}`` answers it."""
    f = vfolders._get_folder(db, p, fid)
    out = vfolders.vfolder_out(db, f, p)
    return {
        "id": dashed(f.id), "name": f.name, "host": f.host,
        "quota_scope_id": f.quota_scope_id, "usage_mode": f.usage_mode,
        "created_at": out["created_at"], "is_owner": f.user_id == p.user_id,
        "permission": out["my_permission"] or f.permission, "user": dashed(f.user_id),
        "group": dashed(f.project_id),
        # Backend.AI's words: a project folder is a "group" folder
        "type": "group" if f.ownership_type == "project" else f.ownership_type,
        "status": f.status,
        "numFiles": 0, "cloneable": True, "max_files": 0, "max_size": mib(f.max_size_bytes),
    }


# -- GraphQL's queries (``POST /admin/gql``) ----------------------------------------------


@reads
def bai_keypair(db, p: access.Principal, access_key: str) -> dict:
    return keypair_item(db, admin._get_keypair(db, p, access_key))


@reads
def bai_user(db, p: access.Principal, uid: str) -> dict:
    return user_item(db, admin.get_user(db, p, uid))


@reads
def bai_users(db, p: access.Principal, filters: dict, offset: int, limit: int) -> dict:
    """A page of the users the caller sees (``GET /users``' filters) as ``User`` nodes:
    ``{"items", "total"}``."""
    page = admin.list_users(db, p, filters, offset, limit)
    return {"items": [user_item(db, u) for u in page["items"]], "total": page["total"]}


@reads
def bai_keypairs(db, p: access.Principal, email: str | None, is_active: bool | None,
                 offset: int, limit: int) -> dict:
    """A page of the keypairs the caller sees, of the user ``email`` (all when None), as
    ``KeyPair`` nodes: ``{"items", "total"}``."""
    f = {} if is_active is None else {"is_active": is_active}
    if email:
        users = admin.list_users(db, p, {"email": email}, 0, ALL)["items"]
        if not users:
            raise NotFound(f"no user {email!r}")
        f["user_id"] = users[0]["id"]
    page = admin.list_keypairs(db, p, f, offset, limit, newest_first=True)
    return {"items": _keypair_items(db, page["items"]), "total": page["total"]}


@reads
def bai_keypair_resource_policy(db, p: access.Principal, name: str | None) -> dict:
    """The keypair resource policy ``name``; None: the caller's keypair's."""
    if name is None:
        kp = db.get(Keypair, p.access_key) if p.access_key else None
        if kp is None:
            raise InvalidRequest("name: which keypair resource policy")
        name = kp.resource_policy
    return capacity.get_policy(db, p, "keypair", name)


@reads
def bai_storage_volumes(db, p: access.Principal, volumes: dict[str, dict]) -> dict:
    """The hosts of ``volumes`` the caller may use (:func:`.vfolders.host_view`)."""
    return vfolders.host_view(db, p, volumes, "")["hosts"]


@reads
def bai_compute_session(db, p: access.Principal, sid: str) -> dict | None:
    """A session the caller sees as a ``ComputeSession`` node; None for any other id."""
    s = db.get(Session, sid)
    if s is None or not access.can_see_session(p, s):
        return None
    return session_item(db, s)


@reads
def bai_compute_session_list(db, p: access.Principal, statuses: list[str] | None,
                             access_key: str | None, offset: int, limit: int) -> dict:
    """A page of the sessions the caller sees (of these statuses, of this keypair),
    newest first: ``{"items", "total_count"}``."""
    stmt = (select(Session).where(access.session_filter(p))
            .options(selectinload(Session.kernels), selectinload(Session.dependencies)))
    if statuses is not None:
        stmt = stmt.where(Session.status.in_(statuses))
    if access_key:
        stmt = stmt.where(Session.access_key == access_key)
    total = db.scalar(select(func.count()).select_from(stmt.subquery()))
    rows = db.scalars(stmt.order_by(Session.created_at.desc(), Session.id)
                      .offset(offset).limit(limit)).unique().all()
    return {"items": [session_item(db, s) for s in rows], "total_count": total}


@reads
def bai_vfolder_list(db, p: access.Principal, project_id: str | None, offset: int,
                     limit: int, kind: str = "all") -> dict:
    """A page of the folders the caller sees (of one project), by name:
    ``{"items", "total_count"}``. ``kind``: ``all``; ``own`` (``vfolder_own_list``: the
    caller's user folders), ``invited`` (``vfolder_invited_list``: user folders shared
    with the caller), ``project`` (``vfolder_project_list``: folders of the caller's
    projects)."""
    stmt = select(VFolder).where(vfolders.folder_filter(p))
    if project_id:
        stmt = stmt.where(VFolder.project_id == project_id)
    if kind == "own":
        stmt = stmt.where(VFolder.ownership_type == "user", VFolder.user_id == p.user_id)
    elif kind == "invited":
        stmt = stmt.where(VFolder.ownership_type == "user", VFolder.user_id != p.user_id,
                          select(VFolderPermissionRow.user_id).where(
                              VFolderPermissionRow.vfolder_id == VFolder.id,
                              VFolderPermissionRow.user_id == p.user_id).exists())
    elif kind == "project":
        stmt = stmt.where(VFolder.ownership_type == "project",
                          VFolder.project_id.in_(list(p.project_ids)))
    total = db.scalar(select(func.count()).select_from(stmt.subquery()))
    rows = db.scalars(stmt.order_by(VFolder.name, VFolder.id).offset(offset).limit(limit)).all()
    return {"items": [folder_item(db, p, f) for f in rows], "total_count": total}


def bai_slot_name(name: str) -> str:
    """Our slot name in Backend.AI's words (``gpu`` is ``cuda.device``)."""
    return "cuda.device" if name == "gpu" else name


def _bai_slots(slots: dict) -> str:
    return json.dumps({bai_slot_name(k): v for k, v in (slots or {}).items()})


def agent_item(a: dict) -> dict:
    """An agent (the admin API's) in the shape of Backend.AI's ``Agent`` node. No live
    statistics are kept here: ``cpu_cur_pct`` and ``mem_cur_bytes`` are what the kernels
    have reserved (the CPU share of the agent's, the memory bytes), not measurements."""
    avail, used = a["available_slots"] or {}, a["occupied_slots"] or {}
    try:
        cpu_pct = round(100 * float(used.get("cpu", 0)) / float(avail.get("cpu") or 1), 1)
    except (TypeError, ValueError):
        cpu_pct = 0.0
    try:
        mem = float(used.get("mem", 0))
    except (TypeError, ValueError):
        mem = 0.0
    return {
        "id": a["id"], "status": a["status"], "status_changed": None, "region": None,
        "architecture": a["architecture"], "scaling_group": a["resource_group"],
        "schedulable": a["schedulable"], "available_slots": _bai_slots(a["available_slots"]),
        "occupied_slots": _bai_slots(a["occupied_slots"]), "addr": a["addr"],
        "first_contact": a["first_contact"], "lost_at": None, "live_stat": None,
        "version": a["version"], "compute_plugins": "{}", "hardware_metadata": "{}",
        "compute_containers": [], "local_config": "{}", "cpu_cur_pct": cpu_pct,
        "mem_cur_bytes": mem,
    }


@reads
def bai_agents(db, p: access.Principal, status: str | None, group: str | None, offset: int,
               limit: int) -> dict:
    """A page of the agents the caller may read (admins: their domain's groups'), as
    ``Agent`` nodes: ``{"items", "total_count"}``."""
    f = {}
    if status:
        f["status"] = status
    if group:
        f["resource_group"] = group
    page = capacity.list_agents(db, p, f, offset, limit)
    return {"items": [agent_item(a) for a in page["items"]], "total_count": page["total"]}


@reads
def bai_resource_slots(db) -> dict:
    """``GET /config/resource-slots``: every slot this installation's agents offer, with
    its unit (Backend.AI's names)."""
    names = {"cpu", "mem"}
    for slots in db.scalars(select(Agent.available_slots)):
        names.update(k for k, v in (slots or {}).items() if v)
    return {bai_slot_name(n): "bytes" if n == "mem" else "count" for n in sorted(names)}


@reads
def bai_usable_scaling_groups(db, p: access.Principal, project_ref: str) -> list[str]:
    """``GET /scaling-groups?group=``: the active resource groups the caller may start
    sessions in for project ``project_ref`` (id or name, one the caller belongs to, or
    of their domain for its admins): public ones, and those allowing the caller's
    domain, that project or the caller's keypair (Backend.AI's union)."""
    try:
        pid = uuid.UUID(project_ref).hex
    except ValueError:
        pid = None
    proj = db.get(Project, pid) if pid else db.scalar(select(Project).where(
        Project.domain_name == p.domain, Project.name == project_ref))
    if proj is None or not access.can_see_project(p, proj):
        raise NotFound(f"no group (project) {project_ref!r} of yours")
    usable = access.usable_group_names(db, p)
    out = []
    for g in db.scalars(select(ResourceGroup).where(ResourceGroup.is_active)
                        .order_by(ResourceGroup.name)):
        if usable is not None and g.name not in usable:
            continue
        if (g.is_public or proj.domain_name in (g.allowed_domains or [])
                or proj.id in (g.allowed_projects or [])
                or (p.access_key and p.access_key in (g.allowed_keypairs or []))):
            out.append(g.name)
    return out


@reads
def bai_status_history(db, p: access.Principal, sid: str) -> dict:
    """``GET /session/{ref}/status-history``: when the session entered each status, by
    the status's name in lower case (the key the clients read: ``preparing``, ``terminated``)."""
    s = admin._get_session(db, p, sid)
    return {k.lower(): v for k, v in sorted((s.status_history or {}).items(),
                                            key=lambda kv: str(kv[1]))}


@writes
def rename_session(db, p: access.Principal, sid: str, name: str) -> None:
    """``session rename``: a batch session's name (an interactive session is a JupyterHub
    server, named by JupyterHub, which cannot rename one: refused with what to do)."""
    s = admin._get_session(db, p, sid)
    access.require(access.can_manage_session(p, s, db.get(User, s.user_id)),
                   f"rename session {s.name!r}")
    if s.session_type != "batch":
        raise Conflict(f"session {s.name!r} is the JupyterHub server {s.name!r}, and JupyterHub "
                       "cannot rename a server: stop it and create a session under the new "
                       "name (your folders keep the files)")
    if s.alive_marker is None:
        raise Conflict(f"session {s.name!r} has ended; only a live session is renamed")
    if name == s.name:
        return
    if db.scalar(select(Session.id).where(Session.access_key == s.access_key,
                                          Session.name == name,
                                          Session.alive_marker.is_not(None))):
        raise Conflict(f"a live session named {name!r} exists")
    s.name = name
    db.flush()


# -- GraphQL's mutations: one transaction each (a refusal leaves nothing behind) -----------
#
# The request is checked before (the REST API's request models, in api/); what JupyterHub
# mirrors comes back as HubChanges, made by the caller after the commit.


@writes
def bai_set_association(db, p: access.Principal, name: str, field: str, seen: list[str],
                        new: list[str]) -> bool:
    """Set resource group ``name``'s ``field`` (``allowed_domains``, ``allowed_projects``,
    ``allowed_keypairs``) to ``new`` if it still is ``seen``; False (nothing changed) if
    it changed since the caller read it."""
    g = capacity.get_resource_group(db, p, name)
    if list(g[field] or []) != list(seen):
        return False
    capacity.update_resource_group(db, p, name, {field: new})
    return True


@writes
def bai_dissociate_all(db, p: access.Principal, field: str, key: str) -> None:
    """Take ``key`` out of ``field`` of every resource group that names it (a domain: one
    the caller can see)."""
    if field == "allowed_domains":
        admin.get_domain(db, p, key)
    access.require(access.may_change_installation(p), "change resource groups")
    for g in capacity.list_resource_groups(db, p, {}, 0, ALL)["items"]:
        if key in (g[field] or []):
            now = list(capacity.get_resource_group(db, p, g["name"])[field] or [])
            capacity.update_resource_group(db, p, g["name"], {field: [k for k in now if k != key]})


@writes
def bai_create_keypair(db, p: access.Principal, body: dict) -> dict:
    """Create a keypair (``KeypairCreate``): its ``KeyPair`` node with the secret key."""
    out = admin.create_keypair(db, p, body)
    item = keypair_item(db, db.get(Keypair, out["access_key"]))
    return {**item, "secret_key": out["secret_key"]}


@writes
def bai_create_user(db, p: access.Principal, body: dict) -> dict:
    """Create a user (``UserCreate``): its ``User`` node."""
    return user_item(db, admin.create_user(db, p, body))


@writes
def bai_modify_user(db, p: access.Principal, uid: str,
                    body: dict) -> tuple[dict, apiviews.HubChange]:
    """Change a user (``UserUpdate``), as ``PATCH /users/{id}``: its ``User`` node."""
    out, change = apiviews.update_user(db, p, uid, body)
    return user_item(db, out), change


@writes
def bai_modify_group(db, p: access.Principal, pid: str, body: dict,
                     members: tuple[str, list[str]] | None
                     ) -> tuple[dict, list[apiviews.HubChange]]:
    """Change a project (``ProjectUpdate``, when ``body``) and add or remove members
    (``members``: ``("add" | "remove", user ids)``), all or nothing: the project after."""
    changes = []
    if body:
        changes.append(apiviews.update_project(db, p, pid, body)[1])
    if members is not None:
        mode, ids = members
        change = apiviews.add_members if mode == "add" else apiviews.remove_members
        changes.append(change(db, p, pid, ids)[1])
    return admin.get_project(db, p, pid), changes


__all__ = ["ALL", "dashed", "as_hex", "bai_status", "session_item", "folder_item",
           "user_item", "keypair_item"]
