"""The admin API's operations on the record: list, read, create, change, delete, for
domains, projects, users, keypairs and sessions (resource policies, groups, presets and
agents: :mod:`.capacity`; the shapes both share: :mod:`.crud`).

Each function runs inside one database transaction (``manager.db(fn, ...)``)
and takes the caller's :class:`~.access.Principal` first, so that the
permission rules of :mod:`.access` are applied where the rows are loaded:
lists are filtered in SQL, single objects are checked after loading. A
function either completes or raises a :class:`BackendAIError` with a 4xx
status; the transaction then rolls back and nothing is half-done.

Bodies arrive already checked against the OpenAPI document's schemas (types,
unknown fields, bounds); what is checked here is what a schema cannot say:
references to other rows, uniqueness, and who may set which field.
"""

from __future__ import annotations

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session as DBSession
from sqlalchemy.orm import selectinload

from ..common.errors import Conflict, Forbidden, InvalidRequest, NotFound
from ..common.types import UserRole, UserStatus
from ..models import (
    Domain,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectResourcePolicy,
    ResourceGroup,
    Session,
    User,
    UserResourcePolicy,
    VFolder,
    VFolderPermissionRow,
    project_members,
    session_dependencies,
)
from . import access, crud, responses, tenancy
from .access import Principal
from .ops import reads, writes

DEFAULT = crud.DEFAULT


# -- whoami --------------------------------------------------------------------


@reads
def whoami(db: DBSession, p: Principal) -> dict:
    user = db.get(User, p.user_id)
    return responses.Whoami.body({
        "user": user, "role": user.role, "domain": db.get(Domain, user.domain_name),
        "projects": sorted(user.projects, key=lambda x: x.name), "keypair": p.access_key})


# -- domains -------------------------------------------------------------------

DOMAIN_FIELDS = ("description", "is_active", "total_resource_slots", "allowed_vfolder_hosts",
                 "allowed_docker_registries")


@reads
def list_domains(db, p: Principal, filters: dict, offset: int, limit: int) -> dict:
    stmt = crud.filtered(select(Domain).where(access.domain_filter(p)), filters,
                         {"is_active": Domain.is_active})
    return crud.page(db, stmt, [Domain.name], offset, limit, responses.Domain)


def _get_domain(db, p: Principal, name: str) -> Domain:
    return crud.visible(db, Domain, name, "domain", lambda d: p.is_superadmin or name == p.domain)


@reads
def get_domain(db, p: Principal, name: str) -> dict:
    return responses.Domain.body(_get_domain(db, p, name))


@writes
def create_domain(db, p: Principal, body: dict) -> dict:
    access.require(access.may_change_installation(p), "create domains")
    crud.check_name("name", body["name"])
    return responses.Domain.body(crud.insert_named(db, Domain, "domain", body, DOMAIN_FIELDS))


def update_domain(db, p: Principal, name: str, body: dict) -> dict:
    d = _get_domain(db, p, name)
    access.require(access.may_change_installation(p), "change domains")
    if name == p.domain and body.get("is_active") is False:
        raise Conflict("you cannot deactivate your own domain")
    return crud.updated(db, d, body, DOMAIN_FIELDS, responses.Domain)


@writes
def delete_domain(db, p: Principal, name: str) -> None:
    d = _get_domain(db, p, name)
    access.require(access.may_change_installation(p), "delete domains")
    crud.delete_unused(db, d, "domain", (User.domain_name, Project.domain_name),
                       f"domain {name!r} still has users or projects; delete them first")


# -- projects ------------------------------------------------------------------

PROJECT_FIELDS = ("name", "description", "is_active", "total_resource_slots",
                  "allowed_vfolder_hosts", "resource_policy")


@reads
def list_projects(db, p: Principal, filters: dict, offset: int, limit: int) -> dict:
    stmt = crud.filtered(select(Project).where(access.project_filter(p)), filters, {
        "domain": Project.domain_name, "name": Project.name, "is_active": Project.is_active})
    return crud.page(db, stmt, [Project.domain_name, Project.name], offset, limit, responses.Project)


def _get_project(db, p: Principal, pid: str) -> Project:
    return crud.visible(db, Project, pid, "project", lambda proj: access.can_see_project(p, proj))


