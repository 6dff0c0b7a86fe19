"""Session templates (Backend.AI's task templates) and dotfiles (issue 27): the operations
the client API calls (``api/compat/templates.py``), one transaction each.

**Templates** belong to a user, in their domain and (optionally) one of their projects.
Its owner and the admins who manage the owner change or delete one; the owner, the
members of its project and admins of its domain see it. A template is Backend.AI's
``taskTemplate`` (``spec.kernel.image``, ``spec.session_type``, ``spec.resources``,
``spec.mounts``, ``spec.kernel.environ``, ``spec.kernel.run.startup_command``,
``spec.scaling_group``), checked when stored; ``create-from-template`` fills a create
request from it (:func:`apply_template`), which is then checked as any create is.

**Dotfiles** belong to a user, a project (Backend.AI's group) or a domain; each new
session of a user gets those of the user, of the session's project and of the user's
domain written into its home folder (the user's own winning over the project's, the
project's over the domain's). A user changes their own; the admins who manage a
project's or domain's objects change those, and members read them.
"""

from __future__ import annotations

import json
import re

from sqlalchemy import or_, select

from ..common.errors import Conflict, InvalidRequest, NotFound
from ..models import Dotfile, Keypair, Project, SessionTemplate, User
from . import access
from .ops import reads, writes

#: Backend.AI's limits: a dotfile's data, and all of one owner's together.
MAX_DOTFILE_BYTES = 64 * 1024
MAX_DOTFILES = 100
#: Paths the platform writes itself: a dotfile may not replace them (Backend.AI's list).
RESERVED = (".terminfo", ".jupyter", ".ssh", ".local", ".config")
MAX_TEMPLATE_BYTES = 64 * 1024
HOME = "/home/work"


# -- dotfiles --------------------------------------------------------------------------------


def check_dotfile(path, permission, data) -> tuple[str, str, str]:
    """(path under the home folder, permission, data), or a 400 saying what is wrong."""
    if not isinstance(path, str) or not path.strip():
        raise InvalidRequest("path: the dotfile's path is required")
    if path.startswith(HOME + "/"):
        path = path[len(HOME) + 1:]
    if path.startswith("/"):
        raise InvalidRequest(f"path: {path!r}: a dotfile's path is relative to the home "
                             f"folder ({HOME})")
    parts = path.split("/")
    if len(path) > 256 or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise InvalidRequest(f"path: {path!r} is not a relative path of at most 256 "
                             "characters (no empty, '.' or '..' parts)")
    if parts[0] in RESERVED:
        raise InvalidRequest(f"path: {path!r}: {parts[0]} is reserved for the platform")
    if not isinstance(permission, str) or not re.fullmatch(r"[0-7]{3}", permission):
        raise InvalidRequest(f"permission: {permission!r} is not three octal digits "
                             "(e.g. 644)")
    if not isinstance(data, str):
        raise InvalidRequest("data: the dotfile's text is required")
    if len(data.encode()) > MAX_DOTFILE_BYTES:
        raise InvalidRequest(f"data: at most {MAX_DOTFILE_BYTES // 1024} KiB per dotfile")
    return path, permission, data


def _keypair_user(db, p: access.Principal, access_key: str | None, may, what: str) -> User:
    """The user of the keypair ``access_key`` (the caller without one, or with their own
    key): NotFound for one they cannot see, Forbidden unless ``may(user)`` (``what``: what
    they asked for, ``{}`` the user's email)."""
    if not access_key or access_key == p.access_key:
        return db.get(User, p.user_id)
    kp = db.get(Keypair, access_key)
    user = db.get(User, kp.user_id) if kp is not None else None
    if user is None or not access.can_see_user(p, user):
        raise access.not_found("keypair", access_key)
    access.require(may(user), what.format(user.email))
    return user


