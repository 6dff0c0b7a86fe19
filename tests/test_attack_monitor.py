"""Issue 10, row 9: a monitor never writes, whatever path they take.

The attack: a monitor, a member of a project with a read-write project folder, starts a
server through JupyterHub's REST API with the folder mounted (``user_options``
``{"mounts": [folder]}``) and writes into it through the Jupyter server's contents API
and from a kernel. Both now fail: the one place that decides (``access.mount_permission``,
asked by every path that mounts a folder) mounts it read-only for a monitor, so Docker
binds it with RW=false, and the storage volume is unchanged. An ordinary member of the
same project, spawning the same way, writes into the same folder (the control case).

Performed against a real hub (subprocess, CHP, Docker backend, the kernel image) on
SQLite and PostgreSQL, one hub per database for the module. That hub runs without home
folders (``--BackendAISpawner.home_folder=``): with the packaged default a monitor's
own home at /home/work is mounted read-only too, and their Jupyter server cannot start
at all (see ``test_home_folder_server_starts_and_is_bound_as_recorded``, a known failure).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
import requests

from .api_world import new_user, superadmin
from .conftest import shutdown_hub
from .hub import Hub
from .kernel_client import execute

FOLDER = "shared"
SEED = "seed.txt"
SEED_TEXT = "written by the project's setup\n"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def hub(request, tmp_path_factory, docker_image):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('monitor')}/backendai.sqlite"
    else:
        url = request.getfixturevalue("postgres").new_database("t_" + uuid.uuid4().hex[:12])
    hub = Hub(db_url=url, backend="docker", extra_args=["--BackendAISpawner.home_folder="]).start()
    yield hub
    shutdown_hub(hub)


@pytest.fixture(scope="module")
def world(hub) -> dict:
    """A project with a read-write project folder (one seed file in it), a monitor and an
    ordinary user, both members, made through the admin API."""
    sa = superadmin(hub)
    project = f"p-{uuid.uuid4().hex[:8]}"
    pid = sa.ok("POST", "/projects", json={"name": project, "domain_name": "default"})["id"]
    folder = sa.ok("POST", "/vfolders", json={"name": FOLDER, "project": pid,
                                              "permission": "rw"})
    assert (folder["ownership_type"], folder["permission"], folder["status"]) == (
        "project", "rw", "ready")
    path = os.path.join(hub.volume_path, *folder["quota_scope_id"].split(":"), folder["id"])
    assert os.path.isdir(path), path
    monitor = new_user(sa, role="monitor", projects=[pid])
    writer = new_user(sa, role="user", projects=[pid])
    # The seed goes in as an ordinary member writes files: through the admin API.
    writer["client"].ok("PUT", f"/vfolders/{folder['id']}/upload", status=201,
                        params={"path": SEED}, data=SEED_TEXT.encode(),
                        headers={"Content-Type": "application/octet-stream"})
    return {"sa": sa, "project": project, "folder": folder, "path": path,
            "monitor": monitor, "writer": writer}


def tree(path: str) -> dict[str, bytes | None]:
    """Every entry under ``path``: files with their bytes, directories as None."""
    out: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(path):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), path)] = None
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), path)] = fh.read()
    return out


def spawn(hub: Hub, user: dict, server: str, project: str) -> dict:
    """Start ``server`` the way the attack did: JupyterHub's REST API with the user's own
    token and ``user_options`` naming the project folder."""
    r = hub.spawn(user["username"], server, {"project": project, "mounts": [FOLDER]},
                  token=user["token"])
    assert r.status_code in (201, 202), r.text
    return hub.wait_ready(user["username"], server, token=user["token"])


def contents_put(hub: Hub, model: dict, token: str, path: str, text: str) -> requests.Response:
    return requests.put(f"{hub.base}{model['url']}api/contents/{path}",
                        json={"type": "file", "format": "text", "content": text},
                        headers={"Authorization": f"token {token}"}, timeout=60)


def binds(hub: Hub, owner: str) -> dict[str, bool]:
    """Destination -> RW of the bind mounts of ``owner``'s one kernel container."""
    ids = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=ai.backend.agent-id={hub.agent_id}",
         "--filter", f"label=ai.backend.owner={owner}"],
        capture_output=True, text=True, check=True).stdout.split()
    assert len(ids) == 1, ids
    out = subprocess.run(["docker", "inspect", "-f", "{{json .Mounts}}", ids[0]],
                         capture_output=True, text=True, check=True).stdout
    return {m["Destination"]: m["RW"] for m in json.loads(out) if m["Type"] == "bind"}


# A kernel's write attempt: prints OK, or the error's class and strerror.
WRITE = """
try:
    with open({path!r}, 'w') as f:
        f.write({text!r})
    print('OK')
except OSError as e:
    print(type(e).__name__, e.strerror)
"""