@reads
def get_project(db, p: Principal, pid: str) -> dict:
    return responses.Project.body(_get_project(db, p, pid))


def _project_body(db, body: dict) -> None:
    if "name" in body:
        crud.check_name("name", body["name"])
    crud.need(db, ProjectResourcePolicy, body.get("resource_policy"), "resource_policy",
              "project resource policy")


def create_project(db, p: Principal, body: dict) -> dict:
    domain = body.get("domain_name", p.domain)
    access.require(access.can_manage_domain_objects(p, domain), f"create projects in domain {domain!r}")
    if db.get(Domain, domain) is None:
        raise InvalidRequest(f"domain_name: no domain {domain!r}")
    _project_body(db, body)
    if db.scalar(select(Project).where(Project.domain_name == domain, Project.name == body["name"])):
        raise Conflict(f"project {body['name']!r} exists in domain {domain!r}")
    proj = Project(domain_name=domain)
    crud.apply_fields(proj, body, PROJECT_FIELDS)
    db.add(proj)
    db.flush()
    return responses.Project.body(proj)


def update_project(db, p: Principal, pid: str, body: dict) -> tuple[dict, str]:
    """Returns the project and its JupyterHub group name before the change (renames)."""
    proj = _get_project(db, p, pid)
    access.require(access.can_manage_domain_objects(p, proj.domain_name),
                   f"change project {proj.name!r}")
    limits = sorted(set(body) & {"total_resource_slots", "resource_policy"})
    if limits and not access.may_set_limits_of_project(p, proj):
        raise Forbidden(f"{limits[0]}: you may not change the limits of a project you are a "
                        "member of; a superadmin can")
    _project_body(db, body)
    old_group = hub_group(proj)
    if "name" in body and body["name"] != proj.name and db.scalar(select(Project).where(
            Project.domain_name == proj.domain_name, Project.name == body["name"])):
        raise Conflict(f"project {body['name']!r} exists in domain {proj.domain_name!r}")
    return crud.updated(db, proj, body, PROJECT_FIELDS, responses.Project), old_group


def delete_project(db, p: Principal, pid: str) -> str:
    """Returns the JupyterHub group name of the deleted project."""
    proj = _get_project(db, p, pid)
    access.require(access.can_manage_domain_objects(p, proj.domain_name),
                   f"delete project {proj.name!r}")
    if crud.count(db, Session.project_id, pid):
        raise Conflict(f"project {pid!r} has sessions; deactivate it instead")
    if crud.count(db, VFolder.project_id, pid):
        # (the rows would go with it, the directories on the storage would not)
        raise Conflict(f"project {pid!r} has vfolders; delete them first")
    group = hub_group(proj)
    proj.members.clear()
    db.delete(proj)
    db.flush()
    return group


def hub_group(proj: Project) -> str:
    """The JupyterHub group that mirrors a project (names are unique per domain only)."""
    return group_name(proj.domain_name, proj.name)


def group_name(domain: str, project: str) -> str:
    """``<domain>:<project>``: ':' is in neither name's alphabet, so no two projects share
    a group (with '.', domain ``x.y`` + project ``z`` and ``x`` + ``y.z`` did)."""
    return f"{domain}:{project}"


@reads
def list_members(db, p: Principal, pid: str, offset: int, limit: int) -> dict:
    proj = _get_project(db, p, pid)
    access.require(p.is_superadmin or p.reads_domain, "list project members")
    stmt = select(User).join(project_members, project_members.c.user_id == User.id).where(
        project_members.c.project_id == proj.id)
    return crud.page(db, stmt, [User.username], offset, limit, responses.User)


def add_members(db, p: Principal, pid: str, user_ids: list[str]) -> dict:
    """Returns ``{"project_id", "group", "added": [usernames]}`` (the hub mirrors it)."""
    proj = _get_project(db, p, pid)
    access.require(access.can_manage_domain_objects(p, proj.domain_name), "change project members")
    current = {m.id for m in proj.members}
    added = []
    for uid in dict.fromkeys(user_ids):
        user = db.get(User, uid)
        if user is None or not access.can_see_user(p, user):
            raise InvalidRequest(f"user_ids: no user {uid!r}")
        if user.domain_name != proj.domain_name:
            raise InvalidRequest(
                f"user_ids: user {uid!r} is not in the project's domain {proj.domain_name!r}")
        if uid not in current:
            proj.members.append(user)
            added.append(user.username)
    db.flush()
    return responses.MembersChanged.body({
        "project_id": proj.id, "group": hub_group(proj), "added": added,
        "user_ids": sorted(m.id for m in proj.members)})


