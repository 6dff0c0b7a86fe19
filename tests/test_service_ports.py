"""Issue 12: service ports of a real Docker session through jupyter-server-proxy, behind
the hub's login.

One hub per configuration for the module (single origin; subdomains with servers on
``<user>.localhost``), one server of alice's in each. Requests go to 127.0.0.1 with the
``Host`` header of the origin they stand for (``alice.localhost:<port>`` in subdomain
mode), which is what a browser resolving ``*.localhost`` to loopback sends.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import re
import shlex
import socket
import subprocess
import time
import urllib.parse
import uuid

import pytest
import requests
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from .conftest import containers_of, shutdown_hub
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub
from .services import image_tag
from .test_attacks_api import new_user
from .test_signing import signed

ECHO_PORT = 9100
HTTP_PORT = 9000
HELLO2_PORT = 9001
CLOSED_PORT = 9999
FRONT = "X-Backendai-App-Path"  # "front": the app front's fast path answered
XSS = "<img src=x onerror=alert(1)>"

# A websocket echo app a user would run in the session (tornado is in the image).
ECHO_APP = (
    "import asyncio, tornado.web, tornado.websocket\n"
    "class E(tornado.websocket.WebSocketHandler):\n"
    "    def on_message(self, m): self.write_message('echo:' + m)\n"
    "async def main():\n"
    f"    tornado.web.Application([(r'/.*', E)]).listen({ECHO_PORT}, '127.0.0.1')\n"
    "    await asyncio.Event().wait()\n"
    "asyncio.run(main())\n"
)


def wait_ports(*ports: int) -> str:
    """A shell command that waits (10 s at most each) until the kernel's loopback ports
    accept connections."""
    return (f"for p in {' '.join(map(str, ports))}; do for i in $(seq 100); do python -c"
            " \"import socket; socket.create_connection(('127.0.0.1',$p))\" 2>/dev/null"
            " && break; sleep 0.1; done; done")


class Server:
    """alice's server as seen from one origin."""

    def __init__(self, hub: Hub, host: str, prefix: str, token: str):
        self.hub, self.host, self.prefix, self.token = hub, host, prefix, token

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.hub.port}{self.prefix}{path}"

    def get(self, path: str, token: str | None = "owner", **kw) -> requests.Response:
        headers = {"Host": self.host, **kw.pop("headers", {})}
        if token == "owner":
            token = self.token
        if token:
            headers["Authorization"] = f"token {token}"
        return requests.get(self.url(path), headers=headers, allow_redirects=False,
                            timeout=120, **kw)

    def ws(self, path: str, token: str | None = "owner", cookies: str | None = None):
        if token == "owner":
            token = self.token
        headers = {}
        if token:
            headers["Authorization"] = f"token {token}"
        if cookies:
            headers["Cookie"] = cookies
        sock = socket.create_connection(("127.0.0.1", self.hub.port), timeout=30)
        return connect(f"ws://{self.host}{self.prefix}{path}", sock=sock,
                       additional_headers=headers, open_timeout=60,
                       origin=f"http://{self.host}")

    def terminal(self):
        r = requests.post(self.url("api/terminals"), headers={
            "Host": self.host, "Authorization": f"token {self.token}"}, timeout=60)
        assert r.status_code == 200, r.text
        return self.ws(f"terminals/websocket/{r.json()['name']}")

    def run(self, command: str, marker: str) -> str:
        """Run a shell command in a terminal; return the output up to ``marker``."""
        with self.terminal() as ws:
            ws.send(json.dumps(["stdin", command + "; echo " + marker[:2] + "''" + marker[2:]
                                + "\r"]))
            return read_until(ws, marker)


def read_until(ws, needle: str, timeout: float = 60) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} not seen in terminal output: {seen[-2000:]!r}"
        msg = json.loads(ws.recv(timeout=left))
        if msg[0] == "stdout":
            seen += msg[1]
    return seen


def start_hub(tmp_path_factory, subdomains: bool, front: bool = False) -> Hub:
    """``front``: with the app front (nginx before CHP, jupyterhub_backendai/appfront.py)."""
    from jupyterhub_backendai.cli import create_superadmin

    d = tmp_path_factory.mktemp("sp-sub" if subdomains else "sp-one")
    db_url = f"sqlite:///{d}/backendai.sqlite"
    admin = create_superadmin(db_url, ADMIN_EMAIL, ADMIN_PASSWORD)
    hub = Hub(db_url=db_url, backend="docker",
              extra_env={"BACKENDAI_APP_FRONT": "nginx"} if front else None)
    hub.front = front
    hub.admin_keys = (admin["access_key"], admin["secret_key"])
    if subdomains:
        origin = f"http://localhost:{hub.port}"
        hub.env["BACKENDAI_HUB_URL"] = origin + "/"
        hub.env["BACKENDAI_SUBDOMAIN_HOST"] = origin
    else:
        hub.env["BACKENDAI_SUBDOMAIN_HOST"] = ""
    try:
        hub.start()
    except Exception as e:
        hub.close()
        raise RuntimeError(f"hub did not start: {e}\n{hub.log()}") from e
    return hub


class Login:
    """A hub login by hand: requests go to 127.0.0.1 but name the hub's public host
    (``localhost:<port>`` in subdomain mode), cookies kept by name (requests' cookie jar
    mishandles "localhost")."""

    def __init__(self, hub: Hub, email: str, host: str, password: str = "victim-pass-1"):
        self.hub, self.host, self.cookies = hub, host, {}
        self.request("GET", "/hub/login")
        r = self.request("POST", "/hub/login", data={
            "username": email, "password": password, "_xsrf": self.cookies["_xsrf"]})
        assert r.status_code == 302 and "jupyterhub-session-id" in self.cookies, r.text[:500]

    def request(self, method: str, url: str, **kw) -> requests.Response:
        headers = {"Host": self.host, **kw.pop("headers", {})}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if url.startswith("/"):
            url = self.hub.base + url
        r = requests.request(method, url, headers=headers, allow_redirects=False,
                             timeout=60, **kw)
        self.cookies.update({c.name: c.value for c in r.cookies})
        return r

    def get_following(self, url: str, host: str) -> requests.Response:
        """GET through redirects (the OAuth dance) the way a browser would."""
        for _ in range(10):
            r = self.request("GET", url, headers={"Host": host})
            if r.status_code not in (301, 302, 303):
                return r
            loc = urllib.parse.urlsplit(urllib.parse.urljoin(f"http://{host}{url}"
                                        if url.startswith("/") else url, r.headers["Location"]))
            host = loc.netloc
            url = f"http://127.0.0.1:{self.hub.port}{loc.path}" + (
                f"?{loc.query}" if loc.query else "")
        raise AssertionError("redirect loop")


def mint_token(login: Login, user: str, scopes=None) -> str:
    body = {"note": "service ports test", **({"scopes": scopes} if scopes else {})}
    r = login.request("POST", f"/hub/api/users/{user}/tokens", json=body,
                      headers={"X-XSRFToken": login.cookies["_xsrf"]})
    assert r.status_code == 201, (r.status_code, r.text[:500])
    return r.json()["token"]


class World:
    def __init__(self, hub: Hub, subdomains: bool):
        self.hub = hub
        self.mode = ("subdomains" if subdomains else "single-origin") + (
            "+front" if hub.front else "")
        # Behind the app front, the ad-hoc apps listen on the container's address too,
        # where the front reaches them straight; otherwise on loopback only.
        self.front = hub.front
        bind = "0.0.0.0" if hub.front else "127.0.0.1"
        self.alice = new_user(hub)
        self.bob = new_user(hub)
        hub_host = f"localhost:{hub.port}" if subdomains else f"127.0.0.1:{hub.port}"
        self.alice_login = Login(hub, self.alice["email"], hub_host)
        self.bob_login = Login(hub, self.bob["email"], hub_host)
        a, b = self.alice["username"], self.bob["username"]
        self.alice_token = mint_token(self.alice_login, a)
        self.bob_token = mint_token(self.bob_login, b)
        # alice's own token without access:servers (it may read her name, nothing more).
        self.scopeless_token = mint_token(self.alice_login, a,
                                          scopes=[f"read:users:name!user={a}"])
        self.server_name = "sp" + uuid.uuid4().hex[:4]
        r = hub.spawn(a, self.server_name, token=self.alice_token)
        assert r.status_code in (201, 202), r.text
        model = hub.wait_ready(a, self.server_name, token=self.alice_token)
        url = urllib.parse.urlsplit(model["url"])
        if subdomains:
            host = f"{a}.localhost:{hub.port}"
            assert model["url"].startswith(f"http://{host}/"), model["url"]
        else:
            host = f"127.0.0.1:{hub.port}"
        self.server = Server(hub, host, url.path, self.alice_token)
        # The user's own apps: a websocket echo, a static file server, a second hello app.
        out = self.server.run(
            f"mkdir -p /tmp/www && echo served-by-http-server > /tmp/www/x.txt"
            f" && (nohup python -c \"{ECHO_APP}\" >/tmp/echo.log 2>&1 &)"
            f" && (nohup python -m http.server {HTTP_PORT} --bind {bind} --directory /tmp/www"
            f" >/tmp/http.log 2>&1 &)"
            f" && (nohup python /opt/backendai/hello_app.py --port {HELLO2_PORT} --host {bind}"
            f" >/tmp/h2.log 2>&1 &)"
            " && " + wait_ports(ECHO_PORT, HTTP_PORT, HELLO2_PORT), "APPS-UP")
        assert "APPS-UP" in out


