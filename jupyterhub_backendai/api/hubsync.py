"""Admin changes that JupyterHub mirrors, in one place for every API that makes them.

The admin REST API's handlers (``api/handlers.py``) and Backend.AI's GraphQL mutations
(``api/compat/gql.py``, ``POST /admin/gql``) call the same functions here. Each has two
halves:

- a **record** half (``create_project``, ``update_user``, ...): the admin service
  (``manager/admin.py``) with the caller's principal, run in the caller's database
  transaction; it answers ``(result, HubChange)``, what the hub must do once the
  transaction committed. A refusal raises before anything is recorded or changed.
- a **hub** half (:func:`apply`), run after the commit, with the request's handler:
  JupyterHub groups follow projects (created, renamed, deleted, members added and
  removed), admin flags follow superadmins, a deactivation ends the live sessions it
  concerns and the users' hub access (servers, tokens, cookies), a deleted user's hub
  account goes.

So a project renamed through ``backend.ai admin group update`` and one renamed with
``PATCH /projects/{id}`` end the same way, by the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jupyterhub.utils import new_token

from ..common.types import SessionStatus, UserRole, UserStatus
from ..manager import admin
from ..manager.ops import writes
from ..models import Project


@dataclass
class HubChange:
    """What JupyterHub must do after a committed change (see the module's words)."""

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


# -- the record half: in the caller's transaction --------------------------------------


@writes
def update_domain(db, p, name: str, body: dict) -> tuple[dict, HubChange]:
    out = admin.update_domain(db, p, name, body)
    ch = HubChange()
    if body.get("is_active") is False:
        ch.cut_off.append(({"domain": name}, f"ended: the domain {name!r} was deactivated"))
    return out, ch


@writes
def create_project(db, p, body: dict) -> tuple[dict, HubChange]:
    out = admin.create_project(db, p, body)
    return out, HubChange(add={admin.group_name(out["domain_name"], out["name"]): []})


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
    """All or nothing (the caller's transaction): a user who is not a member refuses."""
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


# -- the hub half: after the commit ----------------------------------------------------


async def apply(h, ch: HubChange) -> None:
    """Make ``ch`` in JupyterHub; ``h`` is the request's handler (an ``APIBase``)."""
    if ch.add or ch.remove or ch.rename or ch.delete:
        h.hub_groups(add=ch.add, remove=ch.remove, rename=ch.rename, delete=ch.delete)
    for username, is_admin in ch.admin.items():
        h.hub_admin(username, is_admin)
    for kw, reason in ch.cut_off:
        sids, names = await h.manager.ops.cut_off(**kw)
        await end_sessions(h, sids, reason)
        await end_hub_access(h, names)
    for username in ch.drop_accounts:
        await end_hub_access(h, [username])
        user = h.find_user(username)
        if user is not None:
            await user.delete_spawners()
            h.users.delete(user)


async def end_sessions(h, sids: list[str], reason: str) -> None:
    """End live sessions at once, their reason recorded."""
    for sid in sids:
        await h.manager.destroy_session(sid, SessionStatus.TERMINATED, reason)


async def end_hub_access(h, usernames: list[str]) -> None:
    """Stop the users' servers; revoke their tokens; a new cookie id makes every cookie
    of theirs invalid (JupyterHub's cookies carry it)."""
    for name in usernames:
        user = h.find_user(name)
        if user is None:
            continue
        for spawner in list(user.spawners.values()):
            if spawner.active or spawner.ready:
                try:
                    await h.stop_single_user(user, spawner.name)
                except Exception:
                    h.log.exception("could not stop %s's server %r", name, spawner.name)
        for token in list(user.orm_user.api_tokens):
            h.db.delete(token)
        user.orm_user.cookie_id = new_token()
        h.db.commit()


__all__ = ["HubChange", "apply", "update_domain", "create_project", "update_project",
           "delete_project", "add_members", "remove_members", "update_user", "delete_user"]