def remove_member(db, p: Principal, pid: str, uid: str) -> tuple[str, str]:
    """Returns (JupyterHub group, username) of the removed membership."""
    proj = _get_project(db, p, pid)
    access.require(access.can_manage_domain_objects(p, proj.domain_name), "change project members")
    user = next((m for m in proj.members if m.id == uid), None)
    if user is None or not access.can_see_user(p, user):
        raise NotFound(f"user {uid!r} is not a member of project {pid!r}")
    proj.members.remove(user)
    db.flush()
    return hub_group(proj), user.username


# -- users ---------------------------------------------------------------------

# Backend.AI 26.09's ids of a user's kernel processes: who owns what they write on shared
# volumes, so only superadmins set them.
CONTAINER_IDS = ("container_uid", "container_main_gid", "container_gids")
USER_FIELDS = ("email", "full_name", "status", "role", "domain_name", "resource_policy",
               "need_password_change", "allowed_client_ip", *CONTAINER_IDS)


@reads
def list_users(db, p: Principal, filters: dict, offset: int, limit: int) -> dict:
    stmt = crud.filtered(select(User).where(access.user_filter(p)), filters, {
        "domain": User.domain_name, "role": User.role, "status": User.status})
    if "email" in filters:
        stmt = stmt.where(tenancy.email_is(filters["email"]))
    if "project" in filters:
        stmt = stmt.where(User.id.in_(select(project_members.c.user_id).where(
            project_members.c.project_id == filters["project"])))
    return crud.page(db, stmt, [User.username], offset, limit, responses.User)


def _get_user(db, p: Principal, uid: str) -> User:
    return crud.visible(db, User, uid, "user", lambda user: access.can_see_user(p, user))


@reads
def get_user(db, p: Principal, uid: str) -> dict:
    return responses.User.body(_get_user(db, p, uid))


def _check_user_body(db, p: Principal, body: dict, user: User | None = None) -> None:
    if "role" in body and body["role"] == UserRole.SUPERADMIN and not p.is_superadmin:
        raise Forbidden("only superadmins may create or promote superadmins")
    if "domain_name" in body:
        if not p.is_superadmin and body["domain_name"] != p.domain:
            raise Forbidden("domain admins may not place users in other domains")
        if db.get(Domain, body["domain_name"]) is None:
            raise InvalidRequest(f"domain_name: no domain {body['domain_name']!r}")
    if "email" in body and not tenancy.EMAIL_RE.fullmatch(body["email"]):
        raise InvalidRequest(f"email: {body['email']!r} is not an email address")
    if "password" in body and len(body["password"].encode()) > 72:
        raise InvalidRequest("password: at most 72 bytes (bcrypt's limit)")
    crud.need(db, UserResourcePolicy, body.get("resource_policy"), "resource_policy",
              "user resource policy")
    # (26.09's `user add` sends null for each id it was not given: no change is no refusal)
    given = [k for k in CONTAINER_IDS
             if k in body and body[k] != (getattr(user, k) if user is not None else None)]
    if given and not p.is_superadmin:
        raise Forbidden(f"{', '.join(given)}: only superadmins may set a user's container "
                        "ids (they decide who owns the files a kernel writes)")


def _set_projects(db, user: User, project_ids: list[str]) -> None:
    projects = []
    for pid in dict.fromkeys(project_ids):
        proj = db.get(Project, pid)
        if proj is None or proj.domain_name != user.domain_name:
            raise InvalidRequest(f"project_ids: no project {pid!r} in domain {user.domain_name!r}")
        projects.append(proj)
    user.projects = projects