def _owner(db, p: access.Principal, scope: str, *, access_key=None, group=None,
           domain=None, write: bool) -> tuple[str, dict]:
    """The owner key and foreign keys of the dotfiles of ``scope`` that ``p`` names;
    NotFound for one they cannot see, Forbidden for one they see but may not change."""
    if scope == "user":
        user = _keypair_user(db, p, access_key, lambda u: u.id == p.user_id
                             or access.can_manage_user(p, u), "the dotfiles of {}")
        return f"user:{user.id}", {"user_id": user.id}
    if scope == "group":
        if not isinstance(group, str) or not group:
            raise InvalidRequest("group: the project's id or name is required")
        proj = _project(db, p, group, domain)
        if write:
            access.require(access.can_manage_domain_objects(p, proj.domain_name),
                           f"the dotfiles of project {proj.name!r}")
        return f"group:{proj.id}", {"project_id": proj.id}
    if not isinstance(domain, str) or not domain:
        raise InvalidRequest("domain: the domain's name is required")
    if not (p.is_superadmin or domain == p.domain):
        raise access.not_found("domain", domain)
    if write:
        access.require(access.can_manage_domain_objects(p, domain),
                       f"the dotfiles of domain {domain!r}")
    return f"domain:{domain}", {"domain_name": domain}


def _project(db, p: access.Principal, ref: str, domain: str | None) -> Project:
    hexed = ref.replace("-", "").lower()
    proj = db.get(Project, hexed) if re.fullmatch(r"[0-9a-f]{32}", hexed) else None
    if proj is None:
        q = select(Project).where(Project.name == ref,
                                  Project.domain_name == (domain or p.domain))
        proj = db.scalars(q).first()
    if proj is None or not access.can_see_project(p, proj):
        raise access.not_found("group", ref)
    return proj


def _dotfile_item(d: Dotfile) -> dict:
    return {"path": d.path, "permission": d.permission, "data": d.data}


@reads
def dotfile_list(db, p, scope: str, **ref) -> list[dict]:
    key, _ = _owner(db, p, scope, write=False, **ref)
    rows = db.scalars(select(Dotfile).where(Dotfile.owner == key).order_by(Dotfile.path))
    return [_dotfile_item(d) for d in rows]


def _one(db, key: str, path: str) -> Dotfile:
    d = db.scalars(select(Dotfile).where(Dotfile.owner == key, Dotfile.path == path)).first()
    if d is None:
        raise NotFound(f"no dotfile {path!r}")
    return d


@reads
def dotfile_get(db, p, scope: str, path: str, **ref) -> dict:
    key, _ = _owner(db, p, scope, write=False, **ref)
    path, _, _ = check_dotfile(path, "644", "")
    return _dotfile_item(_one(db, key, path))


@writes
def dotfile_create(db, p, scope: str, path, permission, data, **ref) -> dict:
    key, fks = _owner(db, p, scope, write=True, **ref)
    path, permission, data = check_dotfile(path, permission, data)
    rows = list(db.scalars(select(Dotfile).where(Dotfile.owner == key)))
    if any(d.path == path for d in rows):
        raise Conflict(f"dotfile {path!r} already exists (update it)")
    if len(rows) >= MAX_DOTFILES:
        raise InvalidRequest(f"at most {MAX_DOTFILES} dotfiles each")
    if sum(len(d.data.encode()) for d in rows) + len(data.encode()) > MAX_DOTFILE_BYTES:
        raise InvalidRequest(f"at most {MAX_DOTFILE_BYTES // 1024} KiB of dotfiles each")
    db.add(Dotfile(owner=key, path=path, permission=permission, data=data, **fks))
    return {}


@writes
def dotfile_update(db, p, scope: str, path, permission, data, **ref) -> dict:
    key, _ = _owner(db, p, scope, write=True, **ref)
    path, permission, data = check_dotfile(path, permission, data)
    d = _one(db, key, path)
    others = db.scalars(select(Dotfile).where(Dotfile.owner == key, Dotfile.id != d.id))
    if sum(len(o.data.encode()) for o in others) + len(data.encode()) > MAX_DOTFILE_BYTES:
        raise InvalidRequest(f"at most {MAX_DOTFILE_BYTES // 1024} KiB of dotfiles each")
    d.permission, d.data = permission, data
    return {}


@writes
def dotfile_delete(db, p, scope: str, path, **ref) -> dict:
    key, _ = _owner(db, p, scope, write=True, **ref)
    path, _, _ = check_dotfile(path, "644", "")
    db.delete(_one(db, key, path))
    return {"success": True}


