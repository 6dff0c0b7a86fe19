"""Every user's persistent home: a vfolder mounted at /home/work, automount '.'-folders,
the kernel image's environment on PATH in login shells and Jupyter terminals.

Through a real hub (subprocess, CHP) with the Docker backend and the kernel image; the
files are checked in the kernel (over its websocket), through the admin API and on
the in-hub storage volume.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest
import requests
from websockets.sync.client import connect

from .api_world import Client, new_user, superadmin
from .conftest import containers_of, shutdown_hub
from .hub import Hub
from .kernel_client import execute

HOME = ".home"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, docker_image):
    hub = Hub(db_url=f"sqlite:///{tmp_path_factory.mktemp('home')}/backendai.sqlite",
              backend="docker").start()
    yield hub
    shutdown_hub(hub)


def folders(client: Client, **filters) -> list[dict]:
    return client.ok("GET", "/vfolders", params={"limit": 100, **filters})["items"]


def files(client: Client, fid: str, path: str = "") -> dict[str, str]:
    """name -> type of the entries of a folder's directory, through the API."""
    out = client.ok("GET", f"/vfolders/{fid}/files", params={"path": path})
    return {e["name"]: e["type"] for e in out["items"]}


def run_in(hub: Hub, user: str, server: str, code: str, token: str | None = None) -> str:
    model = hub.server_model(user, server, token=token)
    return execute(hub.base, model["url"], token or hub.admin_token, code).strip()


def start(hub: Hub, user: str, server: str, token: str | None = None) -> None:
    r = hub.spawn(user, server, token=token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user, server, token=token)


def container(hub: Hub, owner: str) -> str:
    """The one running kernel container of ``owner`` on the hub's agent."""
    out = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=ai.backend.agent-id={hub.agent_id}",
         "--filter", f"label=ai.backend.owner={owner}"],
        capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == 1, out
    return out[0]


def test_home_folder_keeps_files_and_user_packages_across_stop_and_start(hub):
    sa = superadmin(hub)
    assert [f for f in folders(sa, user_id=_me(sa)) if f["name"] == HOME] == []
    start(hub, "admin", "h1")
    # The home folder is a vfolder of the user on the default host, ready, listed.
    [home] = [f for f in folders(sa, user_id=_me(sa)) if f["name"] == HOME]
    assert (home["host"], home["ownership_type"], home["status"], home["my_permission"]) == (
        "local:volume1", "user", "ready", "rw")
    # The image's shell start files were copied into the fresh home (they are hidden by it).
    assert {".bashrc", ".profile", ".bash_logout"} <= set(files(sa, home["id"]))
    # A file and a package installed with `pip install --user` (offline, from a wheel
    # made in the kernel).
    code = r"""
import subprocess, sys, zipfile
open('/home/work/notes.txt', 'w').write('kept across restarts')
whl = '/tmp/homepkg-1.0-py3-none-any.whl'
with zipfile.ZipFile(whl, 'w') as z:
    z.writestr('homepkg/__init__.py', 'VALUE = 42\n')
    z.writestr('homepkg-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\nName: homepkg\nVersion: 1.0\n')
    z.writestr('homepkg-1.0.dist-info/WHEEL',
               'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
    z.writestr('homepkg-1.0.dist-info/RECORD', '')
r = subprocess.run([sys.executable, '-m', 'pip', 'install', '--user', '--no-index', '-q', whl],
                   capture_output=True, text=True)
print(r.returncode, r.stderr[-300:].replace(chr(10), ' '))
"""
    assert run_in(hub, "admin", "h1", code) == "0"
    hub.stop_server("admin", "h1")
    assert containers_of(hub.agent_id) == []
    on_volume = os.path.join(hub.volume_path, *home["quota_scope_id"].split(":"), home["id"])
    with open(os.path.join(on_volume, "notes.txt")) as f:
        assert f.read() == "kept across restarts"
    assert os.stat(os.path.join(on_volume, "notes.txt")).st_uid == 1000

    start(hub, "admin", "h1")
    assert run_in(hub, "admin", "h1", "print(open('/home/work/notes.txt').read())") == (
        "kept across restarts")
    assert run_in(hub, "admin", "h1", "import homepkg; print(homepkg.VALUE, homepkg.__file__)") == (
        "42 /home/work/.local/lib/python3.11/site-packages/homepkg/__init__.py")
    # Still one home folder: the second start reused it.
    assert [f["id"] for f in folders(sa, user_id=_me(sa)) if f["name"] == HOME] == [home["id"]]
    # It cannot be deleted while a server mounts it.
    r = sa("DELETE", f"/vfolders/{home['id']}")
    assert r.status_code == 409 and "mounted by live session" in r.json()["detail"], r.text
    hub.stop_server("admin", "h1")