@writes
def create_user(db, p: Principal, body: dict) -> dict:
    body = dict(body)
    body.setdefault("domain_name", p.domain)
    access.require(access.can_manage_domain_objects(p, body["domain_name"]),
                   f"create users in domain {body['domain_name']!r}")
    _check_user_body(db, p, body)
    if "username" in body and not tenancy.USERNAME_RE.fullmatch(body["username"]):
        raise InvalidRequest(
            f"username: {body['username']!r} is not valid (lowercase letters, digits, '.', '_', '-')")
    user, kp, secret = tenancy.create_user(
        db, email=body["email"], password=body["password"], username=body.get("username"),
        role=body.get("role", UserRole.USER), domain=body["domain_name"],
        status=body.get("status", UserStatus.ACTIVE), projects=[],
    )
    for k in ("full_name", "resource_policy", "need_password_change", "allowed_client_ip",
              *CONTAINER_IDS):
        if k in body:
            setattr(user, k, body[k])
    if "project_ids" in body:
        _set_projects(db, user, body["project_ids"])
    else:
        default = db.scalar(select(Project).where(Project.domain_name == user.domain_name,
                                                  Project.name == DEFAULT))
        user.projects = [default] if default is not None else []
    db.flush()
    return responses.UserCreated.body(responses.With(
        user, keypair={"access_key": kp.access_key, "secret_key": secret}))


def update_user(db, p: Principal, uid: str, body: dict) -> tuple[dict, list[str]]:
    """Returns the user and the JupyterHub groups it had before (the hub mirrors changes)."""
    user = _get_user(db, p, uid)
    access.require(access.can_manage_user(p, user), f"change user {user.username!r}")
    if "resource_policy" in body and body["resource_policy"] != user.resource_policy \
            and not access.may_set_limits_of_user(p, user):
        raise Forbidden("resource_policy: you may not change your own limits; "
                        "a superadmin can")
    _check_user_body(db, p, body, user)
    if uid == p.user_id and (body.get("role", user.role) != user.role
                             or body.get("status", user.status) != UserStatus.ACTIVE
                             or body.get("domain_name", user.domain_name) != user.domain_name):
        raise Conflict("you cannot change your own role, status or domain")
    if "email" in body and body["email"] != user.email and db.scalar(
            select(User).where(tenancy.email_is(body["email"]), User.id != user.id)):
        raise Conflict(f"email: a user with email {body['email']!r} exists")
    old_groups = sorted(hub_group(pr) for pr in user.projects)
    moved = "domain_name" in body and body["domain_name"] != user.domain_name
    crud.apply_fields(user, body, USER_FIELDS)
    if "password" in body:
        user.password = tenancy.hash_password(body["password"])
    if "project_ids" in body:
        _set_projects(db, user, body["project_ids"])
    elif moved:
        user.projects = [pr for pr in user.projects if pr.domain_name == user.domain_name]
    if "role" in body:
        for kp in user.keypairs:
            kp.is_admin = user.role in (UserRole.SUPERADMIN, UserRole.ADMIN)
    db.flush()
    return responses.User.body(user), old_groups


def delete_user(db, p: Principal, uid: str) -> tuple[str, list[str]]:
    """Returns the username and its JupyterHub groups (the hub's account loses them)."""
    user = _get_user(db, p, uid)
    access.require(access.can_manage_user(p, user), f"delete user {user.username!r}")
    if uid == p.user_id:
        raise Conflict("you cannot delete yourself")
    if db.scalar(select(func.count()).select_from(Session).where(
            Session.user_id == uid, Session.alive_marker.is_not(None))):
        raise Conflict(f"user {uid!r} has live sessions; stop them first (setting status "
                       "'inactive' ends them)")
    if crud.count(db, VFolder.user_id, uid):
        raise Conflict(f"user {uid!r} has vfolders; delete them first (or set status "
                       "'deleted' or 'inactive')")
    name = user.username
    groups = sorted(hub_group(pr) for pr in user.projects)
    for share in db.scalars(select(VFolderPermissionRow).where(VFolderPermissionRow.user_id == uid)):
        db.delete(share)
    user.projects = []
    # Identity by id: the user's ended sessions go with it (a new user of the same name
    # starts with nothing; the hub's account, servers and tokens go in the handler).
    ended = select(Session.id).where(Session.user_id == uid)
    db.execute(delete(session_dependencies).where(or_(
        session_dependencies.c.session_id.in_(ended), session_dependencies.c.depends_on.in_(ended))))
    db.execute(delete(Kernel).where(Kernel.session_id.in_(ended)))
    db.execute(delete(Session).where(Session.user_id == uid))
    for kp in list(user.keypairs):
        db.delete(kp)
    db.flush()
    db.delete(user)
    db.flush()
    return name, groups


