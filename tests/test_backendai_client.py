"""Backend.AI's official CLI (backend.ai-client 23.9.10 on Python 3.11, and 26.9.6 on
Python 3.13 for the 26.09 test) against a running hub.

The CLI runs as a subprocess from its own virtual environment (.venv-bai23/.venv-bai26, made by
scripts/install-backendai-clients.sh, which scripts/install-test-deps.sh runs), with
``BACKEND_ENDPOINT=<hub>/hub/api/backendai`` and a keypair made through the admin API;
sessions are real sessions of this platform (Docker containers of the kernel image).
Each test checks what the CLI printed and then the platform's state through the admin API.
Without the client's venv the tests fail (they do not skip): run the install script.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid

import pytest
import requests

from .api_world import PREFIX, new_user, superadmin
from .conftest import shutdown_hub
from .hub import Hub

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(ROOT, os.environ.get("BAI23_VENV", ".venv-bai23"), "bin", "backend.ai")
CLI26 = os.path.join(ROOT, os.environ.get("BAI26_VENV", ".venv-bai26"), "bin", "backend.ai")
RES = ["-r", "cpu=0.5", "-r", "mem=512m"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory, docker_image):
    assert os.access(CLI, os.X_OK), (
        f"{CLI} is missing: run scripts/install-backendai-clients.sh (the official client's venv)")
    url = f"sqlite:///{tmp_path_factory.mktemp('bai23')}/backendai.sqlite"
    hub = Hub(db_url=url, backend="docker").start()
    yield hub
    shutdown_hub(hub)


class BAI:
    """The official CLI, signed with one user's keypair."""

    def __init__(self, hub: Hub, user: dict, home: str, cli: str = CLI):
        self.hub, self.user, self.cli = hub, user, cli
        kp = user["keypair"]
        self.env = {
            "PATH": os.environ["PATH"], "HOME": home, "LANG": "C.UTF-8",
            "BACKEND_ENDPOINT": hub.base + PREFIX, "BACKEND_ENDPOINT_TYPE": "api",
            "BACKEND_ACCESS_KEY": kp["access_key"], "BACKEND_SECRET_KEY": kp["secret_key"],
        }

    def __call__(self, *args: str, rc: int | None = 0, answer: str = "") -> str:
        p = subprocess.run([self.cli, *args], env=self.env, capture_output=True, text=True,
                           timeout=300, input=answer)
        out = p.stdout + p.stderr
        if rc is not None:
            assert p.returncode == rc, (args, p.returncode, out + "\n--- hub log ---\n"
                                        + self.hub.log()[-3000:])
        self.rc = p.returncode
        return out


@pytest.fixture(scope="module")
def alice(hub, tmp_path_factory):
    sa = superadmin(hub)
    u = new_user(sa, name=f"alice-{uuid.uuid4().hex[:6]}")
    return BAI(hub, u, str(tmp_path_factory.mktemp("alice-home")))


def admin_api(hub, method, path, **kw):
    return superadmin(hub).ok(method, path, **kw)


