"""Sharing virtual folders: a user folder's shares (who has which permission), and
Backend.AI's invitations (offered, accepted or declined) and its ``share`` /
``unshare`` of a folder with users by e-mail. The rules of who may share what are
Backend.AI's (:mod:`.vfolders`'s docstring); each function runs in one transaction.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session as DBSession

from ..common.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
)
from ..common.types import UserRole, VFolderOwnership, VFolderPermission, VFolderStatus
from ..models import (
    User,
    VFolder,
    VFolderPermissionRow,
)
from ..models.vfolder import VFolderInvitation
from . import access, responses, tenancy
from .access import Principal
from .ops import reads, writes
from .vfolders import (
    _caller,
    _get_folder,
    can_manage_folder,
    check_permission,
    host_permissions,
    is_automount,
)


def share_out(db: DBSession, row: VFolderPermissionRow) -> dict:
    user = db.get(User, row.user_id)
    return responses.VFolderShare.body(responses.With(row, email=user.email if user else None))


# -- shares --------------------------------------------------------------------------


def _share_target(db: DBSession, f: VFolder, who: str) -> User:
    user = db.get(User, who) if "@" not in who else None
    if user is None:
        user = tenancy.user_by_email(db, who)
    if user is None or user.domain_name != f.domain_name:
        raise InvalidRequest(f"no user {who!r} in domain {f.domain_name!r}")
    return user


@reads
def list_shares(db: DBSession, p: Principal, fid: str, offset: int, limit: int) -> dict:
    f = _get_folder(db, p, fid)
    access.require(f.user_id == p.user_id or p.is_superadmin or p.reads_domain,
                   "list the shares of this vfolder (its owner may)")
    stmt = select(VFolderPermissionRow).where(VFolderPermissionRow.vfolder_id == fid)
    total = db.scalar(select(func.count()).select_from(stmt.subquery()))
    rows = db.scalars(stmt.order_by(VFolderPermissionRow.created_at,
                                    VFolderPermissionRow.user_id).offset(offset).limit(limit))
    return {"items": [share_out(db, r) for r in rows], "total": total,
            "offset": offset, "limit": limit}


def _owner_shares(db: DBSession, p: Principal, f: VFolder) -> None:
    if f.ownership_type != VFolderOwnership.USER:
        raise InvalidRequest("project folders are shared through project membership")
    access.require(f.user_id == p.user_id and p.role != UserRole.MONITOR,
                   "share this vfolder (its owner may)")
    if f.status != VFolderStatus.READY:
        raise Conflict(f"vfolder {f.name!r} is {f.status}")
    if is_automount(f.name):
        raise InvalidRequest(
            f"vfolder {f.name!r} begins with '.': such folders are mounted into every session "
            "of their owner and cannot be shared (rename it without the '.' first)")
    user, kp = _caller(db, p)
    if "invite-others" not in host_permissions(db, user, f.host, None, kp):
        raise Forbidden(f"you may not share vfolders of host {f.host!r}: 'invite-others' is not "
                        "in the allowed_vfolder_hosts of your domain, projects or keypair policy")


@writes
def add_share(db: DBSession, p: Principal, fid: str, body: dict) -> dict:
    f = _get_folder(db, p, fid)
    _owner_shares(db, p, f)
    target = _share_target(db, f, body["email"])
    if target.id == f.user_id:
        raise InvalidRequest("the owner cannot share a folder with themselves")
    if db.get(VFolderPermissionRow, (f.id, target.id)) is not None:
        raise Conflict(f"vfolder {f.name!r} is already shared with {target.email!r}; "
                       "change the share's permission instead")
    row = VFolderPermissionRow(vfolder_id=f.id, user_id=target.id,
                               permission=body.get("permission", VFolderPermission.READ_ONLY))
    db.add(row)
    db.flush()
    return share_out(db, row)


def _get_share(db: DBSession, f: VFolder, who: str) -> VFolderPermissionRow:
    user = db.get(User, who) if "@" not in who else tenancy.user_by_email(db, who)
    row = db.get(VFolderPermissionRow, (f.id, user.id)) if user is not None else None
    if row is None:
        raise NotFound(f"vfolder {f.name!r} is not shared with {who!r}")
    return row


@writes
def update_share(db: DBSession, p: Principal, fid: str, who: str, body: dict) -> dict:
    f = _get_folder(db, p, fid)
    _owner_shares(db, p, f)
    row = _get_share(db, f, who)
    row.permission = body["permission"]
    db.flush()
    return share_out(db, row)


@writes
def remove_share(db: DBSession, p: Principal, fid: str, who: str) -> None:
    """The owner (or an admin of the domain) unshares; a sharee may leave."""
    f = _get_folder(db, p, fid)
    if f.ownership_type != VFolderOwnership.USER:
        raise InvalidRequest("project folders are shared through project membership")
    row = _get_share(db, f, who)
    access.require(row.user_id == p.user_id or can_manage_folder(p, f),
                   "unshare this vfolder (its owner may)")
    db.delete(row)
    db.flush()


# -- invitations and Backend.AI's share ------------------------------------------------


# Users one invite, share or unshare names: each is looked up, so the bound keeps one
# request's work (and its refusal's text) small; 20,000 names took the hub 13 s.
MAX_TARGETS = 100


def _targets(db: DBSession, f: VFolder, who: list) -> list[User]:
    if not isinstance(who, list) or not who or not all(isinstance(w, str) and w for w in who):
        raise InvalidRequest("a non-empty list of user emails (or ids) is required")
    if len(who) > MAX_TARGETS:
        raise InvalidRequest(f"at most {MAX_TARGETS} users at a time, not {len(who)}")
    out, unknown = [], []
    for w in dict.fromkeys(who):
        try:
            out.append(_share_target(db, f, w))
        except InvalidRequest:
            unknown.append(w)
    if unknown:
        raise InvalidRequest(f"no user {', '.join(map(repr, unknown))} in domain "
                             f"{f.domain_name!r}; nothing was sent")
    return out


def invitation_out(db: DBSession, inv: VFolderInvitation) -> dict:
    f = db.get(VFolder, inv.vfolder_id)
    inviter, invitee = db.get(User, inv.inviter_id), db.get(User, inv.invitee_id)
    return responses.VFolderInvitation.body(responses.With(
        inv, vfolder_name=f.name if f else None, inviter=inviter.email if inviter else None,
        invitee=invitee.email if invitee else None))


@writes
def invite(db: DBSession, p: Principal, fid: str, who: list, permission: str) -> list[dict]:
    """The owner of a user folder invites users of its domain; each invitation waits for
    its invitee. All or nothing: an unknown user, the owner, someone the folder is already
    shared with or invited is a refusal, and no invitation is made."""
    f = _get_folder(db, p, fid)
    _owner_shares(db, p, f)
    check_permission(permission)
    targets = _targets(db, f, who)
    for t in targets:
        if t.id == f.user_id:
            raise InvalidRequest("the owner cannot invite themselves")
        if db.get(VFolderPermissionRow, (f.id, t.id)) is not None:
            raise Conflict(f"vfolder {f.name!r} is already shared with {t.email!r}")
        if db.scalar(select(VFolderInvitation.id).where(
                VFolderInvitation.vfolder_id == f.id, VFolderInvitation.invitee_id == t.id,
                VFolderInvitation.state == "pending")):
            raise Conflict(f"{t.email!r} already has a pending invitation to vfolder {f.name!r}")
    rows = [VFolderInvitation(vfolder_id=f.id, inviter_id=p.user_id, invitee_id=t.id,
                              permission=permission) for t in targets]
    db.add_all(rows)
    db.flush()
    return [invitation_out(db, r) for r in rows]


@reads
def list_invitations(db: DBSession, p: Principal, *, sent: bool = False) -> list[dict]:
    """The caller's pending invitations: received (or ``sent``)."""
    who = VFolderInvitation.inviter_id if sent else VFolderInvitation.invitee_id
    rows = db.scalars(select(VFolderInvitation).where(
        who == p.user_id, VFolderInvitation.state == "pending")
        .order_by(VFolderInvitation.created_at, VFolderInvitation.id))
    return [invitation_out(db, r) for r in rows]


