"""The admin REST API's operations that are not :mod:`.admin`'s own.

- **The record half of the changes JupyterHub mirrors** (``update_domain``,
  ``create_project``, ``update_user``, ...): the admin service (:mod:`.admin`) with the
  caller's principal, in one transaction; each answers ``(result, HubChange)``, what the
  hub must do once the transaction committed. A refusal raises before anything is
  recorded or changed. The hub half (``api/hubsync.py``'s ``apply``) runs after the
  commit with the request's handler; the admin REST API's handlers and Backend.AI's
  GraphQL mutations (``api/compat/gql.py``) call the same operations, so a project
  renamed through ``backend.ai admin group update`` and one renamed with
  ``PATCH /projects/{id}`` end the same way.
- **Session views** the REST handlers turn into responses: a session's service ports
  and the key of its sshd.

Nothing here imports the front ends (``api/``, ``pages/``, the spawner): they call
these by name, ``await manager.ops.<name>(...)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..common.errors import Forbidden, NotFound
from ..common.types import UserRole, UserStatus
from ..models import Keypair, Project, User
from . import admin, responses
from .ops import reads, writes


@dataclass
class HubChange:
    """What JupyterHub must do after a committed change (``api/hubsync.py`` makes it)."""

    add: dict[str, list[str]] = field(default_factory=dict)  # group -> usernames
    remove: dict[str, list[str]] = field(default_factory=dict)
    rename: tuple[str, str] | None = None
    delete: str | None = None  # a group
    admin: dict[str, bool] = field(default_factory=dict)  # username -> is a hub admin
    # (admin.cut_off's keyword arguments, the reason recorded on the ended sessions)
    cut_off: list[tuple[dict, str]] = field(default_factory=list)
    drop_accounts: list[str] = field(default_factory=list)  # usernames

    def __bool__(self) -> bool:
        return bool(self.add or self.remove or self.rename or self.delete or self.admin
                    or self.cut_off or self.drop_accounts)


# -- the record half of the changes JupyterHub mirrors: one transaction each -------------


@writes
def update_domain(db, p, name: str, body: dict) -> tuple[dict, HubChange]:
    out = admin.update_domain(db, p, name, body)
    ch = HubChange()
    if body.get("is_active") is False:
        ch.cut_off.append(({"domain": name}, f"ended: the domain {name!r} was deactivated"))
    return out, ch


@writes
def create_project(db, p, body: dict) -> tuple[dict, HubChange]:
    """A project and, with ``member_ids``, its first members: one transaction (a member
    refused leaves no project)."""
    body = dict(body)
    members = body.pop("member_ids", None) or []
    out = admin.create_project(db, p, body)
    added = admin.add_members(db, p, out["id"], members)["added"] if members else []
    return out, HubChange(add={admin.group_name(out["domain_name"], out["name"]): added})


@writes
def update_project(db, p, pid: str, body: dict) -> tuple[dict, HubChange]:
    out, old_group = admin.update_project(db, p, pid, body)
    ch = HubChange(rename=(old_group, admin.group_name(out["domain_name"], out["name"])))
    if body.get("is_active") is False:
        ch.cut_off.append(({"project": out["id"]},
                           f"ended: the project {out['name']!r} was deactivated"))
    return out, ch


@writes
def delete_project(db, p, pid: str) -> tuple[None, HubChange]:
    return None, HubChange(delete=admin.delete_project(db, p, pid))


@writes
def add_members(db, p, pid: str, user_ids: list[str]) -> tuple[dict, HubChange]:
    out = admin.add_members(db, p, pid, user_ids)
    return out, HubChange(add={out["group"]: out["added"]})


@writes
def remove_members(db, p, pid: str, user_ids: list[str]) -> tuple[None, HubChange]:
    """All or nothing (one transaction): a user who is not a member refuses."""
    ch = HubChange()
    for uid in dict.fromkeys(user_ids):
        group, username = admin.remove_member(db, p, pid, uid)
        ch.remove.setdefault(group, []).append(username)
    return None, ch


@writes
def update_user(db, p, uid: str, body: dict) -> tuple[dict, HubChange]:
    out, old_groups = admin.update_user(db, p, uid, body)
    ch = HubChange()
    if out["status"] != UserStatus.ACTIVE and "status" in body:
        ch.cut_off.append(({"user": uid},
                           f"ended: the account {out['username']!r} is {out['status']}"))
    if "role" in body:
        ch.admin[out["username"]] = out["role"] == UserRole.SUPERADMIN
    if "project_ids" in body or "domain_name" in body:
        now = {admin.hub_group(db.get(Project, pid)) for pid in out["project_ids"]}
        ch.add = {g: [out["username"]] for g in sorted(now - set(old_groups))}
        ch.remove = {g: [out["username"]] for g in sorted(set(old_groups) - now)}
    return out, ch


@writes
def delete_user(db, p, uid: str) -> tuple[None, HubChange]:
    # Identity by id: the hub's account goes too (servers, tokens, cookies), so a new
    # user of the same name, in any domain, starts with nothing.
    username, _groups = admin.delete_user(db, p, uid)
    return None, HubChange(drop_accounts=[username])


# -- sessions ----------------------------------------------------------------------------


def _main_kernel(s):
    return next((k for k in s.kernels if k.cluster_role == "main"), None)


@reads
def session_service_ports(db, p, sid: str) -> dict:
    """What ``GET /sessions/{id}/service-ports`` needs from the record (visibility as for
    ``GET /sessions/{id}``)."""
    s = admin._get_session(db, p, sid)
    owner = db.get(User, s.user_id)
    main = _main_kernel(s)
    return {
        "session_id": s.id,
        "status": s.status,
        "type": s.session_type,
        "username": owner.username if owner else None,
        "service_prefix": s.service_prefix,
        "ports": list(main.service_ports or []) if main is not None else [],
        "host": main.kernel_host if main is not None else None,
    }


@reads
def session_ssh_key(db, p, sid: str) -> dict:
    """Issue 12: the key of a session's published sshd, for its owner only (others who
    may see the session, admins included, get 403; the rest 404 as for the session)."""
    from . import sshkeys

    s = admin._get_session(db, p, sid)
    if s.user_id != p.user_id:
        raise Forbidden("only the session's owner gets its SSH key")
    main = _main_kernel(s)
    sshd = next((sp for sp in (main.service_ports or []) if sp.get("name") == "sshd"
                 and sp.get("host_port")), None) if main is not None else None
    kp = db.get(Keypair, s.access_key)
    if sshd is None or kp is None:
        raise NotFound(f"session {sid} has no SSH port (its resource group "
                       f"{s.resource_group!r} does not offer SSH, or it is not running)")
    return responses.SessionSSHKey.body({
        "session_id": s.id, "access_key": kp.access_key, "user": sshkeys.SSH_USER,
        "host": main.kernel_host, "port": sshd["host_port"],
        "public_key": sshkeys.public_key(kp.secret_key, kp.access_key),
        "private_key": sshkeys.private_key(kp.secret_key),
    })


__all__ = ["HubChange", "update_domain", "create_project", "update_project", "delete_project",
           "add_members", "remove_members", "update_user", "delete_user",
           "session_service_ports", "session_ssh_key"]
