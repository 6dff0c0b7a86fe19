"""Backend.AI's official CLI (backend.ai-client 23.9.10 on Python 3.11, and 26.9.6 on
Python 3.13 for the 26.09 test) against a running hub.

The CLI runs as a process of its own virtual environment (.venv-bai23/.venv-bai26, made by
scripts/install-backendai-clients.sh, which scripts/install-test-deps.sh runs), forked from
a process of that environment that imported it once (tests/clifork.py: the import was most
of each command's CPU; ``BAI_FORK=0`` runs the console script itself every time), with
``BACKEND_ENDPOINT=<hub>/hub/api/backendai`` and a keypair made through the admin API;
sessions are real sessions of this platform (Docker containers of the kernel image).
Each test checks what the CLI printed and then the platform's state through the admin API.
Without the client's venv the tests fail (they do not skip): run the install script.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import uuid

import pytest
import requests

from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from . import clifork
from .api_world import PASSWORD, PREFIX, new_user, park_session, superadmin
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
    hub.engine = make_engine(url)  # (park_session writes a queued session into the record)
    hub.sm = make_sessionmaker(hub.engine)
    yield hub
    shutdown_hub(hub)
    hub.engine.dispose()


class BAI:
    """The official CLI, signed with one user's keypair."""

    def __init__(self, hub: Hub, user: dict, home: str, cli: str = CLI, fork: bool = True):
        self.hub, self.user, self.cli, self.fork = hub, user, cli, fork
        kp = user["keypair"]
        self.env = {
            "PATH": os.environ["PATH"], "HOME": home, "LANG": "C.UTF-8",
            "BACKEND_ENDPOINT": hub.base + PREFIX, "BACKEND_ENDPOINT_TYPE": "api",
            "BACKEND_ACCESS_KEY": kp["access_key"], "BACKEND_SECRET_KEY": kp["secret_key"],
        }

    @property
    def exe(self) -> str:
        """What runs the CLI: its console script, through a fork server that imported
        it once (tests/clifork.py), or the script itself (``fork=False``)."""
        return clifork.executable(self.cli) if self.fork else self.cli

    def __call__(self, *args: str, rc: int | None = 0, answer: str = "", cwd=None) -> str:
        try:
            p = subprocess.run([self.exe, *args], env=self.env, capture_output=True,
                               text=True, timeout=300, input=answer, cwd=cwd)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"{args} timed out; hub log:\n{self.hub.log()[-5000:]}") from e
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
    # The console script run as itself (every other command here runs forked from a
    # process that imported it, tests/clifork.py): the same words and exit codes.
    real = BAI(hub, alice.user, alice.env["HOME"], fork=False)
    assert real.exe == CLI
    out = real("vfolder", "info", "no-such-folder", rc=1)
    assert "Not found: no vfolder 'no-such-folder'" in out
    out = real("session", "info", str(uuid.uuid4()), rc=1)
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
    # rename-file (keeps its directory), mv (to a path, into a directory), rename the folder
    with open(os.path.join(path, "a", "r.txt"), "w") as fh:
        fh.write("r")
    out = alice("vfolder", "rename-file", name, "a/r.txt", "s.txt")
    assert "Renamed." in out and open(os.path.join(path, "a", "s.txt")).read() == "r"
    assert not os.path.exists(os.path.join(path, "a", "r.txt"))
    out = alice("vfolder", "mv", name, "a/s.txt", "a/b")
    assert "Moved." in out and os.path.isfile(os.path.join(path, "a", "b", "s.txt"))
    out = alice("vfolder", "mv", name, "a/b/s.txt", "top.txt")
    assert "Moved." in out and os.path.isfile(os.path.join(path, "top.txt"))
    # bad input: a new name with '/', a path out of the folder, an existing target
    out = alice("vfolder", "rename-file", name, "top.txt", "x/y.txt", rc=1)
    assert re.search(r"\b400\b", out) and "new_name" in out
    out = alice("vfolder", "mv", name, "top.txt", "../escape.txt", rc=1)
    assert re.search(r"\b400\b", out)
    out = alice("vfolder", "mv", name, "top.txt", "up.bin", rc=1)
    assert re.search(r"\b409\b", out) and "already exists" in out
    out = alice("vfolder", "mv", name, "nothing.txt", "n2.txt", rc=1)
    assert re.search(r"\b404\b", out)
    assert sorted(os.listdir(path)) == ["a", "empty.txt", "top.txt", "up.bin"]
    assert os.listdir(os.path.join(path, "a", "b")) == []
    new = name + "-r"
    out = alice("vfolder", "rename", name, new)
    assert "Renamed." in out
    assert admin_api(hub, "GET", f"/vfolders/{fid}")["name"] == new
    name = new
    out = alice("vfolder", "delete", name)  # 23.09: at once (no trash)
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

    # the trash (rename-file and mv: the routes of the 23.09 test, here by id too): delete
    # keeps the files, restore brings the folder back, purge ends it. (Each 26.09 call
    # costs seconds of start-up: few of them.)
    fid = f[0]["id"]
    out = bai("vfolder", "purge", name, rc=1)  # not in the trash
    assert re.search(r"\b409\b", out) and "not in the trash" in out
    out = bai("vfolder", "delete", name)
    assert "Deleted." in out
    assert admin_api(hub, "GET", f"/vfolders/{fid}")["status"] == "delete-pending"
    assert os.path.isfile(os.path.join(path, "f26.bin"))
    r = bai.user["client"]("GET", f"/vfolders/{fid}/files")  # not usable while in the trash
    assert r.status_code == 409 and "delete-pending" in r.text
    r = superadmin(hub)("DELETE", f"/vfolders/{fid}")  # nor deleted by the admin API's delete
    assert r.status_code == 409 and "in the trash" in r.text
    out = bai("vfolder", "restore", name)
    assert "Restored." in out
    assert admin_api(hub, "GET", f"/vfolders/{fid}")["status"] == "ready"
    items = bai.user["client"].ok("GET", f"/vfolders/{fid}/files")["items"]
    assert "f26.bin" in [i["name"] for i in items]
    bai("vfolder", "delete", name)
    out = bai("vfolder", "purge", name)
    assert "Purged." in out
    assert admin_api(hub, "GET", "/vfolders", params={"name": name})["total"] == 0
    assert not os.path.exists(path)

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