def _world(tmp_path_factory, subdomains: bool, front: bool = False):
    hub = start_hub(tmp_path_factory, subdomains=subdomains, front=front)
    try:
        yield World(hub, subdomains=subdomains)
    finally:
        shutdown_hub(hub)


@pytest.fixture(scope="module")
def single(docker_image, tmp_path_factory):
    yield from _world(tmp_path_factory, subdomains=False)


@pytest.fixture(scope="module")
def subdomain(docker_image, tmp_path_factory):
    yield from _world(tmp_path_factory, subdomains=True)


@pytest.fixture(scope="module")
def single_front(docker_image, tmp_path_factory):
    yield from _world(tmp_path_factory, subdomains=False, front=True)


@pytest.fixture(scope="module")
def subdomain_front(docker_image, tmp_path_factory):
    yield from _world(tmp_path_factory, subdomains=True, front=True)


@pytest.fixture(params=["single-origin", "subdomains"])
def world(request):
    return request.getfixturevalue("single" if request.param == "single-origin" else "subdomain")


@pytest.fixture(params=["single-origin", "subdomains", "single-origin+front", "subdomains+front"])
def any_world(request):
    """The security tests' worlds: also behind the app front, whose fast path must refuse
    exactly what the full path refuses."""
    return request.getfixturevalue({
        "single-origin": "single", "subdomains": "subdomain",
        "single-origin+front": "single_front", "subdomains+front": "subdomain_front",
    }[request.param])


# -- the apps ------------------------------------------------------------------------


def test_custom_app_answers_through_its_path(single):
    r = single.server.get("hello/some/page?q=1")
    assert r.status_code == 200, r.text[:2000]
    assert "Hello from the Backend.AI session" in r.text
    # The app sees the path below its prefix (relative links keep working).
    assert "<code id='path'>/some/page?q=1</code>" in r.text
    info = single.server.get("hello/info.json").json()
    assert info["app"] == "hello" and info["uid"] != 0 and info["path"] == "/info.json"


def test_tensorboard_loads_with_the_configured_logdir(single):
    r = single.server.get("tensorboard/")
    assert r.status_code == 200, r.text[:2000]
    assert "<tf-tensorboard" in r.text or "TensorBoard" in r.text
    env = single.server.get("tensorboard/data/environment")
    assert env.status_code == 200, env.text[:500]
    assert env.json()["data_location"] == "/home/work/logs"


def test_no_tensorboard_log_folder_is_made_in_the_home(single):
    """TensorBoard's log directory (~/logs) is not made at start (issue 29: an
    unexplained folder in every home); TensorBoard serves the missing one as empty."""
    r = single.server.get("tensorboard/data/runs")
    assert r.status_code == 200 and r.json() == [], r.text[:500]
    home = single.server.get("api/contents/")
    assert home.status_code == 200, home.text[:500]
    assert "logs" not in [item["name"] for item in home.json()["content"]]


def test_tensorboards_root_paths_stay_below_its_prefix(single):
    """TensorBoard's page names its fonts from the host's root (``/font-roboto/``);
    through the proxy it names them relative to itself, and they load from there."""
    page = single.server.get("tensorboard/")
    assert page.status_code == 200, page.text[:500]
    assert "/font-roboto/" not in page.text
    fonts = re.findall(r"url\((font-roboto/[^)]+\.woff2)\)", page.text)
    assert fonts, page.text[:2000]
    font = single.server.get("tensorboard/" + fonts[0])
    assert font.status_code == 200 and font.content[:4] == b"wOF2", font.status_code


def test_the_status_bar_reports_the_sessions_own_use_against_its_limits(single):
    """jupyter-resource-usage (JupyterLab's status bar): the server's memory against the
    limit the kernel's cgroup enforces and its CPU against the session's cores, with
    nothing of the host's (issue 29)."""
    r = single.server.get("api/metrics/v1")
    assert r.status_code == 200, r.text[:500]
    m = r.json()
    out = single.server.run("echo LIMITS $(cat /sys/fs/cgroup/memory.max"
                            " /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null)"
                            " ${CPU_LIMIT:-none} OF-THE-KERNEL", "LIMITS-READ")
    found = re.search(r"LIMITS (\d+) ([\d.]+) OF-THE-KERNEL", out)
    assert found, out
    mem_max, cpu_limit = found.groups()
    assert m["limits"]["memory"]["rss"] == int(mem_max)
    assert 0 < m["rss"] < int(mem_max)
    assert m["limits"]["cpu"]["cpu"] == float(cpu_limit)
    assert "cpu_percent" in m
    assert "host_virtual_memory" not in m and "host_cpu_percent" not in m, sorted(m)


def test_code_editor_answers_through_its_path(single):
    """code-server (the image's "vscode" service port), started by jupyter-server-proxy on
    first use: its workbench page, then its own websocket (the editor's connection to
    its server) through the same path."""
    r = single.server.get("vscode/")
    for _ in range(3):  # code-server sends "./" on to "./?folder=/home/work"
        if r.status_code not in (301, 302):
            break
        loc = urllib.parse.urljoin(single.server.prefix + "vscode/", r.headers["Location"])
        r = single.server.get(loc[len(single.server.prefix):])
    assert r.status_code == 200, (r.status_code, r.text[:500])
    assert "workbench" in r.text, r.text[:500]
    # The page's JavaScript comes through the path too.
    m = re.search(r'src="([^"]*(?:nls|loader)[^"]*\.js)"', r.text)
    assert m, r.text[:2000]
    script = urllib.parse.urljoin(single.server.prefix + "vscode/", m.group(1))
    js = single.server.get(script[len(single.server.prefix):])
    assert js.status_code == 200 and js.content, (script, js.status_code)


def test_servers_info_lists_the_apps_with_launcher_tiles(single):
    r = single.server.get("server-proxy/servers-info")
    assert r.status_code == 200, r.text
    servers = {s["name"]: s for s in r.json()["server_processes"]}
    assert set(servers) == {"hello", "tensorboard", "vscode"}
    assert servers["tensorboard"]["launcher_entry"]["title"] == "TensorBoard"
    assert servers["vscode"]["launcher_entry"]["title"] == "VS Code (code-server)"
    assert servers["hello"]["launcher_entry"]["title"] == "Hello app"
    assert all(s["launcher_entry"]["enabled"] for s in servers.values())


def test_terminal_websocket_echoes(single):
    with single.server.terminal() as ws:
        ws.send(json.dumps(["stdin", "echo sp-$((6*7))\r"]))
        assert "sp-42" in read_until(ws, "sp-42")


def test_adhoc_app_at_proxy_port_and_absolute(single):
    r = single.server.get(f"proxy/{HTTP_PORT}/x.txt")
    assert (r.status_code, r.text) == (200, "served-by-http-server\n")
    # /proxy/<port>/ strips the prefix, /proxy/absolute/<port>/ keeps it.
    rel = single.server.get(f"proxy/{HELLO2_PORT}/info.json").json()
    assert rel["path"] == "/info.json"
    ab = single.server.get(f"proxy/absolute/{HELLO2_PORT}/info.json").json()
    assert ab["path"] == f"{single.server.prefix}proxy/absolute/{HELLO2_PORT}/info.json"


def test_closed_port_gives_a_502_page_that_says_so(single):
    for path in (f"proxy/{CLOSED_PORT}/", f"proxy/absolute/{CLOSED_PORT}/x"):
        r = single.server.get(path)
        assert r.status_code == 502, (path, r.status_code, r.text[:1000])
        assert r.headers["Content-Type"].startswith("text/html")
        assert f"nothing is listening on port {CLOSED_PORT}" in r.text
        assert f"No app answers on port {CLOSED_PORT} in this session." in r.text


def test_proxied_websocket_echoes(single):
    with single.server.ws(f"proxy/{ECHO_PORT}/") as ws:
        ws.send("ping")
        assert ws.recv(timeout=30) == "echo:ping"


# -- security --------------------------------------------------------------------------

HTTP_TARGETS = ["hello/", "tensorboard/", f"proxy/{HTTP_PORT}/x.txt",
                f"proxy/absolute/{HELLO2_PORT}/"]


def _refused_http(r: requests.Response, world) -> None:
    """Not the app: 401/403, or (anonymous GET) a redirect into the hub's login."""
    assert "served-by-http-server" not in r.text and "Hello from" not in r.text
    if r.status_code in (301, 302):
        loc = r.headers["Location"]
        assert "/hub/api/oauth2/authorize" in loc or "/hub/login" in loc, loc
    else:
        assert r.status_code in (401, 403), (r.status_code, r.text[:500])


def test_owner_reaches_every_app(any_world):
    world = any_world
    for path in HTTP_TARGETS:
        r = world.server.get(path)
        assert r.status_code == 200, (world.mode, path, r.status_code, r.text[:500])
        # Behind the front, the apps on ports go the fast way; named apps the full way.
        assert (r.headers.get(FRONT) == "front") == (world.front and "proxy/" in path), (
            world.mode, path, r.headers)
    with world.server.ws(f"proxy/{ECHO_PORT}/") as ws:
        ws.send("x")
        assert ws.recv(timeout=30) == "echo:x"


@pytest.mark.parametrize("who", ["anonymous", "other-user", "token-without-access-servers",
                                 "bogus-token"])
