"""Restarting a session, one way for every front end: the admin API's ``POST
/sessions/{id}/restart``, Backend.AI's ``session restart`` (``PATCH /session/{ref}``) and
the console's Restart button (which calls the admin API).

A session that is a JupyterHub server is stopped and started again through the hub, with
the options JupyterHub keeps for it (its spawner enqueues the same request again, and
JupyterHub's own record of the server stays right). Any other session, interactive or
batch, made through either API, is restarted by the manager
(:meth:`..manager.sessions.Sessions.restart`): queued again under its name with the
request it was made with. Either way the caller gets the new session's id (Backend.AI's
client waits until it started); the old one ends TERMINATED ("restarted"). Only a running
session is restarted.
"""

from __future__ import annotations

import asyncio
import time

from ..common.errors import Conflict
from ..common.types import SessionStatus


async def hub_server(handler, sid: str):
    """(user, server name, spawner) of the JupyterHub server that is the interactive
    session ``sid``, or None. ``handler`` is an API handler of the hub's."""
    sess = await handler.manager.ops.get_session(handler.principal, sid)
    if sess["type"] != "interactive":
        return None
    username = await handler.manager.ops.username_of(sess["user_id"])
    user = handler.find_user(username)
    if user is None:
        return None
    for name, spawner in list(user.spawners.items()):
        if getattr(spawner, "session_id", None) == sid and (spawner.active or spawner.ready):
            return user, name, spawner
    return None


async def restart(handler, sid: str) -> str:
    """Restart the running session ``sid`` (the caller has checked it may stop it);
    return the new session's id (queued; a caller that waits for its start uses
    ``compat.sessions.wait_started``)."""
    manager = handler.manager
    sess = await manager.ops.get_session(handler.principal, sid)
    found = await hub_server(handler, sid)
    if sess["status"] != SessionStatus.RUNNING:
        raise Conflict(f"session {sess['name']!r} is {sess['status']}: only a running "
                       "session is restarted (a waiting one starts as it is; for an ended "
                       "one, create a new session with the same options)")
    if found is None:
        new = await manager.restart_session(sid)
    else:
        user, name, spawner = found
        options = dict(spawner.user_options or {})
        await handler.stop_single_user(user, name)
        await handler.spawn_single_user(user, name, name, options=options)
        spawner = user.spawners[name]  # (JupyterHub's, after the start: not the stopped one's)
        deadline = time.monotonic() + 60
        while spawner.session_id in (None, sid):
            if not (spawner.pending or spawner.ready) or time.monotonic() > deadline:
                raise Conflict(f"the JupyterHub server {name!r} did not start again; see the "
                               "hub")
            await asyncio.sleep(0.1)
        new = spawner.session_id
    return new
