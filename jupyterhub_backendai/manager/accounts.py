"""What the authenticator asks of the record (operations, see manager/ops.py)."""

from __future__ import annotations

import secrets

from sqlalchemy import select

from ..common.types import UserRole, UserStatus
from ..models import Domain, User
from . import tenancy
from .admin import hub_group
from .ops import reads, writes

#: Stored instead of a password hash: bcrypt rejects it, so no password matches.
NO_PASSWORD = "!"


def _hub_groups(user: User) -> list[str]:
    return sorted(hub_group(p) for p in user.projects if p.is_active)


@reads
def hub_account(db, name: str) -> dict | None:
    """The hub's view of user ``name`` now (admin flag, project groups), or None when
    the user is gone, not active, or in an inactive domain."""
    u = db.scalar(select(User).where(User.username == name))
    if u is None or u.status != UserStatus.ACTIVE:
        return None
    domain = db.get(Domain, u.domain_name)
    if domain is None or not domain.is_active:
        return None
    return {"name": name, "admin": u.role == UserRole.SUPERADMIN, "groups": _hub_groups(u)}


@reads
def login_record(db, login: str) -> dict | None:
    """What a login by email or username needs: the hash, the state, the hub's view."""
    user = tenancy.find_user(db, login)
    if user is None:
        return None
    domain = db.get(Domain, user.domain_name)
    return {
        "hash": user.password,
        "id": user.id,
        "name": user.username,
        "status": user.status,
        "domain_active": bool(domain and domain.is_active),
        "admin": user.role == UserRole.SUPERADMIN,
        "groups": _hub_groups(user),
        "auth_state": {"email": user.email, "role": user.role, "domain": user.domain_name},
    }


@writes
def add_hub_user(db, name: str, email: str) -> bool:
    """JupyterHub's "Add Users": a Backend.AI user of the default domain and project
    without a usable password; False when the record has the user already."""
    if db.scalar(select(User).where(User.username == name)):
        return False
    if not tenancy.USERNAME_RE.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a valid Backend.AI user name (lowercase letters, digits, "
            "'.', '_', '-')")
    if tenancy.user_by_email(db, email) is not None:
        raise ValueError(f"a Backend.AI user with email {email!r} exists")
    u, _kp, _secret = tenancy.create_user(
        db, email=email, password=secrets.token_urlsafe(16), username=name)
    u.password = NO_PASSWORD  # no bcrypt hash: nothing logs in until one is set
    u.need_password_change = True
    return True


@reads
def password_record(db, username: str) -> dict | None:
    """The id and password hash of user ``username`` (the password page checks the
    current password on the login pool, outside any transaction), or None."""
    u = db.scalar(select(User).where(User.username == username))
    return None if u is None else {"id": u.id, "hash": u.password}


@writes
def set_password(db, username: str, old_hash: str, new_hash: str) -> str:
    """Store ``new_hash`` as the user's password if their hash is still ``old_hash``
    (whose password the caller checked): "" when done, else why nothing was changed."""
    user = db.scalar(select(User).where(User.username == username).with_for_update())
    if user is None:
        return "There is no Backend.AI account for this login, so there is no password to change."
    if user.password != old_hash:
        return "The password was changed meanwhile. Nothing was changed."
    user.password = new_hash
    user.need_password_change = False
    return ""


@writes
def change_password(db, username: str, current: str, new: str) -> str:
    """A user's own password change: "" when done, else why nothing was changed.
    Hashes inside the transaction on the shared pool, unthrottled: for scripts and tests
    only; the password page uses :func:`password_record` and :func:`set_password`."""
    user = db.scalar(select(User).where(User.username == username).with_for_update())
    if user is None:
        return "There is no Backend.AI account for this login, so there is no password to change."
    if not tenancy.check_password(current, user.password):
        return "The current password is wrong. Nothing was changed."
    if tenancy.check_password(new, user.password):
        return "The new password is the same as the current one. Nothing was changed."
    user.password = tenancy.hash_password(new)
    user.need_password_change = False
    return ""


@reads
def username_of(db, user_id: str) -> str:
    """The username of user ``user_id``."""
    return db.get(User, user_id).username