def test_http_to_service_ports_needs_the_hubs_auth(any_world, who):
    world = any_world
    token = {"anonymous": None, "other-user": world.bob_token,
             "token-without-access-servers": world.scopeless_token,
             "bogus-token": "x" * 32}[who]
    for path in HTTP_TARGETS:
        r = world.server.get(path, token=token)
        _refused_http(r, world)
        assert FRONT not in r.headers, (who, path, r.headers)
        if who != "anonymous":
            assert r.status_code == 403 or (r.status_code == 302 and who == "bogus-token"), (
                who, path, r.status_code)
        # Nor can a client put the front's question itself (behind the front nginx drops
        # the header; without it the server answers 409: the question names no server).
        r = world.server.get(path, token=token, headers={"X-Backendai-Auth-Probe": "GET"})
        assert "served-by-http-server" not in r.text and "Hello from" not in r.text
        assert r.status_code in (302, 401, 403, 409), (who, path, r.status_code)
        # Non-GET methods are refused outright (no login redirect).
        r = requests.post(world.server.url(path), headers={
            "Host": world.server.host, **({"Authorization": f"token {token}"} if token else {})},
            allow_redirects=False, timeout=60)
        assert r.status_code in (401, 403), (who, path, r.status_code)


@pytest.mark.parametrize("who", ["anonymous", "other-user", "token-without-access-servers",
                                 "bogus-token"])
def test_websocket_to_service_ports_needs_the_hubs_auth(any_world, who):
    """CVE-2024-28179: jupyter-server-proxy once proxied websockets without checking the
    user. Both a proxied app's websocket and the terminal's are refused."""
    world = any_world
    token = {"anonymous": None, "other-user": world.bob_token,
             "token-without-access-servers": world.scopeless_token,
             "bogus-token": "x" * 32}[who]
    for path in (f"proxy/{ECHO_PORT}/", f"proxy/absolute/{ECHO_PORT}/", "terminals/websocket/1"):
        with pytest.raises(InvalidStatus) as e:
            with world.server.ws(path, token=token) as ws:
                ws.send("x")
                pytest.fail(f"{who} got a websocket on {path}: {ws.recv(timeout=5)!r}")
        assert e.value.response.status_code in (401, 403), (who, path, e.value.response)


def test_other_users_login_cookie_does_not_open_alices_apps(any_world):
    """bob, logged in to the hub, follows a link to alice's app: the hub's OAuth refuses
    to give him a cookie for her server."""
    world = any_world
    url = world.server.url("hello/")
    r = world.bob_login.get_following(url, world.server.host)
    assert r.status_code == 403, (r.status_code, r.url, r.text[:500])
    assert "Hello from" not in r.text
    # alice, logged in the same way, gets her app.
    r = world.alice_login.get_following(url, world.server.host)
    assert r.status_code == 200 and "Hello from the Backend.AI session" in r.text


def test_a_server_shared_through_the_hub_opens_its_apps_to_that_user(any_world):
    """JupyterHub's sharing is the one way to let another user in: once alice's server is
    shared with bob, his token and his browser login reach her apps (HTTP and websocket);
    once the share is revoked, a token of his is refused again. Fresh credentials each
    time: the server caches what a token or login may do (HubAuth's cache_max_age)."""
    world = any_world
    hub = world.hub
    a, b = world.alice["username"], world.bob["username"]
    admin = mint_token(Login(hub, ADMIN_EMAIL, world.bob_login.host, ADMIN_PASSWORD), "admin")
    r = hub.api("POST", f"/shares/{a}/{world.server_name}", token=admin, json={"user": b})
    assert r.status_code in (200, 201), r.text
    try:
        token = mint_token(world.bob_login, b)
        r = world.server.get("hello/", token=token)
        assert r.status_code == 200 and "Hello from the Backend.AI session" in r.text, (
            r.status_code, r.text[:500])
        r = world.server.get(f"proxy/{HTTP_PORT}/x.txt", token=token)
        assert r.status_code == 200 and "served-by-http-server" in r.text, r.status_code
        assert (r.headers.get(FRONT) == "front") == world.front
        with world.server.ws(f"proxy/{ECHO_PORT}/", token=token) as ws:
            ws.send("shared")
            assert ws.recv(timeout=30) == "echo:shared"
        login = Login(hub, world.bob["email"], world.bob_login.host)
        r = login.get_following(world.server.url("hello/"), world.server.host)
        # Someone else's server: the hub asks bob once to let it identify him.
        assert r.status_code == 200 and "Authorize access" in r.text, r.text[:500]
        form = re.findall(r'name="(_xsrf|scopes)" value="([^"]*)"', r.text)
        r = login.request("POST", r.url, data=[(k, html.unescape(v)) for k, v in form],
                          headers={"Host": login.host})
        assert r.status_code == 302, (r.status_code, r.text[:500])
        loc = urllib.parse.urlsplit(urllib.parse.urljoin(f"http://{login.host}/",
                                                         r.headers["Location"]))
        r = login.get_following(f"http://127.0.0.1:{hub.port}{loc.path}?{loc.query}",
                                loc.netloc)
        assert r.status_code == 200 and "Hello from the Backend.AI session" in r.text, (
            r.status_code, r.text[:500])
    finally:
        r = hub.api("DELETE", f"/shares/{a}/{world.server_name}", token=admin)
        assert r.status_code in (200, 204), r.text
    token = mint_token(world.bob_login, b)
    for path in ("hello/", f"proxy/{HTTP_PORT}/x.txt"):
        r = world.server.get(path, token=token)
        assert r.status_code == 403, (path, r.status_code, r.text[:500])
    with pytest.raises(InvalidStatus) as e:
        with world.server.ws(f"proxy/{ECHO_PORT}/", token=token):
            pass
    assert e.value.response.status_code == 403


