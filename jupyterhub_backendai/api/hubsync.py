"""Admin changes that JupyterHub mirrors, in one place for every API that makes them.

The admin REST API's handlers (``api/handlers.py``) and Backend.AI's GraphQL mutations
(``api/compat/gql.py``, ``POST /admin/gql``) make them the same way, in two halves:

- a **record** half: the operations of :mod:`...manager.apiviews` (``update_domain``,
  ``create_project``, ``update_user``, ...; ``await manager.ops.<name>(...)``), the
  admin service with the caller's principal in one transaction; each answers
  ``(result, HubChange)``, what the hub must do once the transaction committed. A
  refusal raises before anything is recorded or changed.
- a **hub** half (:func:`apply`, here), run after the commit, with the request's
  handler: JupyterHub groups follow projects (created, renamed, deleted, members added
  and removed), admin flags follow superadmins, a deactivation ends the live sessions
  it concerns and the users' hub access (servers, tokens, cookies), a deleted user's
  hub account goes.

So a project renamed through ``backend.ai admin group update`` and one renamed with
``PATCH /projects/{id}`` end the same way, by the same code.
"""

from __future__ import annotations

from jupyterhub.utils import new_token

from ..common.types import SessionStatus
from ..manager.apiviews import HubChange

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


__all__ = ["HubChange", "apply", "end_sessions", "end_hub_access"]