# -- deactivation: what it ends ---------------------------------------------------


@reads
def cut_off(db, *, domain: str | None = None, project: str | None = None,
            user: str | None = None) -> tuple[list[str], list[str]]:
    """(live session ids, usernames) a deactivation ends: every live session of the
    domain, project or user; the users whose hub access ends (a domain's users, or the
    user; a project's members keep their accounts, only its sessions end)."""
    stmt = select(Session.id).where(Session.alive_marker.is_not(None))
    names: list[str] = []
    if domain is not None:
        stmt = stmt.where(Session.domain_name == domain)
        names = list(db.scalars(select(User.username).where(User.domain_name == domain)))
    elif project is not None:
        stmt = stmt.where(Session.project_id == project)
    else:
        stmt = stmt.where(Session.user_id == user)
        names = list(db.scalars(select(User.username).where(User.id == user)))
    return sorted(db.scalars(stmt)), sorted(names)


# -- keypairs ------------------------------------------------------------------


@reads
def list_keypairs(db, p: Principal, filters: dict, offset: int, limit: int, *,
                  newest_first: bool = False) -> dict:
    """``newest_first``: Backend.AI's order (its clients take the first row as the newest
    key); the admin API's is oldest first."""
    stmt = crud.filtered(select(Keypair).where(access.keypair_filter(p)), filters,
                         {"user_id": Keypair.user_id, "is_active": Keypair.is_active})
    order = [Keypair.created_at, Keypair.access_key]
    if newest_first:
        order = [o.desc() for o in order]
    return crud.page(db, stmt, order, offset, limit, responses.Keypair)


def _get_keypair(db, p: Principal, ak: str) -> Keypair:
    return crud.visible(db, Keypair, ak, "keypair", lambda kp: access.can_see_keypair(p, kp))


@reads
def get_keypair(db, p: Principal, ak: str) -> dict:
    return responses.Keypair.body(_get_keypair(db, p, ak))


def _owner_may(p: Principal, owner: User) -> bool:
    return access.owns_keypairs_of(p, owner)


def main_keypair(owner: User) -> Keypair | None:
    """The user's main keypair (``is_default``; Backend.AI's ``users.main_access_key``):
    its policy and rate limit are the user's limits."""
    return next((k for k in owner.keypairs if k.is_default), None)


LIMIT_FIELDS = ("rate_limit", "resource_policy", "is_default")


@writes
def create_keypair(db, p: Principal, body: dict) -> dict:
    """A new keypair inherits the policy and rate limit of the owner's main keypair;
    only someone who may set the owner's limits (the level above) chooses others."""
    owner = _get_user(db, p, body.get("user_id", p.user_id))
    if not access.can_manage_user(p, owner):
        access.require(_owner_may(p, owner), f"create keypairs for user {owner.username!r}")
    if not access.may_set_limits_of_user(p, owner):
        for k in ("rate_limit", "resource_policy"):
            if k in body:
                raise Forbidden(f"{k}: you may not choose it for your own keypairs (a new "
                                "keypair has your main keypair's); an admin of the level above can")
    if "is_admin" in body and not p.is_superadmin:
        raise Forbidden("is_admin: only superadmins may set it")
    crud.need(db, KeypairResourcePolicy, body.get("resource_policy"), "resource_policy",
              "keypair resource policy")
    main = main_keypair(owner)
    kp, secret = tenancy.create_keypair(db, owner, is_default=main is None)
    if main is not None:
        kp.resource_policy, kp.rate_limit = main.resource_policy, main.rate_limit
    for k in ("rate_limit", "resource_policy", "is_admin", "is_active"):
        if k in body:
            setattr(kp, k, body[k])
    db.flush()
    return responses.KeypairCreated.body(responses.With(kp, secret_key=secret))