def _pending(db: DBSession, p: Principal, inv_id: str, *, inviter_too: bool) -> VFolderInvitation:
    inv = db.get(VFolderInvitation, inv_id) if isinstance(inv_id, str) else None
    mine = inv is not None and (inv.invitee_id == p.user_id
                                or (inviter_too and inv.inviter_id == p.user_id))
    if not mine:
        raise NotFound(f"no invitation {inv_id!r} for you")
    access.require(p.role != UserRole.MONITOR, "answer vfolder invitations (a monitor changes nothing)")
    if inv.state != "pending":
        raise Conflict(f"invitation {inv_id!r} is {inv.state}")
    return inv


@writes
def accept_invitation(db: DBSession, p: Principal, inv_id: str) -> dict:
    """The invitee accepts: the folder is shared with them with the invitation's permission."""
    inv = _pending(db, p, inv_id, inviter_too=False)
    f = db.get(VFolder, inv.vfolder_id)
    if f is None or f.status != VFolderStatus.READY:
        raise Conflict(f"vfolder {f.name if f else inv.vfolder_id!r} is "
                       f"{f.status if f else 'gone'}")
    if db.get(VFolderPermissionRow, (f.id, p.user_id)) is None:
        db.add(VFolderPermissionRow(vfolder_id=f.id, user_id=p.user_id,
                                    permission=inv.permission))
    inv.state, inv.modified_at = "accepted", dt.datetime.now(dt.UTC)
    db.flush()
    return invitation_out(db, inv)