def test_run_code_in_a_jupyter_kernel_both_clients(hub, alice, bob26, tmp_path):
    """``backend.ai run``: the code runs in the session's Jupyter kernel (a JupyterHub
    server in a real container), output streamed, input answered, failures exit 1."""
    name = f"run-{uuid.uuid4().hex[:6]}"
    out = alice("run", "--name", name, *RES, "-c",
                "import sys, socket\nprint('hello from', socket.gethostname())\n"
                "print('to-stderr', file=sys.stderr)\nx = 6 * 7", hub.image)
    assert f"Session {name} is ready" in out and "hello from " in out and "to-stderr" in out
    assert "Execution finished. (exit code = 0)" in out, out
    sid = admin_api(hub, "GET", "/sessions", params={"user_id": alice.user["id"]})["items"]
    sid = [s["id"] for s in sid if s["name"].endswith(name) and s["status"] == "RUNNING"]
    assert len(sid) == 1
    # the container's hostname is the session's: the code ran there, not in the hub
    assert f"hello from {socket.gethostname()}" not in out
    # reuse: the kernel keeps its state; input() is answered from the CLI's stdin
    out = alice("run", "--name", name, "-c", "v = input('who? ')\nprint('x =', x, 'v =', v)",
                hub.image, answer="bob\n")
    assert "Reusing session" in out and "who? " in out and "x = 42 v = bob" in out, out
    # failures: the traceback (without colour codes) and exit code 1
    out = alice("run", "--name", name, "-c", "print('before')\n1/0", hub.image, rc=1)
    assert "before" in out and "ZeroDivisionError: division by zero" in out and "\x1b[" not in out
    assert "(exit code = 1)" in out and "Execution finished." not in out, out
    out = alice("run", "--name", name, "-c", "import sys; sys.exit(3)", hub.image, rc=1)
    assert "Execution failed: SystemExit(3) (exit code = 3)" in out, out
    out = alice("run", "--name", name, "-c", "import sys; sys.exit(0)", hub.image)
    assert "(exit code = 0)" in out
    # batch mode: the files go into the session (POST /session/{id}/upload, its Jupyter
    # server's /home/work), then the build and exec commands run there, output streamed
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "main.py").write_text("import pkg.mod\nprint('main says', pkg.mod.VALUE)\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "mod.py").write_text("VALUE = open('built.txt').read().strip()\n")
    files = [str(src / "main.py"), str(src / "pkg" / "__init__.py"), str(src / "pkg" / "mod.py")]
    out = alice("run", "--name", name, "--basedir", str(src), "--build",
                "python -c \"print('built-%d' % (6 * 7))\" > built.txt && echo build-out "
                "&& echo build-err >&2",
                hub.image, *files)
    assert "Uploading done" in out and "Build finished. (exit code = 0)" in out, out
    assert "build-out" in out and "build-err" in out and "main says built-42" in out, out
    assert "Execution finished. (exit code = 0)" in out, out
    # a failing step ends the run there (exit 1, its exit code said); replaced files
    (src / "main.py").write_text("print('second main')\n")
    out = alice("run", "--name", name, "--basedir", str(src), "--build", "exit 4",
                "--exec", "echo never", hub.image, str(src / "main.py"), rc=1)
    assert "the build command exited with 4 (exit code = 4)" in out and "never" not in out
    out = alice("run", "--name", name, "--basedir", str(src), "--exec",
                "python main.py; exit 5", hub.image, str(src / "main.py"), rc=1)
    assert "second main" in out and "the exec command exited with 5" in out, out
    # names the session's Jupyter server refuses: refused before anything is written
    (src / ".hidden").write_text("x")
    (src / "fresh.txt").write_text("x")
    out = alice("run", "--name", name, "--basedir", str(src), hub.image,
                str(src / "fresh.txt"), str(src / ".hidden"), rc=1)
    assert "'.hidden': hidden files and directories are not uploaded" in out, out
    assert "BackendAPIError(400" in out and "Execution finished" not in out, out
    # `session upload` (the same route; paths relative to the current directory)
    (src / "data").mkdir()
    (src / "data" / "up.txt").write_text("uploaded by session upload\n")
    out = alice("session", "upload", name, "data/up.txt", cwd=str(src))
    assert "Uploaded." in out, out
    out = alice("run", "--name", name, "-c", "import os; print('fresh:', "
                "os.path.exists('fresh.txt'), open('data/up.txt').read())", hub.image)
    assert "fresh: False uploaded by session upload" in out, out
    _attack_execute_websocket(hub, alice, bob26, sid[0])
    # a batch session has no kernel: refused before anything runs
    bname = f"rb-{uuid.uuid4().hex[:6]}"
    alice("session", "create", "--type", "batch", "--name", bname, *RES,
          "--startup-command", "sleep 600", hub.image)
    out = alice("run", "--name", bname, "-c", "print('never')", hub.image, rc=1)
    assert "never" not in out and re.search(r"\b400\b", out), out
    alice("session", "rm", bname)

    # the 26.09 client, with --rm: the session ends afterwards
    name26 = f"run26-{uuid.uuid4().hex[:6]}"
    out = bob26("run", "--rm", "--name", name26, *RES, "-c",
                "print(sum(range(10)))\nraise ValueError('bad value')", hub.image, rc=1)
    assert "45\n" in out and "ValueError: bad value" in out, out
    out = alice("session", "rm", name)
    assert wait_dead(hub, sid[0])["status"] == "TERMINATED"
    assert not (hub.server_model(alice.user["username"], name) or {}).get("ready")
    mine = admin_api(hub, "GET", "/sessions", params={"user_id": bob26.user["id"]})["items"]
    s26 = [s for s in mine if s["name"].endswith(name26)]
    assert len(s26) == 1 and wait_dead(hub, s26[0]["id"])["status"] == "TERMINATED"


def _attack_execute_websocket(hub, alice, bob26, sid: str) -> None:
    """The execute websocket runs code as its session's owner: another user's credentials,
    alice's token with only the read scope, and alice's own login cookie sent from a page of another origin (cross-site
    websocket hijacking) are refused in the handshake; the same cookie from the hub's
    own origin opens it (so the refusal is the origin's, not a cookie that failed)."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    from . import api_world

    url = "ws" + hub.base[4:] + PREFIX + f"/stream/session/{sid}/execute"

    def status(headers: dict, origin: str | None) -> int:
        try:
            with connect(url, additional_headers=headers, origin=origin, open_timeout=60):
                return 101
        except InvalidStatus as e:
            return e.response.status_code

    assert status({"Authorization": f"token {bob26.user['token']}"}, None) == 404
    # Running code is more than reading: alice's token with only the read scope is
    # refused, her token with her full scopes opens it.
    name = alice.user["username"]
    r = requests.post(f"{hub.base}/hub/api/users/{name}/tokens", timeout=30,
                      headers={"Authorization": f"token {alice.user['token']}"},
                      json={"scopes": ["custom:backendai:read"], "note": "read only"})
    assert r.status_code == 201, r.text
    assert status({"Authorization": f"token {r.json()['token']}"}, None) == 403
    assert status({"Authorization": f"token {alice.user['token']}"}, None) == 101
    login = hub.login(alice.user["email"], api_world.PASSWORD)
    cookie = "; ".join(f"{c.name}={c.value}" for c in login.cookies)
    assert status({"Cookie": cookie}, "http://evil.example") == 403
    assert status({"Cookie": cookie}, hub.base) == 101


def test_vfolder_invite_accept_decline_and_share(hub, alice, bob26, tmp_path):
    """invite -> the invitee accepts (shared with the invitation's permission) or declines;
    also through the hub's own REST API; share at once (user and project folders);
    refusals leave nothing. Mostly the 23.09 CLI (the 26.09 one takes seconds to start)."""
    sa = superadmin(hub)
    pname = f"proj-{uuid.uuid4().hex[:6]}"
    project = sa.ok("POST", "/projects", json={"name": pname, "domain_name": "default"})
    carol = BAI(hub, new_user(sa, name=f"carol-{uuid.uuid4().hex[:6]}",
                              projects=[project["id"]]), str(tmp_path / "carol"))
    os.mkdir(carol.env["HOME"])
    c_email = carol.user["email"]
    name = f"inv-{uuid.uuid4().hex[:6]}"
    alice("vfolder", "create", name, "local:volume1")
    fid = admin_api(hub, "GET", "/vfolders", params={"name": name})["items"][0]["id"]
    # bad input first: an unknown user (with a known one) invites nobody; 400
    out = alice("vfolder", "invite", "-p", "ro", name, c_email, "nobody@example.com", rc=1)
    assert re.search(r"\b400\b", out) and "nobody@example.com" in out
    assert "No invitations." in carol("vfolder", "invitations")
    out = alice("vfolder", "invite", "-p", "ro", name, c_email)
    assert f"Invitation sent to:\n\t- {c_email}" in out, out
    out = alice("vfolder", "invite", "-p", "ro", name, c_email, rc=1)
    assert re.search(r"\b409\b", out) and "pending invitation" in out
    # not yet shared: carol cannot see the folder
    assert admin_api(hub, "GET", f"/vfolders/{fid}/shares")["total"] == 0
    out = carol("vfolder", "info", name, rc=1)
    assert re.search(r"\b404\b", out)
    out = carol("vfolder", "invitations", answer="1\na\n")
    assert f"{alice.user['email']}, {uuid.UUID(fid)}, read-only" in out, out
    assert f"You can now access vfolder {name}" in out
    shares = admin_api(hub, "GET", f"/vfolders/{fid}/shares")["items"]
    assert [(s["email"], s["permission"]) for s in shares] == [(c_email, "ro")]
    out = carol("vfolder", "info", name)  # by name: shared with her
    assert "- Owner: False" in out and "- Permission: ro" in out, out
    out = carol("vfolder", "mkdir", name, "nope", rc=1)
    assert re.search(r"\b403\b", out) and "ro" in out
    # share: at once; an existing share takes the new permission
    out = alice("vfolder", "share", "-p", "rw", name, c_email)
    assert f"Shared with rw permission to:\n\t- {c_email}" in out, out
    assert admin_api(hub, "GET", f"/vfolders/{fid}/shares")["items"][0]["permission"] == "rw"
    carol("vfolder", "mkdir", name, "yes")
    out = carol("vfolder", "share", "-p", "rw", name, alice.user["email"], rc=1)
    assert re.search(r"\b403\b", out)  # only the owner shares
    out = alice("vfolder", "share", "-p", "rw", name, "nobody@example.com", rc=1)
    assert re.search(r"\b400\b", out)
    assert len(admin_api(hub, "GET", f"/vfolders/{fid}/shares")["items"]) == 1

    # a project folder: an admin of the domain gives a member their own permission
    admin = BAI(hub, new_user(sa, role="admin", name=f"adm-{uuid.uuid4().hex[:6]}",
                              projects=[project["id"]]), str(tmp_path / "adm"))
    os.mkdir(admin.env["HOME"])
    pf = f"pf-{uuid.uuid4().hex[:6]}"
    admin("vfolder", "create", "-g", pname, pf, "local:volume1")
    pfid = admin_api(hub, "GET", "/vfolders", params={"name": pf})["items"][0]["id"]
    assert carol.user["client"].ok("GET", f"/vfolders/{pfid}")["my_permission"] == "rw"
    out = admin("vfolder", "share", "-p", "ro", pf, alice.user["email"], rc=1)
    assert re.search(r"\b400\b", out) and "not in the vfolder's project" in out
    out = admin("vfolder", "share", "-p", "ro", pf, c_email)
    assert f"Shared with ro permission to:\n\t- {c_email}" in out, out
    assert carol.user["client"].ok("GET", f"/vfolders/{pfid}")["my_permission"] == "ro"
    out = carol("vfolder", "share", "-p", "rw", pf, c_email, rc=1)
    assert re.search(r"\b403\b", out)
    out = carol("vfolder", "info", pf)
    assert "- Ownership Type: group" in out and "- Permission: ro" in out, out
    # unshare (a project folder: the member's own permission ends) and leave (a user folder)
    out = admin("vfolder", "unshare", pf, c_email)
    assert f"Unshared from:\n\t- {c_email}" in out, out
    assert carol.user["client"].ok("GET", f"/vfolders/{pfid}")["my_permission"] == "rw"
    out = admin("vfolder", "unshare", pf, c_email, rc=1)
    assert re.search(r"\b404\b", out) and "not shared with" in out
    out = carol("vfolder", "leave", name)
    assert f'Left the shared virtual folder "{name}".' in out
    assert admin_api(hub, "GET", f"/vfolders/{fid}/shares")["total"] == 0

    # decline with the 26.09 CLI, then the hub's REST API (invite, list, decline, accept,
    # withdraw)
    bob = bob26
    b_email = bob.user["email"]
    name2 = f"inv2-{uuid.uuid4().hex[:6]}"
    alice("vfolder", "create", name2, "local:volume1")
    fid2 = admin_api(hub, "GET", "/vfolders", params={"name": name2})["items"][0]["id"]
    alice("vfolder", "invite", "-p", "rw", name2, b_email)
    out = bob("vfolder", "invitations", answer="1\nr\n")
    assert f"vfolder invitation rejected: {name2}" in out, out
    assert admin_api(hub, "GET", f"/vfolders/{fid2}/shares")["total"] == 0
    a_api, b_api = alice.user["client"], bob.user["client"]
    assert b_api.ok("GET", "/vfolder-invitations")["total"] == 0
    inv = a_api.ok("POST", f"/vfolders/{fid2}/invitations",
                   json={"email": b_email, "permission": "wd"})
    assert (inv["state"], inv["permission"], inv["invitee"]) == ("pending", "wd", b_email)
    listed = b_api.ok("GET", "/vfolder-invitations")
    assert [i["id"] for i in listed["items"]] == [inv["id"]] and listed["total"] == 1
    r = a_api("POST", f"/vfolder-invitations/{inv['id']}/accept")  # not the invitee
    assert r.status_code == 404
    out = b_api.ok("POST", f"/vfolder-invitations/{inv['id']}/decline", status=200)
    assert out["state"] == "rejected"
    r = b_api("POST", f"/vfolder-invitations/{inv['id']}/accept")
    assert r.status_code == 409
    inv = a_api.ok("POST", f"/vfolders/{fid2}/invitations", json={"email": b_email})
    out = a_api.ok("POST", f"/vfolder-invitations/{inv['id']}/decline", status=200)
    assert out["state"] == "canceled"
    inv = a_api.ok("POST", f"/vfolders/{fid2}/invitations", json={"email": b_email})
    out = b_api.ok("POST", f"/vfolder-invitations/{inv['id']}/accept", status=200)
    assert out["state"] == "accepted"
    shares = admin_api(hub, "GET", f"/vfolders/{fid2}/shares")["items"]
    assert [(s["email"], s["permission"]) for s in shares] == [(b_email, "ro")]
    r = b_api("POST", f"/vfolders/{fid2}/invitations", json={"email": c_email})
    assert r.status_code == 403  # only the owner invites
    r = a_api("POST", f"/vfolders/{fid2}/invitations", json={"email": "x@y"})
    assert r.status_code == 400
    assert b_api.ok("GET", "/vfolder-invitations")["total"] == 0
    alice("vfolder", "delete", name)
    alice("vfolder", "delete", name2)


def test_admin_commands_through_graphql(hub, alice, tmp_path):
    """`backend.ai admin ... list/info`: GraphQL resolved by the admin API's services, with
    its rules (a user sees only what the admin API shows them)."""
    sa = superadmin(hub)
    root = BAI(hub, new_user(sa, role="superadmin", name=f"root-{uuid.uuid4().hex[:6]}"),
               str(tmp_path))
    pname = f"grp-{uuid.uuid4().hex[:6]}"
    proj = sa.ok("POST", "/projects", json={"name": pname, "domain_name": "default",
                                            "description": "a project"})
    out = root("admin", "domain", "info", "default")
    assert re.search(r"Name\s+default\n", out) and '"local:volume1": ["create-vfolder"' in out
    out = root("admin", "group", "list")
    assert re.search(rf"{uuid.UUID(proj['id'])}\s+{pname}\s+True", out), out
    out = root("admin", "group", "info", pname)
    assert re.search(r"Description\s+a project\n", out) and re.search(
        r"Domain Name\s+default\n", out), out
    out = root("admin", "user", "list")
    assert alice.user["email"] in out and "admin@example.com" in out
    out = root("admin", "user", "info", "-e", alice.user["email"])
    assert re.search(rf"UUID\s+{uuid.UUID(alice.user['id'])}\n", out)
    assert re.search(rf"Main Access Key\s+{alice.user['keypair']['access_key']}\n", out), out
    out = root("admin", "keypair", "list")
    assert alice.user["keypair"]["access_key"] in out and "admin@example.com" in out
    out = root("admin", "keypair-resource-policy", "info", "default")
    assert re.search(r"Name\s+default\n", out), out
    out = root("admin", "scaling-group", "info", "default")
    assert re.search(r"Scheduler\s+fifo\n", out) and re.search(r"Active\?\s+True\n", out), out
    out = root("admin", "storage", "info", "local:volume1")
    assert re.search(r"Backend\s+vfs\n", out) and hub.volume_path in out, out
    # the 26.09 client reads the same fields (and a few more)
    root26 = BAI(hub, root.user, str(tmp_path), cli=CLI26)
    out = root26("admin", "keypair-resource-policy", "list")
    assert re.search(r"\ndefault\s", out), out
    out = root26("admin", "user", "list")
    assert alice.user["email"] in out and "admin@example.com" in out
    # a user: only what the admin API shows them
    out = alice("admin", "user", "list")
    assert alice.user["email"] in out and "admin@example.com" not in out
    out = alice("admin", "keypair", "list")
    assert alice.user["keypair"]["access_key"] in out and "admin@example.com" not in out
    out = alice("admin", "keypair-resource-policy", "list", rc=1)
    assert "you may not read resource policies" in out
    out = alice("admin", "storage", "list")
    assert "local:volume1" in out and hub.volume_path not in out
    # unknown names: the CLI fails with the reason
    out = root("admin", "group", "info", "no-such-group", rc=1)
    assert "no group (project) 'no-such-group'" in out
    out = root("admin", "storage", "info", "nope:vol", rc=1)
    assert "no storage volume 'nope:vol'" in out


def test_admin_mutations(hub, alice, tmp_path):
    """`backend.ai admin domain add/update/purge`, `admin user add/update`, `admin keypair
    add/update/deactivate/delete`, `admin keypair-resource-policy` and `admin scaling-group`
    add/update/delete: GraphQL mutations resolved by the admin REST API's services and rules; the platform's state
    checked afterwards through the REST API; refusals and bad input leave nothing."""
    sa = superadmin(hub)
    root = BAI(hub, new_user(sa, role="superadmin", name=f"rootm-{uuid.uuid4().hex[:6]}"),
               str(tmp_path))
    name = f"bob-{uuid.uuid4().hex[:6]}"
    email = f"{name}@example.com"
    out = root("admin", "user", "add", "default", email, "pw-bob-1", "-u", name,
               "-n", "Bob B", "-r", "admin")
    assert re.search(r"ok\s+True\n", out) and re.search(rf"username\s+{name}\n", out), out
    [bob] = sa.ok("GET", "/users", params={"email": email})["items"]
    assert re.search(rf"uuid\s+{uuid.UUID(bob['id'])}\n", out), out
    assert (bob["username"], bob["role"], bob["full_name"], bob["domain_name"]) == (
        name, "admin", "Bob B", "default")
    out = root("admin", "user", "update", email, "-n", "Robert B",
               "--need-password-change", "true")
    assert re.search(r"ok\s+True\n", out), out
    bob = sa.ok("GET", f"/users/{bob['id']}")
    assert bob["full_name"] == "Robert B" and bob["need_password_change"] is True
    # bad input: the reason, nothing made or changed
    out = root("admin", "user", "add", "default", "not-an-email", "pw-long-enough", rc=1)
    assert "email: 'not-an-email' is not an email address" in out, out
    out = root("admin", "user", "add", "nodomain", f"x-{name}@example.com", "pw-long-enough",
               rc=1)
    assert "domain_name: no domain 'nodomain'" in out, out
    assert sa.ok("GET", "/users", params={"email": f"x-{name}@example.com"})["items"] == []
    # a user: the admin API's refusal, nothing made or changed
    out = alice("admin", "user", "add", "default", f"y-{name}@example.com",
                "pw-long-enough", rc=1)
    assert "you may not create users in domain 'default'" in out, out
    assert sa.ok("GET", "/users", params={"email": f"y-{name}@example.com"})["items"] == []
    out = alice("admin", "user", "update", email, "-n", "Mallory", rc=1)
    assert f"no user {email!r}" in out, out
    assert sa.ok("GET", f"/users/{bob['id']}")["full_name"] == "Robert B"

    # keypairs
    out = root("admin", "keypair", "add", email, "default", "-r", "777")
    ak = re.search(r"access_key\s+(\S+)\n", out).group(1)
    secret = re.search(r"secret_key\s+(\S+)\n", out).group(1)
    kp = sa.ok("GET", f"/keypairs/{ak}")
    assert kp["user_id"] == bob["id"] and kp["rate_limit"] == 777 and kp["is_active"], kp
    # the new keypair signs requests as bob
    bob_cli = BAI(hub, {"keypair": {"access_key": ak, "secret_key": secret}}, str(tmp_path))
    assert email in bob_cli("admin", "user", "info")
    # (23.09's `update --is-active false` sends true: bool("false"); `deactivate` sends false)
    out = root("admin", "keypair", "update", ak, "-r", "900")
    assert re.search(r"ok\s+True\n", out), out
    out = root("admin", "keypair", "deactivate", ak)
    assert "deactivated" in out.lower() or re.search(r"ok\s+True\n", out), out
    kp = sa.ok("GET", f"/keypairs/{ak}")
    assert kp["is_active"] is False and kp["rate_limit"] == 900, kp
    out = root("admin", "keypair", "update", ak, "--resource-policy", "no-such-policy", rc=1)
    assert "resource_policy: no keypair resource policy 'no-such-policy'" in out, out
    out = root("admin", "keypair", "add", f"nobody-{name}@example.com", "default", rc=1)
    assert f"no user 'nobody-{name}@example.com'" in out, out
    # a user may not raise their own limits, nor touch others' keypairs
    own = alice.user["keypair"]["access_key"]
    out = alice("admin", "keypair", "update", own, "-r", "99999", rc=1)
    assert "rate_limit: you may not change it; an admin can" in out, out
    assert sa.ok("GET", f"/keypairs/{own}")["rate_limit"] != 99999
    out = alice("admin", "keypair", "delete", ak, rc=1)
    assert f"no keypair {ak!r}" in out, out
    out = root("admin", "keypair", "delete", ak)
    assert re.search(r"ok\s+True\n", out), out
    assert sa("GET", f"/keypairs/{ak}").status_code == 404
    main = alice.user["keypair"]["access_key"]
    out = root("admin", "keypair", "delete", main, rc=1)
    assert "is the user's main keypair" in out, out
    assert sa.ok("GET", f"/keypairs/{main}")["is_active"]
    sa.ok("DELETE", f"/users/{bob['id']}")
    # domains (superadmins only): add, update, delete (deactivates), purge
    dname = f"dom-{uuid.uuid4().hex[:6]}"
    out = root("admin", "domain", "add", dname, "-d", "a domain",
               "--vfolder-host-perms", '{"local:volume1": ["create-vfolder"]}')
    assert re.search(r"ok\s+True\n", out) and re.search(rf"name\s+{dname}\n", out), out
    d = sa.ok("GET", f"/domains/{dname}")
    assert d["description"] == "a domain" and d["is_active"], d
    assert d["allowed_vfolder_hosts"] == {"local:volume1": ["create-vfolder"]}, d
    out = root("admin", "domain", "update", dname, "--description", "changed")
    assert re.search(r"ok\s+True\n", out), out
    assert sa.ok("GET", f"/domains/{dname}")["description"] == "changed"
    out = root("admin", "domain", "delete", dname)
    assert re.search(r"ok\s+True\n", out), out
    assert sa.ok("GET", f"/domains/{dname}")["is_active"] is False
    out = root("admin", "domain", "add", "Bad Name!", rc=1)
    assert "name: must be 1 to 64 letters, digits" in out, out
    out = root("admin", "domain", "add", f"x{dname}", "--total-resource-slots", '{"cpu": -1}',
               rc=1)
    assert "total_resource_slots.cpu must not be negative" in out, out
    assert sa("GET", f"/domains/x{dname}").status_code == 404
    out = alice("admin", "domain", "add", f"y{dname}", rc=1)
    assert "you may not create domains" in out, out
    assert sa("GET", f"/domains/y{dname}").status_code == 404
    out = root("admin", "domain", "purge", dname, answer="y\n")
    assert re.search(r"ok\s+True\n", out), out
    assert sa("GET", f"/domains/{dname}").status_code == 404
    # keypair resource policies (superadmins): add, update, delete
    pol = f"pol-{uuid.uuid4().hex[:6]}"
    out = root("admin", "keypair-resource-policy", "add", pol,
               "--total-resource-slots", '{"cpu": "4", "mem": "8g"}',
               "--max-concurrent-sessions", "3")
    assert re.search(r"ok\s+True\n", out) and re.search(rf"name\s+{pol}\n", out), out
    r = sa.ok("GET", f"/keypair-resource-policies/{pol}")
    assert r["max_concurrent_sessions"] == 3 and r["total_resource_slots"]["cpu"] == "4", r
    assert r["idle_timeout"] == 1800 and r["default_for_unspecified"] == "UNLIMITED", r
    out = root("admin", "keypair-resource-policy", "update", pol, "--max-concurrent-sessions",
               "5", "--idle-timeout", "600")
    assert re.search(r"ok\s+True\n", out), out
    r = sa.ok("GET", f"/keypair-resource-policies/{pol}")
    assert (r["max_concurrent_sessions"], r["idle_timeout"]) == (5, 600), r
    out = root("admin", "keypair-resource-policy", "add", f"x{pol}",
               "--default-for-unspecified", "SOMETIMES", rc=1)
    assert "default_for_unspecified: " in out and "SOMETIMES" in out, out
    assert sa("GET", f"/keypair-resource-policies/x{pol}").status_code == 404
    out = alice("admin", "keypair-resource-policy", "update", pol, "--idle-timeout", "1", rc=1)
    assert f"you may not change the keypair resource policy '{pol}'" in out, out
    assert sa.ok("GET", f"/keypair-resource-policies/{pol}")["idle_timeout"] == 600
    out = root("admin", "keypair-resource-policy", "delete", pol, answer="y\n")
    assert re.search(r"ok\s+True\n", out), out
    assert sa("GET", f"/keypair-resource-policies/{pol}").status_code == 404
    # scaling groups = resource groups (superadmins): add, update, delete
    rg = f"rg-{uuid.uuid4().hex[:6]}"
    out = root("admin", "scaling-group", "add", rg, "-d", "a group", "--private")
    assert re.search(r"ok\s+True\n", out) and re.search(rf"name\s+{rg}\n", out), out
    g = sa.ok("GET", f"/resource-groups/{rg}")
    assert g["description"] == "a group" and g["is_public"] is False and g["is_active"], g
    out = root("admin", "scaling-group", "update", rg, "--scheduler", "drf",
               "--scheduler-opts", '{"pending_timeout": 60}')
    assert re.search(r"ok\s+True\n", out), out
    g = sa.ok("GET", f"/resource-groups/{rg}")
    assert g["scheduler"] == "drf" and g["scheduler_opts"]["pending_timeout"] == 60, g
    out = root("admin", "scaling-group", "update", rg, "--scheduler", "random", rc=1)
    assert "scheduler: 'random' is not one of ['fifo', 'lifo', 'drf']" in out, out
    out = root("admin", "scaling-group", "update", rg, "--wsproxy-addr", "http://x:5050", rc=1)
    assert "wsproxy_addr: no wsproxy here" in out, out
    assert sa.ok("GET", f"/resource-groups/{rg}")["scheduler"] == "drf"
    before = sa.ok("GET", "/resource-groups/default")["description"]
    out = alice("admin", "scaling-group", "update", "default", "-d", "mine", rc=1)
    assert "you may not change resource groups" in out, out
    assert sa.ok("GET", "/resource-groups/default")["description"] == before
    out = alice("admin", "scaling-group", "delete", rg, rc=1)
    assert f"no resource group {rg!r}" in out, out  # a private group she may not use
    out = root("admin", "scaling-group", "delete", rg, answer="y\n")
    assert re.search(r"ok\s+True\n", out), out
    assert sa("GET", f"/resource-groups/{rg}").status_code == 404


SDK23 = """
import json, sys
from ai.backend.client.session import Session
args = json.loads(sys.argv[1])
out = []
with Session() as s:
    for call, kw in args:
        if call == "gql":
            out.append(s.Admin.query(kw["query"], kw["variables"]))
        else:
            obj, meth = call.split(".")
            out.append(getattr(getattr(s, obj), meth)(**kw))
print(json.dumps(out))
"""


def sdk23(cli: BAI, calls: list) -> list:
    """The 23.09 SDK's own functions (for what its CLI does not offer), in one process."""
    import json

    py = os.path.join(os.path.dirname(CLI), "python")
    p = subprocess.run([py, "-c", SDK23, json.dumps(calls)], env=cli.env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


def test_admin_mutations_the_hub_mirrors(hub, alice, tmp_path):
    """`backend.ai admin group` add/update/delete/purge/add-users/remove-users, `admin user
    update -s/-r`, `delete`, `purge`, `admin domain update --is-active false`/`delete`, and
    `admin scaling-group` associate/dissociate: the same services as the REST API
    (api/hubsync.py), so JupyterHub follows (its groups, admin flags and accounts; a
    deactivation ends sessions, tokens and logins). Checked through the REST API and
    JupyterHub's own API; refusals (a user, a domain admin, bad input) leave nothing."""
    sa = superadmin(hub)
    x = uuid.uuid4().hex[:6]
    root = BAI(hub, new_user(sa, role="superadmin", name=f"rooth-{x}"), str(tmp_path))
    dadmin = BAI(hub, new_user(sa, role="admin", name=f"dadm-{x}"), str(tmp_path))
    carol = new_user(sa, name=f"carol-{x}")
    dave = new_user(sa, name=f"dave-{x}")
    parked = sa.ok("POST", "/resource-groups", json={"name": f"parked-{x}"})["name"]
    ok = re.compile(r"ok\s+True\n")

    def hub_group(name):
        r = hub.api("GET", f"/groups/default:{name}")
        return r.json()["users"] if r.status_code == 200 else None

    def project(name):
        items = sa.ok("GET", "/projects", params={"name": name})["items"]
        return items[0] if items else None

    # -- groups (projects): add, rename, members; the hub group follows --
    ga, gb = f"ga-{x}", f"gb-{x}"
    out = root("admin", "group", "add", "default", ga, "-d", "group a")
    assert ok.search(out) and re.search(rf"name\s+{ga}\n", out), out
    pa = project(ga)
    assert pa["description"] == "group a" and pa["is_active"] and hub_group(ga) == [], pa
    assert re.search(rf"id\s+{uuid.UUID(pa['id'])}\n", out), out
    out = dadmin("admin", "group", "add", "default", gb)  # a domain admin, in their domain
    assert ok.search(out), out
    pb = project(gb)
    assert hub_group(gb) == []
    gid_a = str(uuid.UUID(pa["id"]))
    out = root("admin", "group", "add-users", gid_a, str(uuid.UUID(carol["id"])), dave["id"])
    assert ok.search(out), out
    members = sa.ok("GET", f"/projects/{pa['id']}/members")["items"]
    assert {m["id"] for m in members} == {carol["id"], dave["id"]}, members
    assert sorted(hub_group(ga)) == sorted([carol["username"], dave["username"]])
    ga2 = f"ga2-{x}"
    out = root("admin", "group", "update", gid_a, "-n", ga2, "-d", "renamed")
    assert ok.search(out), out
    assert (sa.ok("GET", f"/projects/{pa['id']}")["name"], project(ga2)["description"]) == (
        ga2, "renamed")
    assert hub_group(ga) is None and sorted(hub_group(ga2)) == sorted(
        [carol["username"], dave["username"]])
    out = root("admin", "group", "remove-users", gid_a, dave["id"])
    assert ok.search(out), out
    assert hub_group(ga2) == [carol["username"]]
    assert [m["id"] for m in sa.ok("GET", f"/projects/{pa['id']}/members")["items"]] == [
        carol["id"]]
    # refusals and bad input: the service's words, nothing made or changed (all or nothing)
    out = root("admin", "group", "add-users", gid_a, dave["id"], uuid.uuid4().hex, rc=1)
    assert "user_ids: no user" in out, out
    assert hub_group(ga2) == [carol["username"]]
    assert len(sa.ok("GET", f"/projects/{pa['id']}/members")["items"]) == 1
    out = root("admin", "group", "add", "default", "Bad Name!", rc=1)
    assert "name: must be 1 to 64 letters, digits" in out, out
    out = alice("admin", "group", "add", "default", f"gz-{x}", rc=1)
    assert "you may not create projects in domain 'default'" in out, out
    out = alice("admin", "group", "update", gid_a, "-n", f"gz-{x}", rc=1)
    assert f"no project {pa['id']!r}" in out, out
    assert project(f"gz-{x}") is None and hub_group(f"gz-{x}") is None
    # delete = deactivate: the project's live sessions end; purge: without sessions only
    sid = park_session(hub, {**carol, "project_ids": [pb["id"]]}, group=parked)
    out = root("admin", "group", "delete", str(uuid.UUID(pb["id"])))
    assert ok.search(out), out
    assert sa.ok("GET", f"/projects/{pb['id']}")["is_active"] is False
    s = wait_dead(hub, sid, timeout=30)
    assert s["status"] == "CANCELLED" and "was deactivated" in s["status_info"], s
    out = root("admin", "group", "purge", pb["id"], answer="y\n", rc=1)
    assert "has sessions; deactivate it instead" in out, out
    assert hub_group(gb) == [] and project(gb) is not None
    out = root("admin", "group", "purge", gid_a, answer="y\n")
    assert ok.search(out), out
    assert sa("GET", f"/projects/{pa['id']}").status_code == 404 and hub_group(ga2) is None

    # -- users: role (the hub's admin flag), status (sessions, tokens, login end), delete,
    # purge (the hub account goes) --
    out = root("admin", "user", "update", dave["email"], "-r", "superadmin")
    assert ok.search(out), out
    assert hub.api("GET", f"/users/{dave['username']}").json()["admin"] is True
    out = dadmin("admin", "user", "update", carol["email"], "-r", "superadmin", rc=1)
    assert "only superadmins may create or promote superadmins" in out, out
    out = dadmin("admin", "user", "update", dadmin.user["email"], "-s", "inactive", rc=1)
    assert "you cannot change your own role, status or domain" in out, out
    out = alice("admin", "user", "update", alice.user["email"], "-s", "inactive", rc=1)
    assert f"you may not change user {alice.user['username']!r}" in out, out
    out = alice("admin", "user", "delete", dave["email"], rc=1)
    assert f"no user {dave['email']!r}" in out, out
    out = root("admin", "user", "update", dave["email"], "-r", "user")
    assert hub.api("GET", f"/users/{dave['username']}").json()["admin"] is False
    assert sa.ok("GET", f"/users/{dave['id']}")["role"] == "user"
    assert dave["client"]("GET", "/whoami").status_code == 200
    sid = park_session(hub, dave, group=parked)
    out = root("admin", "user", "update", dave["email"], "-s", "inactive")
    assert ok.search(out), out
    s = wait_dead(hub, sid, timeout=30)
    assert s["status"] == "CANCELLED" and "is inactive" in s["status_info"], s
    assert dave["client"]("GET", "/whoami").status_code == 401  # tokens revoked
    r = hub.login(dave["email"], PASSWORD).last_login
    assert r.status_code == 403 and "not active" in r.text, r.text
    out = root("admin", "user", "delete", dave["email"])  # Backend.AI: status "deleted"
    assert ok.search(out), out
    assert sa.ok("GET", f"/users/{dave['id']}")["status"] == "deleted"
    assert hub.api("GET", f"/users/{dave['username']}").status_code == 200
    out = root("admin", "user", "purge", dave["email"], answer="y\n")
    assert ok.search(out), out
    assert sa("GET", f"/users/{dave['id']}").status_code == 404
    assert hub.api("GET", f"/users/{dave['username']}").status_code == 404

    # -- domains: update --is-active false / delete deactivate; its users are cut off --
    dname = f"domh-{x}"
    sa.ok("POST", "/domains", json={"name": dname})
    eve = new_user(sa, domain=dname, projects=[], name=f"eve-{x}")
    sid = park_session(hub, eve, group=parked)
    out = dadmin("admin", "domain", "update", dname, "--is-active", "false", rc=1)
    assert f"no domain {dname!r}" in out, out
    out = dadmin("admin", "domain", "update", "default", "--description", "mine", rc=1)
    assert "you may not change domains" in out, out
    out = root("admin", "domain", "update", dname, "--is-active", "false")
    assert ok.search(out), out
    assert sa.ok("GET", f"/domains/{dname}")["is_active"] is False
    s = wait_dead(hub, sid, timeout=30)
    assert s["status"] == "CANCELLED" and "was deactivated" in s["status_info"], s
    assert eve["client"]("GET", "/whoami").status_code == 401
    r = hub.login(eve["email"], PASSWORD).last_login
    assert r.status_code == 403 and "domain is not active" in r.text, r.text
    out = root("admin", "domain", "update", dname, "--is-active", "true")
    assert ok.search(out) and sa.ok("GET", f"/domains/{dname}")["is_active"] is True
    out = root("admin", "domain", "delete", dname)
    assert ok.search(out) and sa.ok("GET", f"/domains/{dname}")["is_active"] is False

    # -- scaling groups: associate with / dissociate from a domain, a group, a keypair
    # (a resource group's allowed_domains, allowed_projects, allowed_keypairs) --
    rg = f"rgh-{x}"
    sa.ok("POST", "/resource-groups", json={"name": rg, "is_public": False})
    out = alice("admin", "scaling-group", "info", rg, rc=1)
    assert f"no resource group {rg!r}" in out, out
    out = root("admin", "scaling-group", "associate-scaling-group", rg, "default")
    assert ok.search(out), out
    assert sa.ok("GET", f"/resource-groups/{rg}")["allowed_domains"] == ["default"]
    out = alice("admin", "scaling-group", "info", rg)  # now usable by her domain
    assert re.search(rf"Name\s+{rg}\n", out), out
    out = alice("admin", "scaling-group", "dissociate-scaling-group", rg, "default", rc=1)
    assert "you may not change resource groups" in out, out
    out = root("admin", "scaling-group", "associate-scaling-group", rg, "default", rc=1)
    assert f"scaling group {rg!r} is already associated with domain 'default'" in out, out
    out = root("admin", "scaling-group", "associate-scaling-group", rg, f"nodom-{x}", rc=1)
    assert f"allowed_domains: no domain 'nodom-{x}'" in out, out
    # (23.09's dissociate-scaling-group prints the answer's "scaling_group" item, which
    # its query does not ask for: it fails with KeyError after the change was made)
    out = root("admin", "scaling-group", "dissociate-scaling-group", rg, "default", rc=1)
    assert "KeyError: 'scaling_group'" in out, out
    assert sa.ok("GET", f"/resource-groups/{rg}")["allowed_domains"] == []
    alice("admin", "scaling-group", "info", rg, rc=1)
    # what the 23.09 CLI does not offer, through its SDK: groups and keypairs, a user's
    # group ids
    ak = carol["keypair"]["access_key"]
    kp_q = ("mutation($sg: String!, $ak: String!) { %s(scaling_group: $sg, "
            "access_key: $ak) { ok msg } }")
    res = sdk23(root, [
        ["ScalingGroup.associate_group", {"scaling_group": rg, "group_id": pb["id"]}],
        ["gql", {"query": kp_q % "associate_scaling_group_with_keypair",
                 "variables": {"sg": rg, "ak": ak}}],
        ["User.update", {"email": carol["email"], "group_ids": [pb["id"]]}],
    ])
    assert [r.get("ok", r.get("associate_scaling_group_with_keypair", {}).get("ok"))
            for r in res] == [True, True, True], res
    g = sa.ok("GET", f"/resource-groups/{rg}")
    assert (g["allowed_projects"], g["allowed_keypairs"]) == ([pb["id"]], [ak]), g
    assert sa.ok("GET", f"/users/{carol['id']}")["project_ids"] == [pb["id"]]
    assert hub_group(gb) == [carol["username"]]
    res = sdk23(alice, [
        ["ScalingGroup.dissociate_group", {"scaling_group": rg, "group_id": pb["id"]}],
        ["User.update", {"email": alice.user["email"], "group_ids": [pb["id"]]}],
    ])
    assert [r["ok"] for r in res] == [False, False], res
    assert sa.ok("GET", f"/resource-groups/{rg}")["allowed_projects"] == [pb["id"]]
    res = sdk23(root, [
        ["ScalingGroup.dissociate_group", {"scaling_group": rg, "group_id": pb["id"]}],
        ["gql", {"query": kp_q % "disassociate_scaling_group_with_keypair",
                 "variables": {"sg": rg, "ak": ak}}],
        ["User.update", {"email": carol["email"], "group_ids": []}],
    ])
    assert res[0]["ok"] and res[1]["disassociate_scaling_group_with_keypair"]["ok"], res
    g = sa.ok("GET", f"/resource-groups/{rg}")
    assert (g["allowed_projects"], g["allowed_keypairs"]) == ([], []), g
    assert hub_group(gb) == []
