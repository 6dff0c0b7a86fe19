"""Issue 22, "credentials bound to current access": a session's JupyterHub API token
(``JUPYTERHUB_API_TOKEN`` in the session) dies with the session, and with its user.

A real hub (local backend, SQLite and PostgreSQL): the token is read out of the running
server's environment, as code in the session (or anyone it leaked to) would; the session
is ended behind JupyterHub's back (the admin API's ``DELETE /sessions/<id>``), and the
token is refused within seconds, not at JupyterHub's next poll (30 s), and cannot open
the next server of the same name. Deactivating the user ends it too.
"""

from __future__ import annotations

import glob
import shutil
import time

import requests

from .api_world import new_user, superadmin
from .hub import Hub


def _server_token(username: str, server: str) -> str:
    """JUPYTERHUB_API_TOKEN of the running server, from its process's environment."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for path in glob.glob("/proc/[0-9]*/environ"):
            try:
                with open(path, "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            except OSError:
                continue
            if (env.get(b"JUPYTERHUB_USER") == username.encode()
                    and env.get(b"JUPYTERHUB_SERVER_NAME") == server.encode()
                    and env.get(b"JUPYTERHUB_API_TOKEN")):
                return env[b"JUPYTERHUB_API_TOKEN"].decode()
        time.sleep(0.2)
    raise AssertionError(f"no process of {username}/{server} found")


def _whoami(hub: Hub, token: str) -> int:
    return requests.get(f"{hub.base}/hub/api/user", timeout=30,
                        headers={"Authorization": f"token {token}"}).status_code


def _refused_within(hub: Hub, token: str, seconds: float) -> float:
    t0 = time.monotonic()
    while (code := _whoami(hub, token)) == 200:
        assert time.monotonic() - t0 < seconds, f"still accepted after {seconds} s"
        time.sleep(0.2)
    assert code in (401, 403), code
    return time.monotonic() - t0


def test_a_sessions_api_token_dies_with_the_session_and_the_user(db_url):
    hub = Hub(db_url=db_url, backend="local").start()
    try:
        sa = superadmin(hub)
        u = new_user(sa)
        name = u["username"]
        r = hub.spawn(name, "s1", token=u["token"])
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(name, "s1", token=u["token"])
        stolen = _server_token(name, "s1")
        assert _whoami(hub, stolen) == 200  # the legitimate use: the server's identity

        # The session ends behind JupyterHub's back: its token goes within seconds.
        [sess] = [s for s in u["client"].ok("GET", "/sessions")["items"]
                  if s["status"] == "RUNNING"]
        u["client"].ok("DELETE", f"/sessions/{sess['id']}")
        took = _refused_within(hub, stolen, 10)
        assert took < 10
        # The user's own token is untouched; the next server of the same name gets a
        # token of its own, and the stolen one does not open it.
        assert _whoami(hub, u["token"]) == 200
        # JupyterHub learns it at once too (the hub polls that server now), not at its
        # next periodic poll (c.Spawner.poll_interval, 30 s).
        deadline = time.monotonic() + 10
        while hub.server_model(name, "s1", token=u["token"]) is not None:
            assert time.monotonic() < deadline, "JupyterHub still lists the ended server"
            time.sleep(0.2)
        r = hub.spawn(name, "s1", token=u["token"])
        assert r.status_code in (201, 202), r.text
        model = hub.wait_ready(name, "s1", token=u["token"])
        fresh = _server_token(name, "s1")
        assert fresh != stolen and _whoami(hub, fresh) == 200
        r = requests.get(f"{hub.base}{model['url']}api/status", timeout=30,
                         headers={"Authorization": f"token {stolen}"}, allow_redirects=False)
        assert r.status_code in (302, 401, 403), r.status_code

        # Deactivating the user ends the running server's token too.
        sa.ok("PATCH", f"/users/{u['id']}", json={"status": "inactive"})
        _refused_within(hub, fresh, 10)
    finally:
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)