def kernel_write(hub: Hub, model: dict, token: str, path: str, text: str) -> str:
    return execute(hub.base, model["url"], token, WRITE.format(path=path, text=text)).strip()


def test_ordinary_member_writes_into_the_project_folder(hub, world):
    """The control case: the same spawn by a user (not a monitor) mounts the folder
    read-write, and both writes reach the storage volume."""
    u, path = world["writer"], world["path"]
    model = spawn(hub, u, "w", world["project"])
    try:
        assert binds(hub, u["username"])[f"/home/work/{FOLDER}"] is True
        r = contents_put(hub, model, u["token"], f"{FOLDER}/x.txt", "from the contents API")
        assert r.status_code == 201, r.text
        assert kernel_write(hub, model, u["token"], f"/home/work/{FOLDER}/y.txt",
                            "from a kernel") == "OK"
    finally:
        hub.stop_server(u["username"], "w", token=u["token"])
    after = tree(path)
    assert (after[SEED], after["x.txt"], after["y.txt"]) == (
        SEED_TEXT.encode(), b"from the contents API", b"from a kernel")


def test_monitor_cannot_write_into_a_rw_project_folder(hub, world):
    m, path, fid = world["monitor"], world["path"], world["folder"]["id"]
    before = tree(path)
    assert before[SEED] == SEED_TEXT.encode()
    # The folder lists the monitor's permission as read-only ...
    assert m["client"].ok("GET", f"/vfolders/{fid}")["my_permission"] == "ro"
    # ... and the admin API refuses their writes (it did before the fix too).
    r = m["client"]("PUT", f"/vfolders/{fid}/upload", params={"path": "z.txt"}, data=b"z",
                    headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 403, r.text
    assert "monitors read" in r.json()["detail"]

    # The attack: a spawn through JupyterHub's REST API with the folder mounted. It is
    # accepted (a monitor may read the folder) ...
    model = spawn(hub, m, "m", world["project"])
    try:
        # ... but the bind is read-only in the container.
        mounts = binds(hub, m["username"])
        assert mounts[f"/home/work/{FOLDER}"] is False
        # The contents API: a new file, and over the existing one.
        for name in ("x.txt", SEED):
            r = contents_put(hub, model, m["token"], f"{FOLDER}/{name}", "monitor was here")
            assert r.status_code == 403, r.text
            assert r.json()["message"] == f"Permission denied: {FOLDER}/{name}", r.text
        # A kernel: a new file, and truncating the existing one.
        for name in ("y.txt", SEED):
            assert kernel_write(hub, model, m["token"], f"/home/work/{FOLDER}/{name}",
                                "monitor was here") == "OSError Read-only file system"
        # The monitor reads the folder all the same.
        assert execute(hub.base, model["url"], m["token"],
                       f"print(open('/home/work/{FOLDER}/{SEED}').read(), end='')") == SEED_TEXT
    finally:
        hub.stop_server(m["username"], "m", token=m["token"])
    assert tree(path) == before


# -- the monitor's own home folder (the packaged default: a home at /home/work) ---------


@pytest.fixture(scope="module")
def home_hub(tmp_path_factory, docker_image):
    """A hub with the packaged default (every user's home folder at /home/work); the
    database plays no part in how a mount is bound, so SQLite only."""
    hub = Hub(db_url=f"sqlite:///{tmp_path_factory.mktemp('monitor-home')}/backendai.sqlite",
              backend="docker").start()
    yield hub
    shutdown_hub(hub)


@pytest.mark.parametrize("role", ["user", "monitor"])
def test_home_folder_server_starts_and_is_bound_as_recorded(home_hub, role):
    """Whatever the rule for a monitor's own home (read-only with Jupyter's state kept
    elsewhere, or their own folder writable), their server starts and what the session's
    record says of the home is what the container gets; an ordinary user (the control)
    gets their home read-write."""
    hub = home_hub
    u = new_user(superadmin(hub), role=role)
    r = hub.spawn(u["username"], "h", token=u["token"])
    try:
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(u["username"], "h", token=u["token"])
        items = u["client"].ok("GET", "/sessions", params={"limit": 100})["items"]
        [sess] = [x for x in items if x["user_id"] == u["id"] and x["name"] == "h"]
        [home] = [v for v in sess["vfolder_mounts"] if v["target"] == "/home/work"]
        rw = binds(hub, u["username"])["/home/work"]
        assert (home["name"], home["permission"]) == (".home", "rw" if rw else "ro"), (home, rw)
        # A user's own '.'-folders are private (never shared, never a project's): a
        # monitor keeps its home writable too, so Jupyter can start in it.
        assert rw is True
    finally:
        if hub.server_model(u["username"], "h", token=u["token"]) is not None:
            hub.stop_server(u["username"], "h", token=u["token"])