@writes
def decline_invitation(db: DBSession, p: Principal, inv_id: str) -> dict:
    """The invitee declines (rejected), or the inviter withdraws it (canceled)."""
    inv = _pending(db, p, inv_id, inviter_too=True)
    inv.state = "rejected" if inv.invitee_id == p.user_id else "canceled"
    inv.modified_at = dt.datetime.now(dt.UTC)
    db.flush()
    return invitation_out(db, inv)


@writes
def share_with(db: DBSession, p: Principal, fid: str, who: list, permission: str) -> list[str]:
    """Backend.AI's ``vfolder share``: at once, no invitation. A project folder gives
    members of its project their own permission (admins of its domain may); a user
    folder is shared by its owner (a share that exists takes the new permission).
    All or nothing; returns the emails."""
    f = _get_folder(db, p, fid)
    check_permission(permission)
    if f.ownership_type == VFolderOwnership.PROJECT:
        access.require(can_manage_folder(p, f), "share this project vfolder (admins of its "
                                                "domain may)")
        if f.status != VFolderStatus.READY:
            raise Conflict(f"vfolder {f.name!r} is {f.status}")
        targets = _targets(db, f, who)
        outside = [t.email for t in targets if not any(pr.id == f.project_id for pr in t.projects)]
        if outside:
            raise InvalidRequest(f"{', '.join(map(repr, outside))} not in the vfolder's project: "
                                 "a project folder is shared with members of its project")
    else:
        _owner_shares(db, p, f)
        targets = _targets(db, f, who)
        if any(t.id == f.user_id for t in targets):
            raise InvalidRequest("the owner cannot share a folder with themselves")
    for t in targets:
        row = db.get(VFolderPermissionRow, (f.id, t.id))
        if row is None:
            db.add(VFolderPermissionRow(vfolder_id=f.id, user_id=t.id, permission=permission))
        else:
            row.permission = permission
    db.flush()
    return [t.email for t in targets]


@writes
def unshare_with(db: DBSession, p: Principal, fid: str, who: list) -> list[str]:
    """Backend.AI's ``vfolder unshare``: ends the shares of a user folder (its owner, or an
    admin of its domain), or a project folder's per-member permissions (admins of its
    domain; the members keep the folder's own permission). All or nothing."""
    f = _get_folder(db, p, fid)
    if f.ownership_type == VFolderOwnership.PROJECT:
        access.require(can_manage_folder(p, f), "unshare this project vfolder (admins of "
                                                "its domain may)")
    else:
        access.require(can_manage_folder(p, f), "unshare this vfolder (its owner may)")
    targets = _targets(db, f, who)
    rows = []
    for t in targets:
        row = db.get(VFolderPermissionRow, (f.id, t.id))
        if row is None:
            raise NotFound(f"vfolder {f.name!r} is not shared with {t.email!r}")
        rows.append(row)
    for row in rows:
        db.delete(row)
    db.flush()
    return [t.email for t in targets]