def _me(client: Client) -> str:
    return client.ok("GET", "/users", params={"email": "admin@example.com"})["items"][0]["id"]


def test_dot_folders_are_mounted_into_every_session(hub):
    sa = superadmin(hub)
    u = new_user(sa)
    c = u["client"]
    cfg = c.ok("POST", "/vfolders", json={"name": ".cfg"})
    plain = c.ok("POST", "/vfolders", json={"name": "plain"})
    r = c("PUT", f"/vfolders/{cfg['id']}/upload", params={"path": "settings.ini"},
          data=b"[x]\ny = 1\n")
    assert r.status_code in (200, 201), r.text
    start(hub, u["username"], "dots", token=u["token"])
    seen = run_in(hub, u["username"], "dots", token=u["token"], code=(
        "import os; open('/home/work/.cfg/from-kernel.txt', 'w').write('hi');"
        "mnt = [line.split()[4] for line in open('/proc/self/mountinfo')];"
        "print(open('/home/work/.cfg/settings.ini').read().split()[-1],"
        " '/home/work' in mnt, '/home/work/.cfg' in mnt, os.path.exists('/home/work/plain'))"))
    # .cfg is automounted (read and written), /home/work is the home folder, "plain"
    # (not asked for, no '.') is not mounted.
    assert seen == "1 True True False"
    assert set(files(c, cfg["id"])) == {"settings.ini", "from-kernel.txt"}
    assert files(c, plain["id"]) == {}
    # The mount point in the home folder was made for the user (not by the engine as
    # root): it stays usable when .cfg is gone.
    [home] = [f for f in folders(c) if f["name"] == HOME]
    assert files(c, home["id"])[".cfg"] == "dir"
    on_volume = os.path.join(hub.volume_path, *home["quota_scope_id"].split(":"), home["id"])
    assert os.stat(os.path.join(on_volume, ".cfg")).st_uid == 1000
    hub.stop_server(u["username"], "dots", token=u["token"])
    # Dot-folders belong to one user: never shared, never a project's.
    other = new_user(sa)
    r = c("POST", f"/vfolders/{cfg['id']}/shares", json={"email": other["email"]})
    assert r.status_code == 400 and "cannot be shared" in r.json()["detail"], r.text
    r = sa("POST", "/vfolders", json={"name": ".team", "project": "default"})
    assert r.status_code == 400 and "project folder" in r.json()["detail"], r.text


def test_login_shell_and_jupyter_terminal_use_the_kernel_environment(hub):
    start(hub, "admin", "term")
    cid = container(hub, "admin")
    want = "/opt/venv/bin/python\n/opt/venv/bin/pip\n/opt/venv/bin/jupyter\n"
    for shell in (["bash", "-lc"], ["sh", "-lc"], ["bash", "-ic"], ["bash", "-c"]):
        out = subprocess.run(["docker", "exec", cid, *shell,
                              "for c in python pip jupyter; do command -v $c; done"],
                             capture_output=True, text=True)
        assert out.stdout == want, (shell, out.stdout, out.stderr)
    # A login shell from an empty environment (what `login` or sshd would start).
    out = subprocess.run(["docker", "exec", cid, "env", "-i", "HOME=/home/work", "bash", "-lc",
                          "command -v python; echo $VIRTUAL_ENV"], capture_output=True, text=True)
    assert out.stdout == "/opt/venv/bin/python\n/opt/venv\n", out.stderr
    # A real Jupyter terminal (a login shell, as JupyterLab opens it).
    model = hub.server_model("admin", "term")
    text = terminal_run(hub.base, model["url"], hub.admin_token,
                        "command -v python pip jupyter; python -c 'import ipykernel; "
                        "print(ipykernel.__file__)'")
    assert "/opt/venv/bin/python\r\n/opt/venv/bin/pip\r\n/opt/venv/bin/jupyter\r\n" in text, text
    assert "/opt/venv/lib/python3.11/site-packages/ipykernel/__init__.py" in text, text
    hub.stop_server("admin", "term")


