"""Domains, users, keypairs: the operations the CLI, the authenticator and the spawner share."""

from __future__ import annotations

import re

import bcrypt
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session as DBSession

from ..common.errors import Conflict, InvalidRequest, NotFound
from ..common.ids import generate_keypair
from ..common.types import HOST_PERMISSIONS, UserRole, UserStatus
from ..models import (
    Domain,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectResourcePolicy,
    ResourceGroup,
    User,
    UserResourcePolicy,
)

DEFAULT = "default"
# The embedded storage proxy ("local") and its one volume.
DEFAULT_VFOLDER_HOST = "local:volume1"
USERNAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+$")


def hash_password(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()


def check_password(password: str, hashed: str) -> bool:
    try:
        return bcrypt.checkpw(password.encode(), hashed.encode())
    except ValueError:
        return False


def ensure_defaults(db: DBSession, vfolder_host: str = DEFAULT_VFOLDER_HOST) -> None:
    """The rows every installation starts with (Backend.AI's fixtures). The default
    domain may use ``vfolder_host`` (the embedded storage proxy's volume) fully."""
    if db.get(Domain, DEFAULT) is None:
        db.add(Domain(name=DEFAULT, description="Default domain",
                      allowed_vfolder_hosts={vfolder_host: list(HOST_PERMISSIONS)} if vfolder_host else {}))
    if db.get(KeypairResourcePolicy, DEFAULT) is None:
        db.add(KeypairResourcePolicy(name=DEFAULT))
    if db.get(UserResourcePolicy, DEFAULT) is None:
        db.add(UserResourcePolicy(name=DEFAULT))
    if db.get(ProjectResourcePolicy, DEFAULT) is None:
        db.add(ProjectResourcePolicy(name=DEFAULT))
    if db.get(ResourceGroup, DEFAULT) is None:
        db.add(ResourceGroup(name=DEFAULT, description="Default resource group"))
    db.flush()
    if db.scalar(select(Project).where(Project.domain_name == DEFAULT, Project.name == DEFAULT)) is None:
        db.add(Project(name=DEFAULT, domain_name=DEFAULT, description="Default project"))
    db.flush()


def create_domain(db: DBSession, name: str, description: str = "") -> Domain:
    if not USERNAME_RE.fullmatch(name):
        raise InvalidRequest(f"invalid domain name {name!r}")
    if db.get(Domain, name) is not None:
        raise Conflict(f"domain {name!r} exists")
    d = Domain(name=name, description=description)
    db.add(d)
    db.flush()
    return d


def create_project(db: DBSession, domain: str, name: str) -> Project:
    if db.get(Domain, domain) is None:
        raise NotFound(f"no domain {domain!r}")
    if db.scalar(select(Project).where(Project.domain_name == domain, Project.name == name)):
        raise Conflict(f"project {name!r} exists in domain {domain!r}")
    p = Project(name=name, domain_name=domain)
    db.add(p)
    db.flush()
    return p


def create_user(
    db: DBSession,
    *,
    email: str,
    password: str,
    username: str | None = None,
    role: str = UserRole.USER,
    domain: str = DEFAULT,
    status: str = UserStatus.ACTIVE,
    projects: list[str] | None = None,
) -> tuple[User, Keypair, str]:
    """Create a user with a default keypair; returns (user, keypair, secret key)."""
    if not EMAIL_RE.fullmatch(email or ""):
        raise InvalidRequest(f"invalid email {email!r}")
    username = username or email.split("@")[0].lower()
    if not USERNAME_RE.fullmatch(username):
        raise InvalidRequest(
            f"invalid username {username!r}: lowercase letters, digits, '.', '_', '-'"
        )
    if role not in set(UserRole):
        raise InvalidRequest(f"unknown role {role!r}")
    if status not in set(UserStatus):
        raise InvalidRequest(f"unknown status {status!r}")
    if len(password) < 8:
        raise InvalidRequest("password must be at least 8 characters")
    if db.get(Domain, domain) is None:
        raise NotFound(f"no domain {domain!r}")
    if db.scalar(select(User).where(or_(email_is(email), User.username == username))):
        raise Conflict(f"a user with email {email!r} or username {username!r} exists")
    user = User(
        email=email,
        username=username,
        password=hash_password(password),
        role=role,
        domain_name=domain,
        status=status,
        resource_policy=DEFAULT,
    )
    for pname in projects if projects is not None else [DEFAULT]:
        p = db.scalar(select(Project).where(Project.domain_name == domain, Project.name == pname))
        if p is None:
            raise NotFound(f"no project {pname!r} in domain {domain!r}")
        user.projects.append(p)
    db.add(user)
    db.flush()
    kp, secret = create_keypair(db, user, is_default=True)
    return user, kp, secret


def create_keypair(db: DBSession, user: User, *, is_default: bool = False) -> tuple[Keypair, str]:
    access, secret = generate_keypair()
    kp = Keypair(
        access_key=access,
        secret_key=secret,
        user_id=user.id,
        is_admin=user.role in (UserRole.SUPERADMIN, UserRole.ADMIN),
        is_default=is_default,
        resource_policy=DEFAULT,
    )
    db.add(kp)
    db.flush()
    return kp, secret


def email_is(email: str):
    """The condition "this user's email is ``email``": letters compare without case.

    An address is one mailbox however its letters are cased (as every mail provider and
    JupyterHub's own OAuth logins treat it), so ``Alice@Example.com`` and
    ``alice@example.com`` are one account: one to log in with, to share with, and never two
    to create. The address is stored as it was given."""
    return func.lower(User.email) == email.strip().lower()


def user_by_email(db: DBSession, email: str) -> User | None:
    """The user with this email, compared without case. A record made before that rule may
    hold two addresses that differ only in case: the exact one then wins, else neither."""
    found = db.scalars(select(User).where(email_is(email)).limit(8)).all()
    exact = [u for u in found if u.email == email]
    if exact:
        return exact[0]
    return found[0] if len(found) == 1 else None


def find_user(db: DBSession, login: str) -> User | None:
    """A user by email (without case) or by username."""
    if "@" in login:
        user = user_by_email(db, login)
        if user is not None:
            return user
    return db.scalar(select(User).where(User.username == login))


def active_project_names(db: DBSession, username: str) -> list[str]:
    """Names of the active projects ``username`` may start sessions in, sorted ([] for
    no such user)."""
    user = db.scalar(select(User).where(User.username == username))
    return sorted(p.name for p in user.projects if p.is_active) if user else []


def default_keypair(db: DBSession, user: User) -> Keypair | None:
    kps = [k for k in user.keypairs if k.is_active]
    for k in kps:
        if k.is_default:
            return k
    return kps[0] if kps else None
