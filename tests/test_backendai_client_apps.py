"""Backend.AI's local app proxy (issue 27): ``backend.ai app SESSION APP`` and ``apps``
with the official CLIs (23.9.10 and 26.9.6) against a running hub (Docker backend): a
local port forwarded over the hub's websocket TCP proxy to the session's Jupyter server,
pages, the contents API and a kernel's websocket fetched through it; another user's
session refused. The relay's HTTP rewriting is specified on its own below."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid

import pytest
import requests

from jupyterhub_backendai.api.compat.appproxy import HTTPRelay, _BadRequest
from jupyterhub_backendai.api.compat.execute import ACCESS_CHECK

from .api_world import PREFIX, new_user, superadmin
from .conftest import shutdown_hub
from .hub import Hub
from .services import free_port
from .test_backendai_client import BAI, CLI, CLI26, RES, admin_api, wait_dead

# -- the relay, alone ----------------------------------------------------------------------


def test_relay_puts_requests_under_the_server_with_the_owners_token():
    r = HTTPRelay("/user/a/s/", "/user/a/s/", "TOK")
    out = r.feed(b"GET /lab?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
                 b"Authorization: token theirs\r\n\r\n")
    assert out == (b"GET /user/a/s/lab?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
                   b"Authorization: token TOK\r\n\r\n")
    # the server's own links stay; the server's bare path too
    assert r.feed(b"GET /user/a/s/static/x.js HTTP/1.1\r\nHost: h\r\n\r\n").startswith(
        b"GET /user/a/s/static/x.js ")
    assert r.feed(b"GET /user/a/s HTTP/1.1\r\n\r\n").startswith(b"GET /user/a/s HTTP/1.1")
    # another app of the session: under <server>/<name>/
    t = HTTPRelay("/user/a/s/", "/user/a/s/tensorboard/", "TOK")
    assert t.feed(b"GET /data HTTP/1.1\r\n\r\n").startswith(
        b"GET /user/a/s/tensorboard/data HTTP/1.1")


def test_relay_passes_bodies_as_they_come_and_finds_the_next_request():
    r = HTTPRelay("/b/", "/b/", "T")
    # Content-Length, split anywhere: the body's bytes are not taken for a request head
    out = r.feed(b"POST /x HTTP/1.1\r\nContent-Length: 31\r\n\r\nGET /not-a-req")
    out += r.feed(b"uest HTTP/1.1\r\n\r\nGET /next HTTP/1.1\r\n\r\n")
    assert out.count(b"Authorization: token T") == 2
    assert b"GET /b/next HTTP/1.1" in out and b"GET /not-a-request HTTP/1.1\r\n\r\n" in out
    assert b"/b/not-a-request" not in out
    # chunked (with a trailer), then the next request
    r = HTTPRelay("/b/", "/b/", "T")
    body = b"5\r\nGET /\r\n3;ext=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"
    out = b"".join(r.feed(bytes([c])) for c in
                   b"PUT /f HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + body
                   + b"GET /after HTTP/1.1\r\n\r\n")
    assert body in out and b"GET /b/after HTTP/1.1" in out and out.count(b"token T") == 2
    # an upgrade: from there on, bytes as they come (a websocket's frames)
    r = HTTPRelay("/b/", "/b/", "T")
    out = r.feed(b"GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                 b"\x81\x05GET /")
    assert out.endswith(b"\r\n\r\n\x81\x05GET /") and r.feed(b"raw") == b"raw"


@pytest.mark.parametrize("head", [
    b"GET /x HTTP/2\r\n\r\n",
    b"GET /x\r\n\r\n",
    b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"GET /x HTTP/1.1\r\nno-colon\r\n\r\n",
    b"GET ftp://h/x HTTP/1.1\r\n\r\n",
    b"PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_relay_refuses_what_it_cannot_pass_on(head):
    with pytest.raises(_BadRequest):
        HTTPRelay("/b/", "/b/", "T").feed(head)


def test_relay_bounds_a_head():
    r = HTTPRelay("/b/", "/b/", "T")
    with pytest.raises(_BadRequest):
        for _ in range(80):
            r.feed(b"X-Long: " + b"a" * 1000 + b"\r\n")


# -- the CLIs against a hub ------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory, docker_image):
    for cli in (CLI, CLI26):
        assert os.access(cli, os.X_OK), (
            f"{cli} is missing: run scripts/install-backendai-clients.sh")
    url = f"sqlite:///{tmp_path_factory.mktemp('baiapps')}/backendai.sqlite"
    hub = Hub(db_url=url, backend="docker").start()
    yield hub
    shutdown_hub(hub)


@pytest.fixture(scope="module")
def alice(hub, tmp_path_factory):
    u = new_user(superadmin(hub), name=f"alice-{uuid.uuid4().hex[:6]}")
    return BAI(hub, u, str(tmp_path_factory.mktemp("alice-home")))


@pytest.fixture(scope="module")
def bob26(hub, tmp_path_factory):
    u = new_user(superadmin(hub), name=f"bob-{uuid.uuid4().hex[:6]}")
    return BAI(hub, u, str(tmp_path_factory.mktemp("bob-home")), cli=CLI26)


@contextlib.contextmanager
def app_proxy(bai: BAI, ref: str, app: str):
    """``backend.ai app REF APP -b 127.0.0.1:PORT`` running; yields its base URL once the
    CLI says it listens. Interrupted (Ctrl-C, as a user ends it) afterwards."""
    port = free_port()
    proc = subprocess.Popen([bai.exe, "app", ref, app, "-b", f"127.0.0.1:{port}"],
                            env={**bai.env, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    listening = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if f"127.0.0.1:{port}" in line:
                listening.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not listening.wait(0.2):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
    try:
        yield f"http://127.0.0.1:{port}", lines
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(10)


def _tokens(hub, bai: BAI) -> list[dict]:
    name = bai.user["username"]
    r = requests.get(f"{hub.base}/hub/api/users/{name}/tokens", timeout=30,
                     headers={"Authorization": f"token {bai.user['token']}"})
    assert r.status_code == 200, r.text
    return r.json()["api_tokens"]


def _run_in_kernel(base: str, server: str, code: str) -> str:
    """``code`` in a new Jupyter kernel of the server at ``base`` (through the forwarded
    port: the kernel's websocket is an upgraded connection of the relay); its stdout."""
    from websockets.sync.client import connect

    r = requests.post(f"{base}{server}api/kernels", json={}, timeout=60)
    assert r.status_code == 201, r.text
    kid = r.json()["id"]
    msg_id = uuid.uuid4().hex
    out = []
    with connect(f"ws{base[4:]}{server}api/kernels/{kid}/channels", open_timeout=60,
                 origin=base) as ws:
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": "t", "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False}}))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            m = json.loads(ws.recv(timeout=120))
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream":
                out.append(m["content"]["text"])
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                break
    requests.delete(f"{base}{server}api/kernels/{kid}", timeout=60)
    return "".join(out)