def terminal_run(base: str, prefix: str, token: str, command: str, timeout: float = 60) -> str:
    """Open a terminal of the Jupyter server, run ``command``, return what it printed
    up to a marker (the echo of the typed line cannot contain the marker itself)."""
    headers = {"Authorization": f"token {token}"}
    r = requests.post(f"{base}{prefix}api/terminals", headers=headers, timeout=60)
    r.raise_for_status()
    name = r.json()["name"]
    mark = uuid.uuid4().hex[:8]
    ws_url = base.replace("http", "ws", 1) + f"{prefix}terminals/websocket/{name}"
    out = ""
    try:
        with connect(ws_url, additional_headers=headers, open_timeout=timeout) as ws:
            ws.send(json.dumps(["stdin", f"{command}; echo {mark}-$((6*7))\r"]))
            deadline = time.monotonic() + timeout
            while f"{mark}-42" not in out:
                msg = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
                if msg[0] == "stdout":
                    out += msg[1]
    finally:
        requests.delete(f"{base}{prefix}api/terminals/{name}", headers=headers, timeout=30)
    return out


def test_user_at_the_folder_limit_gets_a_plain_error_and_nothing_is_made(hub):
    sa = superadmin(hub)
    pol = sa.ok("POST", "/user-resource-policies",
                json={"name": f"one-{uuid.uuid4().hex[:6]}", "max_vfolder_count": 1})
    u = new_user(sa)
    sa.ok("PATCH", f"/users/{u['id']}", json={"resource_policy": pol["name"]})
    u["client"].ok("POST", "/vfolders", json={"name": "data"})
    r = hub.spawn(u["username"], "full", token=u["token"])
    assert r.status_code == 412, r.text
    detail = r.json()["message"]
    assert f"cannot make your home folder '{HOME}'" in detail, detail
    assert "vfolder count limit reached: 1 of 1" in detail and "Delete a vfolder" in detail, detail
    assert [f["name"] for f in folders(u["client"])] == ["data"]
    assert containers_of(hub.agent_id) == []
    assert sa.ok("GET", "/sessions", params={"user_id": u["id"]})["total"] == 0


def test_home_folder_switched_off(tmp_path, docker_image):
    hub = Hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="docker",
              extra_args=["--BackendAISpawner.home_folder="]).start()
    try:
        sa = superadmin(hub)
        start(hub, "admin", "nohome")
        assert run_in(hub, "admin", "nohome", "import os; open('/home/work/x.txt', 'w').write('1');"
                      "print('/home/work' in [line.split()[4] for line in open('/proc/self/mountinfo')],"
                      " {'.bashrc', '.profile', 'x.txt'} <= set(os.listdir('/home/work')))") == (
            "False True")
        assert folders(sa) == []
        hub.stop_server("admin", "nohome")
        start(hub, "admin", "nohome")
        # Without a home folder /home/work is the image's: the file is gone.
        assert run_in(hub, "admin", "nohome", "import os; print(os.path.exists('/home/work/x.txt'))") == (
            "False")
        assert folders(sa) == []
        hub.stop_server("admin", "nohome")
    finally:
        shutdown_hub(hub)


def test_home_folder_in_the_trash_refuses_the_start_in_plain_words(hub):
    """A home folder trashed with Backend.AI 26.09's `vfolder delete` (its status set
    here in the record, as the trash does) must not make a start wait and fail late: it
    is refused at once, saying how to get going again, and nothing is made."""
    from sqlalchemy import update

    from jupyterhub_backendai.models import VFolder
    from jupyterhub_backendai.models.db import make_engine

    sa = superadmin(hub)
    u = new_user(sa)
    home = u["client"].ok("POST", "/vfolders", json={"name": HOME})
    engine = make_engine(hub.db_url)
    with engine.begin() as c:
        c.execute(update(VFolder).where(VFolder.id == home["id"]).values(status="delete-pending"))
    engine.dispose()
    r = hub.spawn(u["username"], "trashed", token=u["token"])
    assert r.status_code == 409, r.text
    detail = r.json()["message"]
    assert f"your home folder '{HOME}' is in the trash" in detail and "restore" in detail, detail
    assert [f["name"] for f in folders(u["client"])] == [HOME]
    assert containers_of(hub.agent_id) == []
    assert sa.ok("GET", "/sessions", params={"user_id": u["id"]})["total"] == 0