@writes
def update_keypair(db, p: Principal, ak: str, body: dict) -> dict:
    kp = _get_keypair(db, p, ak)
    if not access.can_manage_user(p, kp.user):
        access.require(_owner_may(p, kp.user), f"change keypair {ak!r}")
        extra = set(body) - {"is_active"}
        if extra:
            raise Forbidden(f"{sorted(extra)[0]}: you may not change it; an admin can")
        if body.get("is_active") is True and not kp.is_active:
            raise Forbidden("is_active: only an admin may reactivate a keypair")
    limits = sorted(set(body) & set(LIMIT_FIELDS))
    if limits and not access.may_set_limits_of_user(p, kp.user):
        raise Forbidden(f"{limits[0]}: you may not change your own limits; an admin of the "
                        "level above can")
    if body.get("is_active") is False and kp.is_default and not access.may_set_limits_of_user(
            p, kp.user):
        raise Conflict("you cannot deactivate your main keypair (its policy and rate limit "
                       "are your limits); an admin can")
    if "is_admin" in body and not p.is_superadmin:
        raise Forbidden("is_admin: only superadmins may set it")
    crud.need(db, KeypairResourcePolicy, body.get("resource_policy"), "resource_policy",
              "keypair resource policy")
    if body.get("is_default"):
        for other in kp.user.keypairs:
            other.is_default = other.access_key == ak
    for k in ("is_active", "rate_limit", "resource_policy", "is_admin", "is_default"):
        if k in body:
            setattr(kp, k, body[k])
    db.flush()
    return responses.Keypair.body(kp)


@writes
def delete_keypair(db, p: Principal, ak: str) -> None:
    kp = _get_keypair(db, p, ak)
    if not access.can_manage_user(p, kp.user):
        access.require(_owner_may(p, kp.user), f"delete keypair {ak!r}")
    if p.access_key == ak:
        raise Conflict("you cannot delete the keypair that signed this request")
    if kp.is_default:
        raise Conflict(f"keypair {ak!r} is the user's main keypair; make another one the main "
                       "keypair (is_default) first")
    if crud.count(db, Session.access_key, ak):
        raise Conflict(f"keypair {ak!r} has sessions; deactivate it instead")
    db.delete(kp)
    db.flush()


# -- sessions ------------------------------------------------------------------


@reads
def list_sessions(db, p: Principal, filters: dict, offset: int, limit: int) -> dict:
    # Eager-load what the Session body reads: one query per relation, not one per session.
    stmt = (
        select(Session)
        .where(access.session_filter(p))
        .options(selectinload(Session.kernels), selectinload(Session.dependencies))
    )
    stmt = crud.filtered(stmt, filters, {
        "status": Session.status, "user_id": Session.user_id,
        "project_id": Session.project_id, "type": Session.session_type})
    return crud.page(db, stmt, [Session.created_at, Session.id], offset, limit, responses.Session)


def _get_session(db, p: Principal, sid: str) -> Session:
    return crud.visible(db, Session, sid, "session", lambda s: access.can_see_session(p, s))


@reads
def get_session(db, p: Principal, sid: str) -> dict:
    return responses.Session.body(_get_session(db, p, sid))


@reads
def session_logs(db, p: Principal, sid: str) -> dict:
    s = _get_session(db, p, sid)
    access.require(access.outranks_owner(p, db.get(User, s.user_id)),
                   "read the logs of a superadmin's session")
    return responses.SessionLogs.body(s)


@writes
def check_session_create(db, p: Principal, resource_group: str) -> None:
    """Who may create sessions where; the manager's ``enqueue`` checks the rest."""
    access.require(p.role != UserRole.MONITOR, "create sessions (monitors change nothing)")
    names = access.usable_group_names(db, p)
    if db.get(ResourceGroup, resource_group) is None or (
            names is not None and resource_group not in names):
        raise InvalidRequest(f"resource_group: no resource group {resource_group!r} you may use")


@writes
def check_session_destroy(db, p: Principal, sid: str) -> None:
    s = _get_session(db, p, sid)
    owner = db.get(User, s.user_id)
    access.require(access.can_manage_session(p, s, owner),
                   "stop a superadmin's session" if p.is_domain_admin and s.domain_name == p.domain
                   else f"stop session {s.name!r}")


@reads
def resource_group_names(db) -> list[str]:
    """Every resource group's name."""
    return sorted(db.scalars(select(ResourceGroup.name)))


@reads
def scheduler_view(db, p: Principal) -> set[str] | None:
    """Which resource groups' scheduler state the caller may read (None = all)."""
    access.require(p.is_superadmin or p.is_domain_admin, "read the scheduler's state")
    return access.usable_group_names(db, p)
