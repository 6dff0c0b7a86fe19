"""A server's tokens die with its session (issue 22, "credentials bound to current access").

JupyterHub gives every server an API token (``JUPYTERHUB_API_TOKEN`` in the session)
and, through the server's OAuth client, a token to every visitor it lets in. JupyterHub
deletes both when *it* stops the server, or when its poll (``c.Spawner.poll_interval``,
30 s) finds the server gone. A session ends behind JupyterHub's back too (Backend.AI's
``DELETE /session``, the admin API, an idle or lifetime limit, an admin ending a
deactivated project's sessions): until that poll, a token copied out of the session
still identified its user and still opened the *next* server of the same name (its
scopes name the server, not the session).

:func:`watch` (started with the hub's front gate, :mod:`.hubgate`) checks every
running server's session every :data:`INTERVAL` seconds (the manager's reflector: one
query for all of them) and, when a session has ended, deletes the server's API token
and its visitors' OAuth tokens at once, and has JupyterHub poll that server now (so it
cleans the server up at once, not at its next periodic poll).
"""

from __future__ import annotations

import asyncio
import logging

#: Seconds between checks: the longest a server's token outlives its session (plus the
#: reflector's own age bound, ``status_poll_interval``).
INTERVAL = 1.0

log = logging.getLogger(__name__)


def revoke_server_tokens(db, spawner) -> int:
    """Delete ``spawner``'s API token and the OAuth tokens its visitors hold (JupyterHub's
    ORM, the hub's database); how many went."""
    from jupyterhub import orm

    gone = 0
    token = getattr(spawner, "api_token", None)
    if token:
        row = orm.APIToken.find(db, token)
        if row is not None:
            db.delete(row)
            gone += 1
    client_id = getattr(spawner, "oauth_client_id", None)
    if client_id:
        for row in db.query(orm.APIToken).filter_by(client_id=client_id):
            db.delete(row)
            gone += 1
    if gone:
        db.commit()
    return gone


async def sweep(hub, manager, done: set) -> None:
    """One pass: the servers JupyterHub still thinks run whose session has ended."""
    for user in list(hub.users.values()):
        for spawner in list(user.spawners.values()):
            sid = getattr(spawner, "session_id", None)
            if not sid or spawner.server is None or (sid, spawner.api_token) in done:
                continue
            state = await manager.reflector.state(sid)
            if state is not None and not state.dead:
                continue
            n = revoke_server_tokens(hub.db, spawner)
            done.add((sid, spawner.api_token))
            if n:
                log.info("session %s of %s ended: revoked its server's %d token(s)", sid,
                         user.name, n)
            if not spawner.pending:
                # And JupyterHub learns it now, not at its next poll (poll_interval, 30 s):
                # its poll callbacks clean the server up as they do after any poll.
                asyncio.ensure_future(spawner.poll_and_notify())


async def watch(hub) -> None:
    """Run :func:`sweep` every INTERVAL seconds for as long as the hub runs."""
    manager = getattr(getattr(hub, "authenticator", None), "manager", None)
    if manager is None:
        return
    await manager.ready()
    done: set = set()
    while True:
        try:
            await sweep(hub, manager, done)
        except asyncio.CancelledError:
            raise
        except Exception:  # a database hiccup: the next pass tries again
            log.warning("could not check the servers' sessions", exc_info=True)
            hub.db.rollback()
        if len(done) > 10_000:
            done.clear()
        await asyncio.sleep(INTERVAL)


def start(hub) -> None:
    """Start :func:`watch` on the hub's event loop (once)."""
    if getattr(hub, "_backendai_token_watch", None) is not None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = asyncio.get_event_loop()
    hub._backendai_token_watch = loop.create_task(watch(hub))