def session_dotfiles(db, user_id: str, project_id: str | None) -> list[dict]:
    """The dotfiles a new session of ``user_id`` in ``project_id`` gets: the domain's,
    then the project's, then the user's, one per path (the later winning)."""
    user = db.get(User, user_id)
    if user is None:
        return []
    keys = [f"domain:{user.domain_name}", *([f"group:{project_id}"] if project_id else []),
            f"user:{user.id}"]
    rows = list(db.scalars(select(Dotfile).where(Dotfile.owner.in_(keys))))
    rows.sort(key=lambda d: keys.index(d.owner))
    out = {d.path: {"path": d.path, "permission": d.permission, "data": d.data} for d in rows}
    return list(out.values())


# -- session templates -------------------------------------------------------------------------


def parse_payload(payload) -> list[tuple[str, dict]]:
    """Backend.AI's template payload (JSON or YAML text: one template, or a list of
    ``{"name", "template"}``) as (name, template) pairs, each checked."""
    import yaml

    if not isinstance(payload, str) or not payload.strip():
        raise InvalidRequest("payload: the template (JSON or YAML text) is required")
    if len(payload.encode()) > MAX_TEMPLATE_BYTES:
        raise InvalidRequest(f"payload: at most {MAX_TEMPLATE_BYTES // 1024} KiB")
    try:
        body = yaml.safe_load(payload)
    except yaml.YAMLError as e:
        raise InvalidRequest(f"payload is neither JSON nor YAML: {str(e)[:200]}") from None
    items = body if isinstance(body, list) else [body]
    if not items or len(items) > 20:
        raise InvalidRequest("payload: one to 20 templates")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise InvalidRequest("payload: each template is an object")
        tpl = check_template(item.get("template", item))
        name = item.get("name") or (tpl.get("metadata") or {}).get("name")
        out.append((check_name(name), tpl))
    return out


def check_name(name) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[\w.-][\w .-]{0,127}", name):
        raise InvalidRequest(f"name: {name!r} is not a template name (1-128 letters, digits, "
                             "'.', '_', '-', spaces; metadata.name or the item's name)")
    return name


def check_template(tpl) -> dict:
    """A task template (Backend.AI's ``taskTemplate``), as JSON that round-trips."""
    if not isinstance(tpl, dict):
        raise InvalidRequest("template: an object is required")
    if tpl.get("kind", "taskTemplate") != "taskTemplate":
        raise InvalidRequest(f"template: kind {tpl.get('kind')!r}: only taskTemplate")
    spec = tpl.get("spec")
    kernel = spec.get("kernel") if isinstance(spec, dict) else None
    if not isinstance(kernel, dict) or not isinstance(kernel.get("image"), str) \
            or not kernel["image"]:
        raise InvalidRequest("template: spec.kernel.image is required")
    if spec.get("session_type", "interactive") not in ("interactive", "batch"):
        raise InvalidRequest("template: spec.session_type is interactive or batch")
    for key, where in (("resources", spec), ("environ", kernel), ("run", kernel)):
        if where.get(key) is not None and not isinstance(where[key], dict):
            raise InvalidRequest(f"template: {key} must be an object")
    mounts = spec.get("mounts")
    if mounts is not None and not isinstance(mounts, (dict, list)):
        raise InvalidRequest("template: spec.mounts must be folder names (a list or an "
                             "object of names)")
    if isinstance(mounts, dict) and any(v not in (None, "", f"{HOME}/{k}")
                                        for k, v in mounts.items()):
        raise InvalidRequest(f"template: spec.mounts: folders mount at {HOME}/<name> here "
                             "(mount_map is not supported)")
    try:
        return json.loads(json.dumps(tpl, default=str))
    except (TypeError, ValueError):
        raise InvalidRequest("template: not JSON-able") from None


