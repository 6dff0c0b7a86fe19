"""Who may see and change what: the permission rules of the admin API, in one place.

Backend.AI's roles: a *superadmin* runs the whole installation; a domain
*admin* runs everything inside their own domain and nothing outside it; a
*user* reads themselves and manages their own keypairs and sessions; a
*monitor* reads everything inside their domain and changes nothing.

Two kinds of refusal, on purpose: an object the caller may not *see* is
reported as missing (404), so that probing ids reveals nothing; an object the
caller sees but may not *change* gets 403. Every rule here is expressed twice:
as a SQL filter (what list endpoints return) and as a check on one loaded row
(what item endpoints do), and the isolation test holds both to the same table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import and_, false, or_, select, true
from sqlalchemy.orm import Session as DBSession
from sqlalchemy.orm import object_session

from ..common.errors import Forbidden, NotFound
from ..common.types import UserRole, UserStatus
from ..models import (
    Agent,
    Domain,
    Keypair,
    Project,
    ResourceGroup,
    Session,
    User,
    project_members,
)
from .ops import reads

SUPERADMIN = UserRole.SUPERADMIN
ADMIN = UserRole.ADMIN
USER = UserRole.USER
MONITOR = UserRole.MONITOR


@dataclass(frozen=True)
class Principal:
    """The caller of one request, as the record knew them when it started."""

    user_id: str
    username: str
    email: str
    role: str
    domain: str
    project_ids: frozenset[str] = field(default_factory=frozenset)
    access_key: str | None = None  # the keypair that signed the request, if any

    @property
    def is_superadmin(self) -> bool:
        return self.role == SUPERADMIN

    @property
    def is_domain_admin(self) -> bool:
        return self.role == ADMIN

    @property
    def reads_domain(self) -> bool:
        """Roles that read everything inside their domain."""
        return self.role in (ADMIN, MONITOR)


@reads
def load_principal(db: DBSession, *, username: str | None = None, user_id: str | None = None,
                   access_key: str | None = None) -> Principal:
    """The caller's current record; inactive users and domains are refused with a reason.

    A hub account without a Backend.AI user (possible when the record was
    changed behind the hub's back) is refused too: the API acts only for
    people the record knows.
    """
    if user_id is not None:
        user = db.get(User, user_id)
    else:
        user = db.scalar(select(User).where(User.username == username))
    if user is None:
        raise Forbidden(f"no Backend.AI user {username or user_id!r} for these credentials")
    if user.status != UserStatus.ACTIVE:
        raise Forbidden(f"the account {user.username!r} is {user.status}, not active")
    domain = db.get(Domain, user.domain_name)
    if domain is None or not domain.is_active:
        raise Forbidden(f"the domain {user.domain_name!r} of {user.username!r} is not active")
    return Principal(
        user_id=user.id,
        username=user.username,
        email=user.email,
        role=user.role,
        domain=user.domain_name,
        project_ids=frozenset(p.id for p in user.projects),
        access_key=access_key,
    )


def deny(what: str) -> Forbidden:
    """A refusal that names the action refused ("you may not create users in domain 'x'")."""
    return Forbidden(f"you may not {what}")


# -- superadmins' own objects ------------------------------------------------------
#
# A superadmin's keypairs, sessions and folders are the installation's, not their
# domain's: a domain admin or monitor of that domain neither sees them (lists, GETs:
# 404 like anything else they may not see) nor acts on them.


def _superadmin_ids():
    return select(User.id).where(User.role == SUPERADMIN)


def _superadmins_own(obj, user_id: str | None) -> bool:
    """Whether ``user_id`` (the owner of ``obj``, an object of a database session) is a
    superadmin."""
    if not user_id:
        return False
    db = object_session(obj)
    owner = db.get(User, user_id) if db is not None else None
    return owner is not None and owner.role == SUPERADMIN


# -- domains -------------------------------------------------------------------


def domain_filter(p: Principal):
    return true() if p.is_superadmin else Domain.name == p.domain


def may_change_installation(p: Principal) -> bool:
    """Create/change/delete what belongs to the whole installation: domains, resource
    policies and resource groups (superadmins only)."""
    return p.is_superadmin


# -- projects ------------------------------------------------------------------


def project_filter(p: Principal):
    if p.is_superadmin:
        return true()
    if p.reads_domain:
        return Project.domain_name == p.domain
    return Project.id.in_(select(project_members.c.project_id).where(
        project_members.c.user_id == p.user_id))


def can_see_project(p: Principal, proj: Project) -> bool:
    if p.is_superadmin:
        return True
    if p.reads_domain:
        return proj.domain_name == p.domain
    return any(m.id == p.user_id for m in proj.members)


def can_manage_domain_objects(p: Principal, domain: str) -> bool:
    """Create/change/delete projects, users, keypairs, sessions inside ``domain``."""
    return p.is_superadmin or (p.is_domain_admin and domain == p.domain)


# -- users ---------------------------------------------------------------------


def user_filter(p: Principal):
    if p.is_superadmin:
        return true()
    if p.reads_domain:
        return User.domain_name == p.domain
    return User.id == p.user_id


def can_see_user(p: Principal, user: User) -> bool:
    if p.is_superadmin or user.id == p.user_id:
        return True
    return p.reads_domain and user.domain_name == p.domain


def can_manage_user(p: Principal, user: User) -> bool:
    """Domain admins manage their domain's users, but never a superadmin."""
    if p.is_superadmin:
        return True
    return p.is_domain_admin and user.domain_name == p.domain and user.role != SUPERADMIN


def outranks_owner(p: Principal, owner: User | None) -> bool:
    """Nobody below superadmin acts on a superadmin's objects (folders, sessions, logs).

    A domain admin runs their domain, but a superadmin's session or folder that
    happens to live in it is the installation's, not the domain's.
    """
    return p.is_superadmin or owner is None or owner.role != SUPERADMIN or owner.id == p.user_id


# -- limits ----------------------------------------------------------------------
#
# A level's limits are set by the level above it: nobody raises the limits that bind
# themselves. Superadmins have no level above and set everything.


def may_set_limits_of_user(p: Principal, user: User) -> bool:
    """The user's resource policy (and their keypairs' policy and rate limit)."""
    return p.is_superadmin or (can_manage_user(p, user) and user.id != p.user_id)


def may_set_limits_of_project(p: Principal, proj: Project) -> bool:
    """A project's slots and resource policy: not by a member of the project."""
    if p.is_superadmin:
        return True
    return can_manage_domain_objects(p, proj.domain_name) and proj.id not in p.project_ids


# -- starting sessions: every path (the spawn form, JupyterHub's REST API, the admin
# API, batch) goes through the manager's enqueue, which asks here. ----------------


def start_refusal(user: User | None, domain: Domain | None, project: Project | None) -> str | None:
    """Why ``user`` may not start a session in ``project`` now (None: they may)."""
    if user is None:
        return "no such user"
    if user.status != UserStatus.ACTIVE:
        return f"the account {user.username!r} is {user.status}, not active"
    if domain is None or not domain.is_active:
        return f"the domain {user.domain_name!r} is not active"
    if project is not None and not project.is_active:
        return f"the project {project.name!r} is not active"
    return None


def mount_permission(role: str, permission: str) -> str:
    """The permission a mount gets for ``role``: a monitor never writes, whatever the folder."""
    return "ro" if role == MONITOR else permission


# -- keypairs ------------------------------------------------------------------


def keypair_filter(p: Principal):
    if p.is_superadmin:
        return true()
    if p.reads_domain:
        return Keypair.user_id.in_(select(User.id).where(
            User.domain_name == p.domain, User.role != SUPERADMIN))
    return Keypair.user_id == p.user_id


def can_see_keypair(p: Principal, kp: Keypair) -> bool:
    if p.is_superadmin or kp.user_id == p.user_id:
        return True
    return can_see_user(p, kp.user) and kp.user.role != SUPERADMIN


def owns_keypairs_of(p: Principal, owner: User) -> bool:
    """Users (not monitors) manage their own keypairs, within the defaults."""
    return owner.id == p.user_id and p.role != MONITOR


def can_manage_keypair(p: Principal, kp: Keypair) -> bool:
    """Change or delete ``kp``: its owner's admins, or the owner (only its activity; the
    limits are the level above's: :func:`may_set_limits_of_user`)."""
    return can_manage_user(p, kp.user) or owns_keypairs_of(p, kp.user)


# -- sessions ------------------------------------------------------------------


def session_filter(p: Principal):
    if p.is_superadmin:
        return true()
    if p.reads_domain:
        return and_(Session.domain_name == p.domain, or_(
            Session.user_id.is_(None), Session.user_id.not_in(_superadmin_ids())))
    return Session.user_id == p.user_id


def can_see_session(p: Principal, sess: Session) -> bool:
    if p.is_superadmin or sess.user_id == p.user_id:
        return True
    return (p.reads_domain and sess.domain_name == p.domain
            and not _superadmins_own(sess, sess.user_id))


def can_manage_session(p: Principal, sess: Session, owner: User | None = None) -> bool:
    if p.is_superadmin:
        return True
    if p.role == MONITOR:
        return False
    if p.is_domain_admin:
        return sess.domain_name == p.domain and outranks_owner(p, owner)
    return sess.user_id == p.user_id


# -- resource groups and agents ------------------------------------------------


def usable_group_names(db: DBSession, p: Principal) -> set[str] | None:
    """Resource groups the caller's domain (or, for users, the caller) may use; None = all.

    As in Backend.AI, the union decides: a group is usable when it is public, or
    allows the domain, one of the projects, or one of the keypairs in question.
    Admins and monitors look with their whole domain's eyes, users with their own.
    """
    if p.is_superadmin:
        return None
    if p.reads_domain:
        projects = set(db.scalars(select(Project.id).where(Project.domain_name == p.domain)))
        keys = set(db.scalars(select(Keypair.access_key).join(User).where(
            User.domain_name == p.domain)))
    else:
        projects = set(p.project_ids)
        keys = set(db.scalars(select(Keypair.access_key).where(Keypair.user_id == p.user_id)))
    out = set()
    for g in db.scalars(select(ResourceGroup)):
        if (g.is_public or p.domain in (g.allowed_domains or [])
                or projects & set(g.allowed_projects or [])
                or keys & set(g.allowed_keypairs or [])):
            out.add(g.name)
    return out


def resource_group_filter(db: DBSession, p: Principal):
    names = usable_group_names(db, p)
    return true() if names is None else ResourceGroup.name.in_(sorted(names)) if names else false()


def agent_filter(db: DBSession, p: Principal):
    if p.role == USER:
        return false()
    names = usable_group_names(db, p)
    return true() if names is None else Agent.resource_group.in_(sorted(names)) if names else false()


def require(cond: bool, what: str) -> None:
    if not cond:
        raise deny(what)


def not_found(kind: str, key: str) -> NotFound:
    return NotFound(f"no {kind} {key!r}")


def any_of(*conds):
    return or_(*conds)


@reads
def client_ip_allowlists(db: DBSession, usernames: list[str]) -> dict[str, tuple[str, ...]]:
    """The ``allowed_client_ip`` of those of ``usernames`` that have one (not empty), for
    the proxy's routes to their servers (jupyterhub_backendai.proxy)."""
    out: dict[str, tuple[str, ...]] = {}
    names = sorted(set(usernames))
    for i in range(0, len(names), 500):
        rows = db.execute(select(User.username, User.allowed_client_ip)
                          .where(User.username.in_(names[i:i + 500])))
        for name, allowed in rows:
            if allowed:
                out[name] = tuple(str(a) for a in allowed)
    return out