def wait_dead(hub, sid: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        s = admin_api(hub, "GET", f"/sessions/{sid}")
        if s["status"] in ("TERMINATED", "ERROR", "CANCELLED") or time.monotonic() > deadline:
            return s
        time.sleep(0.3)


def test_version_negotiation_and_errors(hub, alice):
    r = requests.get(hub.base + PREFIX, timeout=30)
    assert r.status_code == 200 and r.json() == {"version": "v7.20230615", "manager": "23.09.10"}
    assert requests.get(hub.base + PREFIX + "/", timeout=30).json()["version"] == "v7.20230615"
    # An error in Backend.AI's problem+json shape, printed by the CLI, exit code 1.
    out = alice("vfolder", "info", "no-such-folder", rc=1)
    assert "BackendAPIError: 404 Not Found" in out
    assert "Not found: no vfolder 'no-such-folder'" in out
    r = requests.get(hub.base + PREFIX + "/folders/x", timeout=30)
    assert r.status_code == 401 and r.headers["Content-Type"] == "application/problem+json"
    assert r.json()["type"] == "https://api.backend.ai/probs/auth-failed"
    # A session id that does not exist: the CLI's own words, exit code 1.
    out = alice("session", "info", str(uuid.uuid4()), rc=1)
    assert "There is no such compute session." in out


def test_batch_session_create_ps_info_logs(hub, alice):
    name = f"bj-{uuid.uuid4().hex[:6]}"
    out = alice("session", "create", "--type", "batch", "--name", name, *RES,
                "--startup-command", "echo hello-from-backendai-cli; echo 6*7=$((6*7))",
                hub.image)
    m = re.search(r"Session ID ([0-9a-f-]{36}) is created and ready\.", out)
    assert m, out
    sid = uuid.UUID(m.group(1)).hex
    s = wait_dead(hub, sid)
    assert (s["name"], s["type"], s["status"], s["result"], s["user_id"]) == (
        name, "batch", "TERMINATED", "SUCCESS", alice.user["id"])
    assert s["kernels"][0]["exit_code"] == 0
    # logs by name and by id (dashed)
    for ref in (name, m.group(1)):
        out = alice("session", "logs", ref)
        assert "hello-from-backendai-cli\n6*7=42" in out and "End of logs." in out
    out = alice("ps", "--all")
    assert name in out and "TERMINATED" in out
    # Active sessions only by default: none. (The 23.09 CLI itself ends an empty list
    # with "NoItems" and exit code 1 when its output is not a terminal.)
    out = alice("ps", rc=1)
    assert name not in out and "NoItems" in out
    out = alice("session", "info", m.group(1))
    assert re.search(rf"Name\s+{name}\n", out) and re.search(r"\nStatus\s+TERMINATED\n", out), out
    # rm of an ended session: already gone, nothing changes
    assert admin_api(hub, "GET", f"/sessions/{sid}")["status"] == "TERMINATED"


def test_refused_session_exits_non_zero_and_leaves_nothing(hub, alice):
    before = admin_api(hub, "GET", "/sessions", params={"user_id": alice.user["id"]})["total"]
    out = alice("session", "create", "--type", "batch", "--name", "too-big", "-r", "cpu=512",
                "-r", "mem=512m", "--startup-command", "true", hub.image, rc=1)
    assert "BackendAPIError: 4" in out and "512" in out
    out = alice("session", "create", "--type", "batch", "--name", "bad-slot", "-r", "tpu=1",
                "--startup-command", "true", hub.image, rc=1)
    assert "slot 'tpu' is not offered here" in out
    assert admin_api(hub, "GET", "/sessions",
                     params={"user_id": alice.user["id"]})["total"] == before


def test_interactive_session_is_a_jupyterhub_server(hub, alice):
    name = f"ia-{uuid.uuid4().hex[:6]}"
    out = alice("session", "create", "--name", name, *RES, hub.image)
    m = re.search(r"Session ID ([0-9a-f-]{36}) is created and ready\.", out)
    assert m, out
    sid = uuid.UUID(m.group(1)).hex
    username = alice.user["username"]
    model = hub.wait_ready(username, name)
    assert model["ready"] is True
    s = admin_api(hub, "GET", f"/sessions/{sid}")
    assert (s["type"], s["status"], s["name"].endswith(name)) == ("interactive", "RUNNING", True)
    out = alice("ps")
    assert m.group(1) in out and "RUNNING" in out
    out = alice("session", "rm", m.group(1))
    assert "Done." in out
    assert wait_dead(hub, sid)["status"] == "TERMINATED"
    assert not (hub.server_model(username, name) or {}).get("ready")


def test_vfolder_commands(hub, alice):
    name = f"data-{uuid.uuid4().hex[:6]}"
    out = alice("vfolder", "create", name, "local:volume1")
    assert f'Virtual folder "{name}" is created.' in out
    f = admin_api(hub, "GET", "/vfolders", params={"name": name})["items"]
    assert len(f) == 1 and (f[0]["user_id"], f[0]["status"]) == (alice.user["id"], "ready")
    fid = f[0]["id"]
    assert name in alice("vfolder", "list")
    out = alice("vfolder", "list-hosts")
    assert "Default vfolder host: local:volume1\nUsable hosts: local:volume1" in out
    out = alice("vfolder", "info", name)
    assert f'Virtual folder "{name}" (ID: {uuid.UUID(fid)})' in out and "- Owner: True" in out
    out = alice("vfolder", "mkdir", "-p", name, "a/b")
    path = os.path.join(hub.volume_path, *f[0]["quota_scope_id"].split(":"), fid)
    assert os.path.isdir(os.path.join(path, "a", "b"))
    with open(os.path.join(path, "a", "x.txt"), "w") as fh:
        fh.write("12345")
    out = alice("vfolder", "ls", name, "a")
    assert re.search(r"x\.txt\s+5\s", out) and re.search(r"\bb\s+", out), out
    out = alice("vfolder", "rm", name, "a/x.txt", answer="y\n")
    assert "Are you sure?" in out
    assert not os.path.exists(os.path.join(path, "a", "x.txt"))
    assert os.path.isdir(os.path.join(path, "a", "b"))
    # upload and download straight to the (in-hub) storage proxy: tus with 16 MiB chunks
    data = os.urandom(40 * 2**20 + 12345)
    home = alice.env["HOME"]
    with open(os.path.join(home, "up.bin"), "wb") as fh:
        fh.write(data)
    open(os.path.join(home, "empty.txt"), "wb").close()
    out = alice("vfolder", "upload", "-b", home, name, "up.bin", "empty.txt")
    assert f"via {hub.base}{PREFIX}/storage/upload" in out, out
    with open(os.path.join(path, "up.bin"), "rb") as fh:
        assert fh.read() == data
    assert os.path.getsize(os.path.join(path, "empty.txt")) == 0
    assert os.listdir(os.path.join(os.path.dirname(path), ".tus")) != []  # done markers only
    assert not [n for n in os.listdir(os.path.join(os.path.dirname(path), ".tus"))
                if not n.endswith(".done")]
    out = alice("vfolder", "ls", name)
    assert re.search(rf"up\.bin\s+{len(data)}\s", out), out
    dl = os.path.join(home, "dl")
    os.mkdir(dl)
    out = alice("vfolder", "download", "-b", dl, name, "up.bin")
    with open(os.path.join(dl, "up.bin"), "rb") as fh:
        assert fh.read() == data
    # a file that is not there: the CLI fails (it retries, then gives up)
    out = alice("vfolder", "download", "-b", dl, "--max-retries", "1", name, "nope.bin", rc=1)
    assert not os.path.exists(os.path.join(dl, "nope.bin")) or os.path.getsize(
        os.path.join(dl, "nope.bin")) == 0
    out = alice("vfolder", "delete", name)
    assert "Deleted." in out
    assert admin_api(hub, "GET", "/vfolders", params={"name": name})["total"] == 0
    assert not os.path.exists(path)
    out = alice("vfolder", "delete", name, rc=1)
    assert "no vfolder" in out


@pytest.fixture(scope="module")
def bob26(hub, tmp_path_factory):
    """A user driving the 26.09 client (backend.ai-client 26.9.6, Python 3.13)."""
    assert os.access(CLI26, os.X_OK), (
        f"{CLI26} is missing: run scripts/install-backendai-clients.sh (the 26.09 client's venv)")
    u = new_user(superadmin(hub), name=f"bob-{uuid.uuid4().hex[:6]}")
    return BAI(hub, u, str(tmp_path_factory.mktemp("bob-home")), cli=CLI26)


def test_26_09_client_folders_transfers_and_sessions(hub, bob26):
    bai = bob26
    name = f"d26-{uuid.uuid4().hex[:6]}"
    out = bai("vfolder", "create", name, "local:volume1")
    assert f'Virtual folder "{name}" is created.' in out
    f = admin_api(hub, "GET", "/vfolders", params={"name": name})["items"]
    assert len(f) == 1 and f[0]["user_id"] == bai.user["id"]
    path = os.path.join(hub.volume_path, *f[0]["quota_scope_id"].split(":"), f[0]["id"])
    out = bai("vfolder", "list")
    assert re.search(rf"local:volume1\s+{name}\s+ready", out), out
    out = bai("vfolder", "info", name)  # looked up by GET /folders/_/id
    assert f"(ID: {uuid.UUID(f[0]['id'])})" in out
    out = bai("vfolder", "mkdir", name, "sub")
    assert "Successfully created:" in out and os.path.isdir(os.path.join(path, "sub"))
    data = os.urandom(3 * 2**20 + 7)
    home = bai.env["HOME"]
    with open(os.path.join(home, "f26.bin"), "wb") as fh:
        fh.write(data)
    bai("vfolder", "upload", "-b", home, name, "f26.bin")
    with open(os.path.join(path, "f26.bin"), "rb") as fh:
        assert fh.read() == data
    out = bai("vfolder", "ls", name)  # "items" with ISO "modified"
    assert re.search(rf"f26\.bin\s+{len(data)}\s", out) and re.search(r"sub\s+\d+", out), out
    dl = os.path.join(home, "dl")
    os.mkdir(dl)
    bai("vfolder", "download", "-b", dl, name, "f26.bin")
    with open(os.path.join(dl, "f26.bin"), "rb") as fh:
        assert fh.read() == data

    sname = f"b26-{uuid.uuid4().hex[:6]}"
    out = bai("session", "create", "--type", "batch", "--name", sname, *RES,
              "--startup-command", "sleep 600", hub.image)
    m = re.search(r"Session ID ([0-9a-f-]{36}) is created and ready\.", out)
    assert m, out
    sid = uuid.UUID(m.group(1)).hex
    out = bai("ps")
    assert sname in out and "RUNNING" in out, out
    out = bai("session", "rm", m.group(1))
    s = wait_dead(hub, sid)
    assert s["status"] == "TERMINATED", s
    out = bai("ps", "--all")
    assert sname in out and "TERMINATED" in out