def test_app_forwards_a_sessions_jupyter_through_the_hub(hub, alice, bob26, tmp_path):
    """`apps -l` lists the session's apps; `app SESSION jupyter` forwards a local port
    through the hub: JupyterLab's page, the contents API (a file written through it is in
    the session) and a kernel's websocket work through it, with both clients; the token
    the hub made for it is gone once the CLI stops; another user's session refuses."""
    name = f"ap-{uuid.uuid4().hex[:6]}"
    out = alice("session", "create", "--name", name, *RES, hub.image)
    m = re.search(r"Session ID ([0-9a-f-]{36}) is created and ready\.", out)
    assert m, out
    dashed = m.group(1)
    username = alice.user["username"]
    hub.wait_ready(username, name)
    server = hub.server_model(username, name)["url"]  # /user/<name>/<server>/
    out = alice("apps", name, "-l")
    assert "This session provides the following app services: jupyter, tensorboard" in out
    tokens_before = len(_tokens(hub, alice))

    with app_proxy(alice, name, "jupyter") as (base, lines):
        assert f"is available at:\n  http://127.0.0.1:{base.rsplit(':', 1)[1]}/" in "".join(
            lines)
        r = requests.get(f"{base}/lab", timeout=60, allow_redirects=False)
        assert r.status_code == 200 and "JupyterLab" in r.text, (r.status_code, r.text[:500])
        # an API call that needs the owner's login: the hub's token answers for it
        r = requests.put(f"{base}/api/contents/via-app.txt", timeout=60, json={
            "type": "file", "format": "text", "content": "written through the app proxy"})
        assert r.status_code == 201, r.text
        r = requests.get(f"{base}{server}api/contents/via-app.txt", timeout=60)
        assert r.json()["content"] == "written through the app proxy"
        # the kernel's websocket (an upgraded connection) runs code in the session
        said = _run_in_kernel(base, server, "print(open('/home/work/via-app.txt').read())")
        assert said == "written through the app proxy\n", said
        # the hub's token is not the client's to see, and a token the client sends is
        # replaced by it (a wrong one does not matter)
        r = requests.get(f"{base}/api/contents", timeout=60,
                         headers={"Authorization": "token wrong"})
        assert r.status_code == 200 and "via-app.txt" in r.text
        assert len(_tokens(hub, alice)) > tokens_before
    deadline = time.monotonic() + 30
    while len(_tokens(hub, alice)) != tokens_before:
        assert time.monotonic() < deadline, _tokens(hub, alice)
        time.sleep(0.3)

    # the session's files: `session ls` and `session download` (both clients)
    out = alice("session", "ls", name)
    assert re.search(r"via-app\.txt\s+29 Bytes\s.*file rw", out), out
    for bai in (alice, BAI(hub, alice.user, str(tmp_path), cli=CLI26)):
        dest = tmp_path / f"dl-{os.path.basename(bai.cli)}-{uuid.uuid4().hex[:4]}"
        dest.mkdir()
        bai("session", "download", name, "via-app.txt", "/home/work/via-app.txt", cwd=str(dest))
        assert (dest / "via-app.txt").read_text() == "written through the app proxy"
    for bad, words in (("../etc/passwd", "only paths under /home/work"),
                       (".bashrc", "hidden files"), ("nothing-here.txt", "no file or directory")):
        out = alice("session", "download", name, bad, rc=1, cwd=str(tmp_path))
        assert words in out and "✘" in out, (bad, out)
    out = bob26("session", "download", dashed, "via-app.txt", rc=1, cwd=str(tmp_path))
    assert re.search(r"\b404\b", out), out
    assert not (tmp_path / "via-app.txt").exists()

    # the 26.09 client, by the session's id; another app: TensorBoard behind the server
    alice26 = BAI(hub, alice.user, str(tmp_path), cli=CLI26)
    with app_proxy(alice26, dashed, "jupyter") as (base, _):
        r = requests.get(f"{base}/api/status", timeout=60)
        assert r.status_code == 200 and "started" in r.json(), r.text
    with app_proxy(alice, name, "tensorboard") as (base, _):
        r = requests.get(f"{base}/", timeout=180)
        assert r.status_code == 200 and "TensorBoard" in r.text, r.text[:500]

    # another user's session: refused, nothing forwarded
    for bai in (bob26,):
        p = subprocess.run([bai.exe, "app", dashed, "jupyter", "-b", f"127.0.0.1:{free_port()}"],
                           env=bai.env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and re.search(r"\b404\b", p.stdout + p.stderr), p.stdout + p.stderr
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = f"ws{hub.base[4:]}{PREFIX}/stream/session/{dashed}/tcpproxy?app="

    def handshake(token: str, query: str = "jupyter") -> int:
        try:
            with connect(url + query, open_timeout=60,
                         additional_headers={"Authorization": f"token {token}"}):
                return 101
        except InvalidStatus as e:
            return e.response.status_code

    assert handshake(bob26.user["token"]) == 404
    assert handshake(superadmin(hub).token) == 404  # (an admin's too: the owner's only)
    # bad input: the reason, before anything is opened
    assert handshake(alice.user["token"], "nosuch") == 404
    assert handshake(alice.user["token"], 'jupyter&arguments={"--x":"1"}') == 400
    r = requests.get(f"{hub.base}{PREFIX}/stream/session/{dashed}/tcpproxy?app=nosuch",
                     headers={"Authorization": f"token {alice.user['token']}",
                              "Connection": "Upgrade", "Upgrade": "websocket",
                              "Sec-WebSocket-Version": "13",
                              "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, timeout=30)
    assert r.status_code == 404 and "offers: jupyter, tensorboard" in r.json()["title"], r.text
    assert handshake(alice.user["token"]) == 101

    # what the relay cannot pass on: 400 on the local connection, which then closes; and
    # an open tunnel ends when the keypair that opened it is deactivated
    with app_proxy(alice, name, "jupyter") as (base, _):
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"GET /api HTTP/2\r\nHost: x\r\n\r\n")
            answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 400 Bad Request") and b"HTTP/1.x" in answer, answer
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"GET /api/status HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "no answer"
            sock.settimeout(3 * ACCESS_CHECK)  # kept open while the access holds
            with pytest.raises(TimeoutError):
                sock.recv(65536)
            ak = alice.user["keypair"]["access_key"]
            admin_api(hub, "PATCH", f"/keypairs/{ak}", json={"is_active": False})
            try:
                sock.settimeout(30)
                assert _read_all(sock) == b""  # closed (the CLI closes its side too)
            finally:
                admin_api(hub, "PATCH", f"/keypairs/{ak}", json={"is_active": True})
    alice("session", "rm", name)
    assert wait_dead(hub, uuid.UUID(dashed).hex)["status"] == "TERMINATED"


def _read_all(sock: socket.socket) -> bytes:
    """What the peer sends until it closes (the socket's timeout bounds a hang)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out