def test_the_image_runs_the_pinned_jupyter_server_proxy(single):
    """Pinned (the hub's CI pins and the image's) at a release with the fixes for
    CVE-2024-28179 (4.1.1) and CVE-2024-35225 (4.2.0); the session runs exactly it."""
    root = __file__.rsplit("/tests/", 1)[0]
    pins = set()
    for path in ("requirements/ci.txt", "images/kernel/requirements.txt"):
        with open(f"{root}/{path}") as f:
            pins |= {ln.split("==", 1)[1].split()[0] for ln in f
                     if ln.lower().startswith("jupyter-server-proxy==")}
    assert len(pins) == 1, pins
    [pin] = pins
    assert tuple(int(x) for x in pin.split(".")[:2]) >= (4, 2), pin
    [cid] = containers_of(single.hub.agent_id)
    out = subprocess.run(["docker", "exec", cid, "python", "-c",
                          "import importlib.metadata as m;"
                          "print(m.version('jupyter-server-proxy'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == pin


@pytest.mark.parametrize("host", ["169.254.169.254:80", "172.17.0.1:80", "example.org:80",
                                  "10.0.0.1:8888"])
def test_proxy_to_other_hosts_is_refused(single, host):
    """host_allowlist stays the kernel itself: no other kernel, the hub, the metadata
    service or the internet through /proxy/<host>:<port>/."""
    r = single.server.get(f"proxy/{host}/")
    assert r.status_code == 403, (host, r.status_code, r.text[:500])
    assert "is not allowed" in r.text
    # The websocket: refused at the handshake, or closed before anything is relayed
    # (jupyter-server-proxy checks the host after the upgrade).
    try:
        with single.server.ws(f"proxy/{host}/") as ws:
            with pytest.raises(ConnectionClosed):
                ws.send("x")
                pytest.fail(f"relayed from {host}: {ws.recv(timeout=30)!r}")
    except InvalidStatus as e:
        assert e.response.status_code == 403


def test_host_segment_is_not_reflected_as_html(single):
    """CVE-2024-35225: the host of /proxy/<host>:<port>/ was written into the error page
    unescaped."""
    for path in (f"proxy/{urllib.parse.quote(XSS)}:80/",
                 f"proxy/{urllib.parse.quote(XSS)}:80/{urllib.parse.quote(XSS)}"):
        r = single.server.get(path)
        assert r.status_code in (403, 404), (r.status_code, r.text[:500])
        assert XSS not in r.text
        assert "onerror=alert(1)>" not in r.text


# -- activity, API -------------------------------------------------------------------


def _last_activity(server: Server) -> dt.datetime:
    r = server.get("api/status?no_track_activity=1")
    assert r.status_code == 200, r.text
    return dt.datetime.fromisoformat(r.json()["last_activity"].replace("Z", "+00:00"))


@pytest.mark.parametrize("path", ["hello/", f"proxy/{HTTP_PORT}/x.txt", "tensorboard/"])
def test_service_port_traffic_counts_as_server_activity(single, path):
    """What the server reports to the hub (and so the idle culler sees) moves with traffic
    to an app; reading the status alone does not move it."""
    before = _last_activity(single.server)
    assert _last_activity(single.server) == before
    assert single.server.get(path).status_code == 200
    after = _last_activity(single.server)
    assert after > before, (before, after)


# -- the app front (nginx before CHP, jupyterhub_backendai/appfront.py) ---------------

FRONT_PORT = 9300
# Answers every method with what it got: method, path, the body's SHA-256, the
# Authorization header, and how many requests it has seen.
FRONT_APP = (
    "import hashlib, json, http.server, sys\n"
    "n = 0\n"
    "WHO = sys.argv[1] if len(sys.argv) > 1 else ''\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    protocol_version = 'HTTP/1.1'\n"
    "    def answer(self):\n"
    "        global n\n"
    "        n += 1\n"
    "        body = self.rfile.read(int(self.headers.get('Content-Length') or 0))\n"
    "        out = json.dumps({'method': self.command, 'path': self.path, 'n': n, 'who': WHO,\n"
    "                          'sha': hashlib.sha256(body).hexdigest(),\n"
    "                          'auth': self.headers.get('Authorization')}).encode()\n"
    "        self.send_response(200)\n"
    "        if '/accel' in self.path:\n"
    "            self.send_header('X-Accel-Redirect', self.path.split('/accel', 1)[1])\n"
    "        self.send_header('Content-Length', str(len(out)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(out)\n"
    "    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = answer\n"
    "    def log_message(self, *a): pass\n"
    "import threading\n"
    f"threading.Thread(target=http.server.ThreadingHTTPServer(('127.0.0.1', {FRONT_PORT + 2}),"
    " H).serve_forever, daemon=True).start()\n"
    f"http.server.ThreadingHTTPServer(('0.0.0.0', {FRONT_PORT}), H).serve_forever()\n"
)


def _start_front_app(world) -> None:
    if getattr(world, "front_app", False):
        return
    out = world.server.run(
        f"(nohup python -c {shlex.quote(FRONT_APP)} >/tmp/front.log 2>&1 &)"
        f" && (nohup python -m http.server {FRONT_PORT + 1} --bind 127.0.0.1 --directory /tmp/www"
        f" >/tmp/http2.log 2>&1 &)"
        " && " + wait_ports(FRONT_PORT, FRONT_PORT + 1), "FRONT-UP")
    assert "FRONT-UP" in out
    world.front_app = True


def test_the_front_passes_requests_to_apps_as_sent(single_front):
    """The fast path: the app gets the request line as the client sent it (escapes,
    double slashes, the query; below the port, or whole for /proxy/absolute/), the
    method, the body and the client's headers, with no Jupyter server in between."""
    import hashlib

    world = single_front
    _start_front_app(world)
    s = world.server
    r = s.get(f"proxy/{FRONT_PORT}/a%20b/%2Fc//d?q=1&r=%2F")
    assert r.status_code == 200 and r.headers.get(FRONT) == "front", (r.status_code, r.headers)
    got = r.json()
    assert (got["method"], got["path"]) == ("GET", "/a%20b/%2Fc//d?q=1&r=%2F"), got
    assert got["auth"] == f"token {s.token}"
    r = s.get(f"proxy/absolute/{FRONT_PORT}/x%20y/")
    assert r.headers.get(FRONT) == "front"
    assert r.json()["path"] == f"{s.prefix}proxy/absolute/{FRONT_PORT}/x%20y/"
    body = bytes(range(256)) * (12 * 2**12)  # 3 MiB
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        r = requests.request(method, s.url(f"proxy/{FRONT_PORT}/m"), data=body, timeout=60,
                             headers={"Host": s.host, "Authorization": f"token {s.token}"})
        assert r.status_code == 200 and r.headers.get(FRONT) == "front", (method, r.status_code)
        assert (r.json()["method"], r.json()["sha"]) == (method, hashlib.sha256(body).hexdigest())


def test_the_front_never_lets_a_refused_request_reach_the_app(single_front):
    """Anonymous clients, another user and a token without access:servers: no request,
    of any method and with or without a body, reaches the app through the front (its
    request counter moves only with the owner's), and a client's own probe header
    changes nothing."""
    world = single_front
    _start_front_app(world)
    s = world.server
    n = s.get(f"proxy/{FRONT_PORT}/count").json()["n"]
    for token in (None, world.bob_token, world.scopeless_token, "x" * 32):
        for method in ("GET", "POST", "PUT", "DELETE"):
            for headers in ({}, {"X-Backendai-Auth-Probe": "GET"}):
                r = requests.request(
                    method, s.url(f"proxy/{FRONT_PORT}/steal"), timeout=60,
                    data=b"z" * (2 * 2**20) if method in ("POST", "PUT") else None,
                    allow_redirects=False, headers={
                        "Host": s.host, **headers,
                        **({"Authorization": f"token {token}"} if token else {})})
                assert r.status_code in (302, 401, 403, 413), (token, method, r.status_code)
                assert FRONT not in r.headers and '"path"' not in r.text, (method, r.text[:300])
    assert s.get(f"proxy/{FRONT_PORT}/count").json()["n"] == n + 1


def test_the_front_falls_back_to_the_full_path(single_front):
    """What the front cannot pass straight goes the full way, with the full way's answer:
    an app on the container's loopback only, a closed port (the 502 page), a websocket."""
    world = single_front
    _start_front_app(world)
    s = world.server
    r = s.get(f"proxy/{FRONT_PORT + 1}/x.txt")
    assert r.status_code == 200 and "served-by-http-server" in r.text
    assert FRONT not in r.headers
    r = s.get(f"proxy/{CLOSED_PORT}/")
    assert r.status_code == 502 and f"nothing is listening on port {CLOSED_PORT}" in r.text, (
        r.status_code, r.text[:500])
    assert FRONT not in r.headers
    with s.ws(f"proxy/{ECHO_PORT}/") as ws:
        ws.send("via-front")
        assert ws.recv(timeout=30) == "echo:via-front"


def test_the_probe_answers_only_for_its_own_server_and_its_own_user(single_front):
    """The question the front puts to a session's server (through CHP, behind nginx):
    yes (204) only for the owner's credentials and only when it names this server; a
    question naming another server (a route below this one's proxy/) is answered 409,
    and nothing is proxied either way."""
    world = single_front
    _start_front_app(world)
    s = world.server
    conf = open(os.path.join(world.hub.env["BACKENDAI_STATE_DIR"], "app-front",
                             "nginx.conf")).read()
    chp = re.search(r"upstream bai_chp \{ server ([\d.]+:\d+);", conf).group(1)
    n = s.get(f"proxy/{FRONT_PORT}/count").json()["n"]

    def probe(value, token):
        return requests.get(f"http://{chp}{s.prefix}proxy/{FRONT_PORT}/probed", headers={
            "Host": s.host, "X-Backendai-Auth-Probe": value,
            **({"Authorization": f"token {token}"} if token else {})},
            allow_redirects=False, timeout=60)

    assert probe(f"POST {s.prefix}", s.token).status_code == 204
    assert probe("GET /user/someone-else/", s.token).status_code == 409
    assert probe(f"BREW {s.prefix}", s.token).status_code == 400
    for token in (None, world.bob_token, world.scopeless_token):
        assert probe(f"GET {s.prefix}", token).status_code in (302, 401, 403)
    assert s.get(f"proxy/{FRONT_PORT}/count").json()["n"] == n + 1  # none reached the app


def test_no_fast_path_over_another_servers_route():
    """A named server called "proxy" owns /user/<name>/proxy/...: the default server's
    fast locations would take its paths, so they are left out."""
    from jupyterhub_backendai.appfront import AppFrontProxy

    front = AppFrontProxy(public_url="http://127.0.0.1:8000/", state_dir="/nonexistent",
                          auth_token="t", api_url="http://127.0.0.1:8001")
    front._chp_url = "http://127.0.0.1:8002"
    front._fast = {"/user/a/": ("", "/user/a/", "10.9.0.2"),
                   "/user/a/proxy/": ("", "/user/a/proxy/", "10.9.0.3"),
                   "/user/b/": ("", "/user/b/", "10.9.0.4")}
    conf = front.render_conf()
    assert "10.9.0.2" not in conf and "^/user/a/proxy/\\d+/" not in conf
    assert 'location ~ "^/user/a/proxy/proxy/\\d+/"' in conf and "10.9.0.3" in conf
    assert 'location ~ "^/user/b/proxy/\\d+/"' in conf
    # Subdomains: a route below another host's prefix takes nothing from it.
    front._fast = {"a.hub.test/user/a/": ("a.hub.test", "/user/a/", "10.9.0.2"),
                   "b.hub.test/user/a/proxy/": ("b.hub.test", "/user/a/proxy/", "10.9.0.3"),
                   "b.hub.test/user/a/proxy/proxy/": ("b.hub.test", "/user/a/proxy/proxy/",
                                                     "10.9.0.5")}
    conf = front.render_conf()
    assert "10.9.0.2" in conf and "10.9.0.5" in conf and "10.9.0.3" not in conf


def test_routes_added_together_share_a_reload_and_a_removal_reloads_at_once(tmp_path):
    """A hub that starts adds every running server's route at once (JupyterHub's
    ``check_routes`` gathers them). 60 routes added together cost nginx one or two
    reloads, not 60, and each ``add_route`` returns only once nginx has been told of its
    fast location; a removal reloads at once, before ``delete_route`` returns.

    Real CHP and nginx. The servers are small HTTP servers in this process: the
    "Jupyter server" says yes to the front's probe (what jupyter-server-proxy's check
    answers for its owner; that check has its own tests above), the "app" answers
    with its name. JupyterHub's app object is a stand-in that knows where each server's
    kernel is, as the spawner tells the front."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    from jupyterhub.objects import Hub

    from jupyterhub_backendai.appfront import AppFrontProxy

    from .hub import CHP
    from .services import free_port

    class Jupyter(BaseHTTPRequestHandler):
        def do_GET(self):
            probe = self.headers.get("X-Backendai-Auth-Probe")
            self.send_response(204 if probe else 200)
            self.end_headers()

        def log_message(self, *args):
            pass

    class App(Jupyter):
        def do_GET(self):
            body = b"the app"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), h) for h in (Jupyter, App)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    jupyter_port, app_port = (srv.server_address[1] for srv in servers)

    n = 60
    names = [f"u{i}" for i in range(n)]
    addresses = dict.fromkeys(names, "127.0.0.1")

    def where(name):
        async def lookup():
            if addresses[name] is None:
                raise RuntimeError("no address")
            return addresses[name]
        return lookup

    app = SimpleNamespace(subdomain_host="", internal_ssl=False, users={
        name: SimpleNamespace(spawners={"": SimpleNamespace(app_address=where(name))})
        for name in names})
    port = free_port()
    front = AppFrontProxy(public_url=f"http://127.0.0.1:{port}/", state_dir=str(tmp_path / "front"),
                          api_url=f"http://127.0.0.1:{free_port()}", auth_token="t" * 32,
                          command=[CHP], pid_file=str(tmp_path / "chp.pid"), app=app,
                          hub=Hub(ip="127.0.0.1", port=free_port(), base_url="/hub/"))

    def through_front(name):
        r = requests.get(f"http://127.0.0.1:{port}/user/{name}/proxy/{app_port}/x", timeout=10)
        return r.status_code, r.headers.get(FRONT), r.text

    async def run():
        await front.start()
        try:
            before = front.reloads
            t0 = asyncio.get_running_loop().time()
            await asyncio.gather(*(front.add_route(
                f"/user/{name}/", f"http://127.0.0.1:{jupyter_port}",
                {"user": name, "server_name": ""}) for name in names))
            spread = asyncio.get_running_loop().time() - t0
            # One reload per RELOAD_GAP at most while routes keep coming (CHP answers
            # the 60 adds over `spread` seconds: a fraction of one gap on a quiet
            # machine, so one or two reloads; more on a loaded one), never one a route.
            most = 2 + int(spread / front.RELOAD_GAP)
            assert 1 <= front.reloads - before <= min(most, 10), (front.reloads - before, spread)
            conf = open(os.path.join(front.state_dir, "nginx.conf")).read()
            assert all(f'location ~ "^/user/{name}/proxy/\\d+/"' in conf for name in names)
            # nginx runs it (its reload is asynchronous: the full way answers until then)
            for _ in range(100):
                got = await asyncio.to_thread(through_front, "u59")
                if got[1] == "front":
                    break
                await asyncio.sleep(0.1)
            assert got == (200, "front", "the app"), got
            # a removal: reloaded before delete_route returns, alone
            before = front.reloads
            await front.delete_route("/user/u59/")
            assert front.reloads - before == 1
            conf = open(os.path.join(front.state_dir, "nginx.conf")).read()
            assert "/user/u59/" not in conf and "/user/u58/" in conf
            for _ in range(100):
                got = await asyncio.to_thread(through_front, "u59")
                if got[1] != "front":
                    break
                await asyncio.sleep(0.1)
            assert got[1] is None and got[2] != "the app", got  # CHP: no route, no app

            async def again(name):
                before = front.reloads
                await front.add_route(f"/user/{name}/", f"http://127.0.0.1:{jupyter_port}",
                                      {"user": name, "server_name": ""})
                return front.reloads - before, open(os.path.join(front.state_dir, "nginx.conf")).read()

            # The same route again, same address: nothing to reload.
            assert (await again("u1"))[0] == 0
            # Another address for a route (JupyterHub updating a route whose target
            # changed): the old one goes at once, as at a removal.
            addresses["u1"] = "127.0.0.9"
            reloads, conf = await again("u1")
            assert reloads == 1 and "http://127.0.0.9:" in conf
            # No address now (the spawner cannot say): the old fast path goes at once.
            addresses["u1"] = None
            reloads, conf = await again("u1")
            assert reloads == 1 and "/user/u1/" not in conf and "127.0.0.9" not in conf
        finally:
            front.stop()

    try:
        asyncio.run(run())
    finally:
        for srv in servers:
            srv.shutdown()


def test_apps_cannot_steer_the_front(single_front):
    """nginx acts on ``X-Accel-Redirect`` in an upstream's answer (an internal redirect
    to any of its locations: the probe's, another user's fast path, the hub). An app's
    answer is passed on as it is, by the fast path and by the full path alike."""
    world = single_front
    _start_front_app(world)
    s = world.server
    targets = ["/_backendai_app_front_auth", "/hub/api/", "@bai_chp",
               f"/user/{world.bob['username']}/proxy/{FRONT_PORT}/x"]
    for target in targets:
        fast = s.get(f"proxy/{FRONT_PORT}/accel{target}")
        assert fast.status_code == 200 and fast.headers.get(FRONT) == "front", fast.status_code
        assert fast.json()["path"] == f"/accel{target}", fast.text[:300]
        # The same app on the container's loopback: the full path, behind nginx too.
        full = s.get(f"proxy/{FRONT_PORT + 2}/accel{target}")
        assert full.status_code == 200 and FRONT not in full.headers, (full.status_code,
                                                                       full.text[:300])
        assert full.json()["path"] == f"/accel{target}", full.text[:300]


def test_paths_that_read_differently_do_not_open_another_users_container(single_front):
    """nginx picks a fast location by its own reading of the path; CHP routes the probe by
    its own (WHATWG URLs: ``\\`` is ``/``, dot segments resolved). With bob's prefix
    before a backslashed climb into alice's server, nginx's location is bob's while CHP
    asked alice's server, which says yes to alice's token: before the probe named its
    server (and without the checks of the raw line), nginx passed alice's request to bob's
    container (seen). Dot segments the other way round too. Both end in alice's own
    server or a refusal, never at bob's app."""
    world = single_front
    _start_front_app(world)
    hub, b = world.hub, world.bob["username"]
    r = hub.spawn(b, "bobsrv", token=world.bob_token)
    assert r.status_code in (201, 202), r.text
    model = hub.wait_ready(b, "bobsrv", token=world.bob_token)
    bob = Server(hub, world.server.host, urllib.parse.urlsplit(model["url"]).path,
                 world.bob_token)
    out = bob.run(f"(nohup python -c {shlex.quote(FRONT_APP)} bob >/tmp/front.log 2>&1 &)"
                  " && " + wait_ports(FRONT_PORT), "BOB-UP")
    assert "BOB-UP" in out
    r = bob.get(f"proxy/{FRONT_PORT}/own")
    assert r.json()["who"] == "bob" and r.headers.get(FRONT) == "front", r.headers
    s = world.server
    ups = s.prefix.count("/") + 1  # from <a prefix>proxy/<port>/ up to the root
    backslashed = (f"{bob.prefix}proxy/{FRONT_PORT}/" + "..\\" * ups
                   + f"{s.prefix[1:]}proxy/{FRONT_PORT}/secret".replace("/", "\\"))
    dotted = (f"{s.prefix}proxy/{FRONT_PORT}/" + "../" * ups
              + f"{bob.prefix[1:]}proxy/{FRONT_PORT}/secret")
    for raw in (backslashed, dotted):
        with socket.create_connection(("127.0.0.1", hub.port), timeout=60) as c:
            c.sendall((f"GET {raw} HTTP/1.1\r\nHost: {s.host}\r\nConnection: close\r\n"
                       f"Authorization: token {s.token}\r\n\r\n").encode())
            got = b""
            while chunk := c.recv(1 << 16):
                got += chunk
        assert b'"who": "bob"' not in got, (raw, got[:500])
        assert FRONT.lower().encode() not in got.lower(), (raw, got[:500])


def test_traffic_through_the_front_counts_as_server_activity(single_front):
    world = single_front
    _start_front_app(world)
    before = _last_activity(world.server)
    r = world.server.get(f"proxy/{FRONT_PORT}/active")
    assert r.status_code == 200 and r.headers.get(FRONT) == "front"
    after = _last_activity(world.server)
    assert after > before, (before, after)


def test_the_front_outlives_a_hub_restart_and_forgets_stopped_servers(docker_image,
                                                                      tmp_path_factory):
    """After the hub restarts, the front takes a running server's apps straight again;
    once the server stops, nothing is passed to its old address; the hub's shutdown
    stops nginx."""
    hub = start_hub(tmp_path_factory, subdomains=False, front=True)
    try:
        world = World(hub, subdomains=False)
        a = world.alice["username"]
        assert world.server.get(f"proxy/{HTTP_PORT}/x.txt").headers.get(FRONT) == "front"
        pidfile = os.path.join(hub.env["BACKENDAI_STATE_DIR"], "app-front", "nginx.pid")
        with open(pidfile) as f:
            first = int(f.read())
        hub.stop_hub()
        assert not os.path.exists(f"/proc/{first}"), "nginx outlived the hub's shutdown"
        hub.start()
        hub.wait_ready(a, world.server_name, token=world.alice_token)
        # JupyterHub adds the route again at its start; nginx takes the new configuration
        # on its reload (asynchronous): until then the full path answers, the same.
        for _ in range(100):
            r = world.server.get(f"proxy/{HTTP_PORT}/x.txt")
            assert r.status_code == 200 and "served-by-http-server" in r.text, r.status_code
            if r.headers.get(FRONT) == "front":
                break
            time.sleep(0.2)
        assert r.headers.get(FRONT) == "front", r.headers
        r = hub.api("DELETE", f"/users/{a}/servers/{world.server_name}", token=world.alice_token)
        assert r.status_code in (202, 204), r.text
        for _ in range(300):
            if not hub.api("GET", f"/users/{a}", token=world.alice_token).json()[
                    "servers"].get(world.server_name):
                break
            time.sleep(0.1)
        r = world.server.get(f"proxy/{HTTP_PORT}/x.txt")
        assert FRONT not in r.headers and "served-by-http-server" not in r.text, r.status_code
    finally:
        shutdown_hub(hub)


def test_api_lists_a_sessions_service_ports(world):
    hub = world.hub
    a = world.alice
    r = signed(hub, "GET", "/sessions", a["access_key"], a["secret_key"],
               query={"type": "interactive", "status": "RUNNING"})
    assert r.status_code == 200, r.text
    sessions = r.json()["items"] if isinstance(r.json(), dict) else r.json()
    assert len(sessions) == 1, sessions
    sid = sessions[0]["id"]
    r = signed(hub, "GET", f"/sessions/{sid}/service-ports", a["access_key"], a["secret_key"])
    assert r.status_code == 200, r.text
    body = r.json()
    origin = f"http://{world.server.host}" if world.mode == "subdomains" else hub.base
    server_url = origin + world.server.prefix
    assert body["server_url"] == server_url
    assert body["adhoc_url_template"] == server_url + "proxy/{port}/"
    assert body["service_ports"] == [
        {"name": "jupyter", "protocol": "http", "container_port": 8888, "url": server_url},
        {"name": "tensorboard", "protocol": "http", "container_port": 6006,
         "url": server_url + "tensorboard/"},
        {"name": "hello", "protocol": "http", "container_port": 8070,
         "url": server_url + "hello/"},
        {"name": "vscode", "protocol": "http", "container_port": 8180,
         "url": server_url + "vscode/"},
    ]
    # The listed URL answers (the owner's token).
    path = urllib.parse.urlsplit(body["service_ports"][2]["url"]).path
    assert world.server.get(path[len(world.server.prefix):]).status_code == 200
    # Another user does not see the session at all.
    b = world.bob
    r = signed(hub, "GET", f"/sessions/{sid}/service-ports", b["access_key"], b["secret_key"])
    assert r.status_code == 404, r.text


def test_only_the_jupyter_server_is_published_on_the_host(single):
    """The Jupyter server proxies every other app of the image, so a session takes one
    host port from the agent's range, not one per declared service port."""
    [cid] = containers_of(single.hub.agent_id)
    out = subprocess.run(["docker", "inspect", "-f", "{{json .HostConfig.PortBindings}}", cid],
                         capture_output=True, text=True, check=True).stdout
    bindings = json.loads(out)
    assert list(bindings) == ["8888/tcp"], bindings
    assert bindings["8888/tcp"][0]["HostIp"] == "127.0.0.1"


# -- large responses -------------------------------------------------------------------

BIG_MIB = 32
BIG_CLIENTS = 20


def _big_pattern() -> bytes:
    return bytes(range(256)) * (BIG_MIB * 2**20 // 256)


def _assert_never_restarted_nor_oom_killed(cid: str, started: str) -> None:
    """The same container as at ``started``, running, no OOM kill in its cgroup."""
    state = json.loads(subprocess.run(["docker", "inspect", "-f", "{{json .State}}", cid],
                                      capture_output=True, text=True, check=True).stdout)
    assert state["Running"] and not state["OOMKilled"] and state["StartedAt"] == started
    events = subprocess.run(["docker", "exec", cid, "cat", "/sys/fs/cgroup/memory.events"],
                            capture_output=True, text=True)
    if events.returncode == 0:  # cgroup v2
        counts = dict(line.split() for line in events.stdout.splitlines())
        assert counts["oom_kill"] == "0", events.stdout


def test_concurrent_large_downloads_do_not_take_the_session_down(single):
    """jupyter-server-proxy 4.6.0 reads an app's whole response into memory (several
    copies) before sending any of it: 20 concurrent 32 MiB downloads through the hub's
    path OOM-killed the 512 MiB session (503, then nothing). The image's proxy streams
    instead: the session survives, no OOM kill in its cgroup, every byte arrives and
    Content-Length is passed on."""
    import concurrent.futures
    import hashlib

    [cid] = containers_of(single.hub.agent_id)
    started = subprocess.run(["docker", "inspect", "-f", "{{.State.StartedAt}}", cid],
                             capture_output=True, text=True, check=True).stdout.strip()
    out = single.server.run(
        "python -c \"open('/tmp/www/big.bin','wb').write(bytes(range(256))*"
        f"({BIG_MIB}*2**20//256))\" && ls -l /tmp/www/big.bin", "BIG-READY")
    assert "BIG-READY" in out
    expected = hashlib.sha256(_big_pattern()).hexdigest()

    def download(_):
        r = requests.get(single.server.url(f"proxy/{HTTP_PORT}/big.bin"), headers={
            "Host": single.server.host, "Authorization": f"token {single.server.token}"},
            stream=True, timeout=120)
        h, n = hashlib.sha256(), 0
        for chunk in r.iter_content(1 << 16):
            h.update(chunk)
            n += len(chunk)
        return r.status_code, r.headers.get("Content-Length"), n, h.hexdigest()

    with concurrent.futures.ThreadPoolExecutor(BIG_CLIENTS) as pool:
        results = list(pool.map(download, range(BIG_CLIENTS)))
    size = BIG_MIB * 2**20
    assert results == [(200, str(size), size, expected)] * BIG_CLIENTS, [
        r[:3] for r in results]
    # The same container, never restarted, no OOM kill in its cgroup; the server answers.
    _assert_never_restarted_nor_oom_killed(cid, started)
    assert single.server.get("api/status").status_code == 200
    single.server.run("rm -f /tmp/www/big.bin", "BIG-GONE")


def test_anonymous_large_bodies_do_not_take_the_session_down(single):
    """Every request to /user/alice/... reaches her server through the proxy, and the
    Jupyter server read a body whole (up to 512 MiB) before it authenticated it: three
    anonymous 200 MiB PUTs at once OOM-killed the 512 MiB session and the work in it.
    Now (images/kernel/backendai_kernel_bodies.py) a body over 1 MiB is kept only from a
    client with access to the server; others are dropped as they arrive and get a 413."""
    import concurrent.futures

    [cid] = containers_of(single.hub.agent_id)
    started = subprocess.run(["docker", "inspect", "-f", "{{.State.StartedAt}}", cid],
                             capture_output=True, text=True, check=True).stdout.strip()
    big = 200 * 2**20

    def put(token):
        headers = {"Host": single.server.host, "Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"token {token}"
        return requests.put(single.server.url("api/contents/flood.txt"), data=b" " * big,
                            headers=headers, allow_redirects=False, timeout=300)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(put, [None, None, None, single.bob_token]))
    for r in answers:  # anonymous, and another user's token
        assert r.status_code == 413, (r.status_code, r.text[:300])
        assert "from a client this server does not know" in r.json()["message"], r.text
    _assert_never_restarted_nor_oom_killed(cid, started)
    # alice's own large save (JupyterLab sends files up to 15 MB in one request) works.
    content = "x" * (3 * 2**20)
    r = requests.put(single.server.url("api/contents/large-save.txt"), json={
        "type": "file", "format": "text", "content": content}, headers={
        "Host": single.server.host, "Authorization": f"token {single.server.token}"},
        timeout=120)
    assert r.status_code in (200, 201), (r.status_code, r.text[:300])
    r = single.server.get("api/contents/large-save.txt")
    assert r.status_code == 200 and r.json()["content"] == content
    assert single.server.get("api/contents/flood.txt").status_code == 404
    # and from her browser, by the server's login cookie (as JupyterLab saves)
    login = single.alice_login
    assert login.get_following(single.server.url("hello/"),
                               single.server.host).status_code == 200
    r = login.request("PUT", single.server.url("api/contents/cookie-save.txt"), json={
        "type": "file", "format": "text", "content": content}, headers={
        "Host": single.server.host, "X-XSRFToken": login.cookies["_xsrf"]})
    assert r.status_code in (200, 201), (r.status_code, r.text[:300])


def test_streamed_responses_keep_redirects_head_and_survive_a_client_that_leaves(single):
    """The streamed proxy path: a redirect's Location is rewritten below the proxy prefix
    (as jupyter-server-proxy does), HEAD gets the app's Content-Length and no body, and a
    client that drops a large download halfway leaves the server serving."""
    single.server.run("mkdir -p /tmp/www/sub && head -c 8388608 /dev/zero > /tmp/www/zeros.bin",
                      "STREAM-READY")
    r = single.server.get(f"proxy/{HTTP_PORT}/sub")
    assert r.status_code == 301, (r.status_code, r.text[:500])
    assert r.headers["Location"] == f"{single.server.prefix}proxy/{HTTP_PORT}/sub/"
    r = requests.head(single.server.url(f"proxy/{HTTP_PORT}/zeros.bin"), headers={
        "Host": single.server.host, "Authorization": f"token {single.server.token}"},
        allow_redirects=False, timeout=60)
    assert (r.status_code, r.headers.get("Content-Length"), r.content) == (200, "8388608", b"")
    # Read 64 KiB of 8 MiB, then hang up, a few times.
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", single.hub.port), timeout=30) as s:
            s.sendall((f"GET {single.server.prefix}proxy/{HTTP_PORT}/zeros.bin HTTP/1.1\r\n"
                       f"Host: {single.server.host}\r\n"
                       f"Authorization: token {single.server.token}\r\n\r\n").encode())
            got = b""
            while len(got) < 65536:
                chunk = s.recv(65536)
                assert chunk, got[:300]
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 ")
    r = single.server.get(f"proxy/{HTTP_PORT}/zeros.bin")
    assert (r.status_code, len(r.content), r.content.count(b"\0")) == (200, 8388608, 8388608)
    assert single.server.get(f"proxy/{HTTP_PORT}/x.txt").text == "served-by-http-server\n"
    single.server.run("rm -rf /tmp/www/sub /tmp/www/zeros.bin", "STREAM-GONE")


# -- the direct path: keep-alive to the app, splice for large bodies ---------------------

KA_PORT = 9200
KA_BIG = 4 * 2**20
# An HTTP/1.1 app that keeps connections alive (http.server above is HTTP/1.0): it answers
# with the request's path, Authorization header, body and the port of the connection it
# came on; /liar announces 5 bytes and sends a whole second response after them; /big is
# 4 MiB (its connection's port in X-Conn); /broken announces 4 MiB, sends 1 MiB, hangs up.
KA_APP = f"""
import asyncio, json
BIG = bytes(range(256)) * ({KA_BIG} // 256)
async def handle(r, w):
    peer = w.get_extra_info('peername')[1]
    try:
        while True:
            head = (await r.readuntil(b'\\r\\n\\r\\n')).decode('latin-1').split('\\r\\n')
            method, path, _ = head[0].split(' ', 2)
            h = dict((k.lower(), v) for k, _, v in (x.partition(': ') for x in head[1:] if x))
            n = int(h.get('content-length', '0'))
            body = await r.readexactly(n) if n else b''
            tail = path.rsplit('/', 1)[-1]
            if tail == 'liar':
                w.write(b'HTTP/1.1 200 OK\\r\\nContent-Length: 5\\r\\n\\r\\nliar!'
                        b'HTTP/1.1 200 OK\\r\\nContent-Length: 6\\r\\n\\r\\nstolen')
            elif tail == 'big':
                w.write(b'HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nX-Conn: %d\\r\\n\\r\\n'
                        % (len(BIG), peer) + BIG)
            elif tail == 'chunked-one':
                w.write(b'HTTP/1.1 200 OK\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n'
                        + b'%x\\r\\n' % len(BIG) + BIG + b'\\r\\n0\\r\\n\\r\\n')
            elif tail == 'chunked-many':
                w.write(b'HTTP/1.1 200 OK\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n')
                for i in range(0, len(BIG), 50000):
                    piece = BIG[i:i + 50000]
                    w.write(b'%x\\r\\n' % len(piece) + piece + b'\\r\\n')
                    await w.drain()
                w.write(b'0\\r\\n\\r\\n')
            elif tail == 'close-big':
                w.write(b'HTTP/1.1 200 OK\\r\\nConnection: close\\r\\n\\r\\n' + BIG)
                await w.drain()
                return
            elif tail == 'broken':
                w.write(b'HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n' % len(BIG)
                        + BIG[:2**20])
                await w.drain()
                return
            else:
                out = json.dumps({{'path': path, 'auth': h.get('authorization', ''),
                                  'conn': peer, 'body': body.decode()}}).encode()
                w.write(b'HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\n'
                        b'Content-Length: %d\\r\\n\\r\\n' % len(out) + out)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        w.close()
async def main():
    await asyncio.start_server(handle, '127.0.0.1', {KA_PORT})
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _start_keepalive_app(world) -> None:
    if getattr(world, "ka_started", False):
        return
    import base64

    src = base64.b64encode(KA_APP.encode()).decode()
    out = world.server.run(
        f"echo {src} | base64 -d > /tmp/ka.py && (nohup python /tmp/ka.py >/tmp/ka.log 2>&1 &)"
        " && " + wait_ports(KA_PORT), "KA-UP")
    assert "KA-UP" in out
    world.ka_started = True


def test_keep_alive_to_the_app_never_hands_one_request_anothers_response(world):
    """The image's proxy keeps connections to the app alive (tornado's client opened one
    per request): sequential requests share one; an app that sends more than it
    announced never has the surplus read as the next request's answer; concurrent
    requests of alice and of bob (her server shared with him) each get their own
    answer, with their own Authorization header at the app."""
    import concurrent.futures

    _start_keepalive_app(world)
    s = world.server
    conns = []
    for i in range(5):
        r = s.get(f"proxy/{KA_PORT}/seq/{i}")
        assert r.status_code == 200, (world.mode, r.status_code, r.text[:500])
        assert r.json()["path"] == f"/seq/{i}", r.text
        conns.append(r.json()["conn"])
    assert len(set(conns)) < 5, conns  # kept alive (stock: a new connection each time)
    r = requests.post(s.url(f"proxy/{KA_PORT}/post"), data=b"payload", timeout=60, headers={
        "Host": s.host, "Authorization": f"token {s.token}"})
    assert r.status_code == 200 and r.json()["body"] == "payload", r.text[:500]
    for i in range(3):
        r = s.get(f"proxy/{KA_PORT}/liar")
        assert (r.status_code, r.content) == (200, b"liar!")
        r = s.get(f"proxy/{KA_PORT}/after/{i}")
        assert r.status_code == 200 and r.json()["path"] == f"/after/{i}", r.text[:500]

    hub = world.hub
    a, b = world.alice["username"], world.bob["username"]
    admin = mint_token(Login(hub, ADMIN_EMAIL, world.bob_login.host, ADMIN_PASSWORD), "admin")
    r = hub.api("POST", f"/shares/{a}/{world.server_name}", token=admin, json={"user": b})
    assert r.status_code in (200, 201), r.text
    try:
        tokens = [s.token, mint_token(world.bob_login, b)]

        def one(i):
            r = s.get(f"proxy/{KA_PORT}/c/{i}/liar" if i % 7 == 0 else f"proxy/{KA_PORT}/c/{i}",
                      token=tokens[i % 2])
            return r.status_code, r.content

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, range(60)))
    finally:
        r = hub.api("DELETE", f"/shares/{a}/{world.server_name}", token=admin)
        assert r.status_code in (200, 204), r.text
    for i, (code, body) in enumerate(results):
        assert code == 200, (i, code, body[:300])
        if i % 7 == 0:
            assert body == b"liar!", (i, body[:300])
        else:
            got = json.loads(body)
            assert (got["path"], got["auth"]) == (f"/c/{i}", f"token {tokens[i % 2]}"), (i, got)


def test_a_large_body_is_spliced_intact_and_a_broken_one_is_cut(world):
    """A body of known length >= 256 KiB is moved by splice() once its head is out; the
    connection ends after it (``Connection: close``). Every byte arrives (SHA-256), in
    single-origin and subdomain mode; an app that hangs up midway gives the client a
    truncated response, never a complete-looking one; the app's next answer is intact."""
    import hashlib

    _start_keepalive_app(world)
    s = world.server
    expected = hashlib.sha256(bytes(range(256)) * (KA_BIG // 256)).hexdigest()
    for _ in range(3):
        r = s.get(f"proxy/{KA_PORT}/big")
        assert r.status_code == 200, (world.mode, r.status_code, r.text[:300])
        assert r.headers["Content-Length"] == str(KA_BIG)
        assert r.headers.get("Connection", "").lower() == "close", r.headers  # spliced
        assert hashlib.sha256(r.content).hexdigest() == expected
        r = s.get(f"proxy/{KA_PORT}/after-big")
        assert r.status_code == 200 and r.json()["path"] == "/after-big", r.text[:300]
    # The session's server closes its connection to CHP after the 1 MiB; CHP does not
    # pass that on (it leaves its client waiting for the rest): read until EOF or 8 s of
    # silence. Either way the client has fewer bytes than announced.
    with socket.create_connection(("127.0.0.1", world.hub.port), timeout=60) as c:
        c.sendall((f"GET {s.prefix}proxy/{KA_PORT}/broken HTTP/1.1\r\nHost: {s.host}\r\n"
                   f"Authorization: token {s.token}\r\n\r\n").encode())
        got = b""
        try:
            while chunk := c.recv(1 << 20):
                got += chunk
                c.settimeout(8)
        except TimeoutError:
            pass
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), got[:300]
    assert f"content-length: {KA_BIG}".encode() in head.lower(), head
    assert 0 < len(body) < KA_BIG, len(body)
    r = s.get(f"proxy/{KA_PORT}/after-broken")
    assert r.status_code == 200 and r.json()["path"] == "/after-broken", r.text[:300]


def test_large_bodies_without_a_length_arrive_whole(world):
    """Chunked (one 4 MiB chunk, or 50 KB pieces) and close-delimited answers of the app
    are passed on whole (SHA-256). code-server's 10 MB workbench script, chunked, was
    cut at 1 MiB and ended as if complete: its page stayed blank."""
    import hashlib

    _start_keepalive_app(world)
    s = world.server
    expected = hashlib.sha256(bytes(range(256)) * (KA_BIG // 256)).hexdigest()
    for tail in ("chunked-one", "chunked-many", "close-big", "chunked-one"):
        r = s.get(f"proxy/{KA_PORT}/{tail}")
        assert r.status_code == 200, (world.mode, tail, r.status_code, r.text[:600])
        assert (len(r.content), hashlib.sha256(r.content).hexdigest()) == (KA_BIG, expected), (
            world.mode, tail, len(r.content))
        r = s.get(f"proxy/{KA_PORT}/after-{tail}")
        assert r.status_code == 200 and r.json()["path"] == f"/after-{tail}", r.text[:300]


def test_websockets_are_relayed_byte_for_byte(world):
    """The image relays a proxied websocket as bytes after the app's own 101 (no
    re-framing): many small messages and one of 512 KiB come back intact and in
    order, in single-origin and subdomain mode, and the app's answer is the handshake's
    (a path the app serves without websockets answers as the app does, not 101)."""
    import os as _os

    with world.server.ws(f"proxy/{ECHO_PORT}/") as ws:
        for i in range(50):
            ws.send(f"m{i}")
        assert [ws.recv(timeout=30) for _ in range(50)] == [f"echo:m{i}" for i in range(50)]
        big = _os.urandom(1 << 18).hex()  # 512 KiB of text (the client takes 1 MiB at most)
        ws.send(big)
        assert ws.recv(timeout=60) == "echo:" + big
    _start_keepalive_app(world)
    with pytest.raises(InvalidStatus) as e:
        with world.server.ws(f"proxy/{KA_PORT}/not-a-websocket"):
            pass
    assert e.value.response.status_code == 200  # the app's plain answer, passed on


# -- an operator's own image ------------------------------------------------------------

OPERATOR_IMAGE = image_tag("operator-app")


def test_an_operators_image_brings_its_own_app(single, tmp_path, request):
    """An image built on ours with its own label and service-def (no other change): its
    app is started on first use and answers at ``<server>/<name>/`` behind the hub's
    login, with a launcher tile; a declared port with nothing behind it gives the 502
    page; the apps it does not declare are not there."""
    hub = single.hub
    d = tmp_path / "img"
    d.mkdir()
    (d / "notes.json").write_text(json.dumps({
        "title": "Operator notes",
        "command": ["{runtime_path}", "-m", "http.server", "{port}", "--bind", "127.0.0.1",
                    "--directory", "/opt/operator"]}))
    (d / "Dockerfile").write_text(
        "FROM backendai/python-kernel:latest\n"
        "USER root\n"
        "RUN mkdir -p /opt/operator && echo operator-app-here > /opt/operator/index.txt\n"
        "COPY notes.json /etc/backend.ai/service-defs/notes.json\n"
        "USER work\n"
        'LABEL ai.backend.service-ports="jupyter:http:8888,notes:http:8090,idle:http:8095"\n')
    request.addfinalizer(lambda: subprocess.run(["docker", "rmi", "-f", OPERATOR_IMAGE],
                                                capture_output=True))
    subprocess.run(["docker", "build", "-q", "-t", OPERATOR_IMAGE, str(d)], check=True,
                   capture_output=True)
    # Built on the node after the hub started: an admin catalogues it (docs/images.md).
    r = hub.api("POST", "/backendai/container-registries/local/rescan")
    assert r.status_code == 200 and r.json()["added"] >= 1, r.text
    b = single.bob["username"]
    r = hub.spawn(b, "op", options={"image": OPERATOR_IMAGE}, token=single.bob_token)
    assert r.status_code in (201, 202), r.text
    try:
        model = hub.wait_ready(b, "op", token=single.bob_token)
        server = Server(hub, single.server.host, urllib.parse.urlsplit(model["url"]).path,
                        single.bob_token)
        r = server.get("notes/index.txt")
        assert (r.status_code, r.text) == (200, "operator-app-here\n"), r.text[:500]
        info = server.get("server-proxy/servers-info").json()["server_processes"]
        assert sorted((s["name"], s["launcher_entry"]["title"]) for s in info) == [
            ("idle", "idle"), ("notes", "Operator notes")]
        # Declared without a service-def and nothing listening: the 502 page, by name.
        r = server.get("idle/")
        assert r.status_code == 502, (r.status_code, r.text[:500])
        assert "nothing is listening on port 8095" in r.text
        assert "No app answers on port 8095 in this session (the idle app)." in r.text
        r = server.get("hello")  # (hello/ redirects here: the server's trailing-slash rule)
        assert r.status_code == 404, (r.status_code, r.headers.get("Location"))
        # alice's token does not open bob's app.
        _refused_http(server.get("notes/index.txt", token=single.alice_token), single)
    finally:
        hub.stop_server(b, "op", token=single.bob_token)


# -- an operator's own image: the label and service-defs alone (no Docker) -------------


def _kernel_services():
    import importlib.util

    root = __file__.rsplit("/tests/", 1)[0]
    spec = importlib.util.spec_from_file_location(
        "backendai_kernel_services_under_test", f"{root}/images/kernel/backendai_kernel_services.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_an_operators_labels_and_service_defs_become_proxy_entries(tmp_path, monkeypatch):
    """Any image with the label and service-defs gets its apps: HTTP ports become
    entries (with the image's command, placeholders filled), a port without a definition
    is proxied as is, the first port and non-HTTP ports get none, a malformed item is
    skipped without taking the rest down."""
    ksvc = _kernel_services()
    (tmp_path / "vscode.json").write_text(json.dumps({
        "title": "VS Code", "command": ["code-server", "--bind-addr", "127.0.0.1:{port}",
                                         "{home_dir}/project"], "timeout": 60,
        "new_browser_tab": False}))
    (tmp_path / "broken.json").write_text("{not json")
    monkeypatch.setenv("HOME", "/home/op")
    label = ("notebook:http:8888,vscode:http:8180,ssh:tcp:2222,broken:http:9100,"
             "multi:http:[9001,9002],not an item,terminal:http:7681")
    assert ksvc.parse_service_ports(label) == [
        ("notebook", "http", 8888), ("vscode", "http", 8180), ("ssh", "tcp", 2222),
        ("broken", "http", 9100), ("multi", "http", 9001), ("terminal", "http", 7681)]
    entries = ksvc.server_entries(label, defs_dir=str(tmp_path))
    assert sorted(entries) == ["broken", "multi", "vscode"]
    vs = entries["vscode"]
    assert vs["port"] == 8180 and vs["timeout"] == 60 and vs["new_browser_tab"] is False
    assert vs["command"] == ["code-server", "--bind-addr", "127.0.0.1:{port}",
                             "/home/op/project"]
    assert vs["launcher_entry"]["title"] == "VS Code" and vs["launcher_entry"]["enabled"]
    # No (or an unreadable) definition: proxied as is, nothing started.
    assert "command" not in entries["multi"] and entries["multi"]["port"] == 9001
    assert "command" not in entries["broken"]


def test_an_apps_root_paths_are_made_relative_in_its_html_and_css():
    """``root_paths`` of a service definition (the packaged TensorBoard's): ``url(/p``,
    ``"/p`` and ``'/p`` become relative in HTML and CSS; other paths, other root
    paths and other kinds of response are left as they are."""
    ksvc = _kernel_services()
    root = __file__.rsplit("/tests/", 1)[0]
    with open(f"{root}/images/kernel/service-defs/tensorboard.json") as f:
        sdef = json.load(f)
    rewrite = ksvc.relative_root_paths(sdef["root_paths"])

    class Response:
        def __init__(self, kind, body):
            self.headers, self.body = {"Content-Type": kind}, body

    body = (b"<style>@font-face{src:local('Roboto'),url(/font-roboto/a.woff2) format('woff2')}"
            b"</style><link href=\"/font-roboto/b.css\"><img src='/font-roboto/c.png'>"
            b"<a href=\"/font-robotox/d\"></a><script src=\"/other/e.js\"></script>")
    r = Response("text/html; charset=utf-8", body)
    rewrite(r)
    assert r.body == (
        b"<style>@font-face{src:local('Roboto'),url(font-roboto/a.woff2) format('woff2')}"
        b"</style><link href=\"font-roboto/b.css\"><img src='font-roboto/c.png'>"
        b"<a href=\"/font-robotox/d\"></a><script src=\"/other/e.js\"></script>")
    css = Response("text/css", b"a{background:url( '/font-roboto/x.png')}")
    rewrite(css)
    assert css.body == b"a{background:url( 'font-roboto/x.png')}"
    data = Response("application/json", b'{"path": "/font-roboto/a"}')
    rewrite(data)
    assert data.body == b'{"path": "/font-roboto/a"}'
    entries = ksvc.server_entries("jupyter:http:8888,tensorboard:http:6006",
                                  defs_dir=f"{root}/images/kernel/service-defs")
    assert callable(entries["tensorboard"]["rewrite_response"])


def test_ssh_activity_counts_established_connections_to_port_2200_only(tmp_path):
    """The parser behind "SSH counts as activity" (the end-to-end check with a real
    sshd is tests/test_ssh_port.py): state 01 (ESTABLISHED) with local port 2200 (0x0898),
    IPv4 and IPv6; the listening socket, outgoing connections to someone else's 2200 and
    other ports do not count; a missing file is skipped."""
    ksvc = _kernel_services()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt\n"
    tail = " 00000000:00000000 00:00000000 00000000  1000 0 1 1 0 100 0 0 10 0\n"
    tcp = tmp_path / "tcp"
    tcp6 = tmp_path / "tcp6"
    tcp.write_text(head
                   + "   0: 00000000:0898 00000000:0000 0A" + tail      # sshd listening
                   + "   1: 0200120A:0898 0100120A:D1F2 01" + tail      # a client: counts
                   + "   2: 0200120A:C350 0300120A:0898 01" + tail      # to sub1's sshd
                   + "   3: 0100007F:22B8 0100007F:8A12 01" + tail)     # port 8888
    tcp6.write_text(head + "   0: 00000000000000000000000001000000:0898 "
                    "00000000000000000000000001000000:E012 01" + tail)
    files = (str(tcp), str(tcp6), str(tmp_path / "missing"))
    assert ksvc.ssh_connections(files=files) == 2
    tcp6.write_text(head)
    assert ksvc.ssh_connections(files=files) == 1
    tcp.write_text(head + "   1: 0200120A:0898 0100120A:D1F2 06" + tail)  # TIME_WAIT
    assert ksvc.ssh_connections(files=files) == 0