def apply_template(tpl: dict, body: dict) -> dict:
    """A create request (Backend.AI's body) filled from a template: what the request
    names wins, the template gives the rest."""
    spec, out = tpl["spec"], {k: v for k, v in body.items() if v is not None}
    kernel = spec["kernel"]
    config = {k: v for k, v in (body.get("config") or {}).items() if v not in (None, [], {})}
    out.setdefault("image", kernel["image"])
    out.setdefault("type", spec.get("session_type", "interactive"))
    command = (kernel.get("run") or {}).get("startup_command")
    if command:
        out.setdefault("startupCommand", command)
    if spec.get("resources"):
        config.setdefault("resources", spec["resources"])
    if spec.get("scaling_group"):
        config.setdefault("scalingGroup", spec["scaling_group"])
    mounts = spec.get("mounts")
    if mounts:
        config.setdefault("mounts", list(mounts))
    env = {**(kernel.get("environ") or {}), **(config.get("environ") or {})}
    if env:
        config["environ"] = env
    out["config"] = config
    out.pop("template_id", None)
    return out


def _template_item(t: SessionTemplate, p, owner: User | None, proj: Project | None) -> dict:
    return {"name": t.name, "id": t.id, "created_at": t.created_at.isoformat(),
            "is_owner": t.user_id == p.user_id, "type": t.type,
            "user": t.user_id, "user_email": owner.email if owner else None,
            "group": t.project_id, "group_name": proj.name if proj else None,
            "domain_name": t.domain_name, "template": t.template}


def _template(db, p, tid: str, *, write: bool) -> SessionTemplate:
    hexed = tid.replace("-", "").lower() if isinstance(tid, str) else ""
    t = db.get(SessionTemplate, hexed) if re.fullmatch(r"[0-9a-f]{32}", hexed) else None
    owner = db.get(User, t.user_id) if t is not None else None
    if t is None or owner is None or not _sees(db, p, t, owner):
        raise access.not_found("session template", tid)
    if write:
        access.require(t.user_id == p.user_id or access.can_manage_user(p, owner),
                       f"session template {tid!r} of {owner.email}")
    return t


def _sees(db, p, t: SessionTemplate, owner: User) -> bool:
    if t.user_id == p.user_id or p.is_superadmin:
        return True
    if p.reads_domain and t.domain_name == p.domain:
        return True
    return t.project_id is not None and t.project_id in p.project_ids


@writes
def template_create(db, p, payload, group=None, domain=None, access_key=None) -> list[dict]:
    items = parse_payload(payload)
    user = _keypair_user(db, p, access_key, lambda u: access.can_manage_user(p, u),
                         "templates of {}")
    project_id = None
    if group:
        proj = _project(db, p, group, domain)
        if not (any(m.id == user.id for m in proj.members)
                or access.can_manage_domain_objects(p, proj.domain_name)):
            raise InvalidRequest(f"group {group!r}: the template's owner is not a member")
        project_id = proj.id
    out = []
    for name, tpl in items:
        t = SessionTemplate(name=name, user_id=user.id, domain_name=user.domain_name,
                            project_id=project_id, template=tpl)
        db.add(t)
        db.flush()
        out.append({"id": t.id, "user": user.id})
    return out


@reads
def template_list(db, p, list_all: bool = False) -> list[dict]:
    q = select(SessionTemplate)
    if not (list_all and p.is_superadmin):
        conds = [SessionTemplate.user_id == p.user_id]
        if p.project_ids:
            conds.append(SessionTemplate.project_id.in_(p.project_ids))
        if list_all and p.reads_domain:
            conds.append(SessionTemplate.domain_name == p.domain)
        q = q.where(or_(*conds))
    out = []
    for t in db.scalars(q.order_by(SessionTemplate.created_at.desc())):
        proj = db.get(Project, t.project_id) if t.project_id else None
        out.append(_template_item(t, p, db.get(User, t.user_id), proj))
    return out


@reads
def template_get(db, p, tid: str) -> dict:
    return _template(db, p, tid, write=False).template


@writes
def template_update(db, p, tid: str, payload) -> dict:
    t = _template(db, p, tid, write=True)
    items = parse_payload(payload)
    if len(items) != 1:
        raise InvalidRequest("payload: one template to replace one")
    t.name, t.template = items[0]
    return {"success": True}


@writes
def template_delete(db, p, tid: str) -> dict:
    db.delete(_template(db, p, tid, write=True))
    return {"success": True}


__all__ = ["apply_template", "check_dotfile", "parse_payload", "session_dotfiles"]
