"""Issue 22 row 7: one client-address rule, and ``allowed_client_ip`` on every door,
attacked on a real hub started the README's way (CHP through share/chp-guard.js).

Clients act "from another address" on one machine by binding their socket to another
loopback address: 127.0.0.1 and 127.0.0.2 are both this host, but the hub and the proxy
see them apart. Each attack below worked before: X-Forwarded-For sent straight to the
hub's port from loopback was believed; from a denied address JupyterHub's API spawned
(201), the right password logged in (302), hub pages and the OAuth step answered, and the
user's running server answered (200).
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
import requests
from requests.adapters import HTTPAdapter

from .test_signing import hub_for, signed

ALLOWED, DENIED = "127.0.0.2", "127.0.0.1"
REFUSAL = "Not allowed from this address"


class _FromAddress(HTTPAdapter):
    def __init__(self, source: str, **kw):
        self.source = source
        super().__init__(**kw)

    def init_poolmanager(self, *args, **kw):
        kw["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kw)


def client(source: str, cookies=None) -> requests.Session:
    """A session whose connections come from the local address ``source``."""
    s = requests.Session()
    s.mount("http://", _FromAddress(source))
    if cookies is not None:
        s.cookies.update(cookies)
    return s


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def hub(request, tmp_path_factory):
    yield from hub_for(request, tmp_path_factory, request.param)


def new_user(hub) -> dict:
    name = "c" + uuid.uuid4().hex[:8]
    password = f"{name}-pass-1"
    r = signed(hub, "POST", "/users", *hub.admin_keys, json={
        "email": f"{name}@example.com", "username": name, "password": password,
        "role": "user", "domain_name": "default"})
    assert r.status_code == 201, r.text
    return {"id": r.json()["id"], "name": name, "password": password}


def restrict(hub, user: dict, allowed: list[str] | None) -> None:
    r = signed(hub, "PATCH", f"/users/{user['id']}", *hub.admin_keys,
               json={"allowed_client_ip": allowed})
    assert r.status_code == 200, r.text


def login(hub, source: str, user: dict) -> tuple[requests.Session, requests.Response]:
    s = client(source)
    s.get(hub.base + "/hub/login", timeout=60)
    r = s.post(hub.base + "/hub/login", allow_redirects=False, timeout=60,
               data={"username": user["name"], "password": user["password"],
                     "_xsrf": s.cookies.get("_xsrf", path="/hub/")})
    return s, r


def token_of(hub, user: dict) -> str:
    s, r = login(hub, ALLOWED, user)
    assert r.status_code == 302, r.text
    return hub.token_for(s, user["name"])


def whoami(hub, source: str, token: str, *, base: str | None = None, headers=None):
    return client(source).get((base or hub.base) + "/hub/api/backendai/whoami", timeout=60,
                              headers={"Authorization": f"token {token}", **(headers or {})})


def refused(r: requests.Response) -> str:
    assert r.status_code == 403, (r.status_code, r.text[-2000:])
    text = re.sub(r"\s+", " ", r.text)
    assert REFUSAL in text, text[-2000:]
    return text


# -- one rule: forwarding headers only from the real proxy ---------------------------------


def test_forwarding_headers_straight_to_the_hub_are_not_believed(hub):
    """A process on the machine that connects to the hub's own port and names an allowed
    address in X-Forwarded-For (or guesses the proxy's secret) is its socket's address."""
    user = new_user(hub)
    token = token_of(hub, user)
    restrict(hub, user, [f"{ALLOWED}/32"])
    straight = f"http://127.0.0.1:{hub.api_port}"
    for headers in ({"X-Forwarded-For": ALLOWED},
                    {"X-Forwarded-For": f"{ALLOWED}, {ALLOWED}"},
                    {"X-Forwarded-For": ALLOWED, "X-Real-Ip": ALLOWED,
                     "X-Backendai-Proxy-Secret": "guess"}):
        r = whoami(hub, DENIED, token, base=straight, headers=headers)
        assert r.status_code == 401, (headers, r.status_code, r.text)
        assert f"client address {DENIED} is not allowed" in r.json()["detail"]
        # JupyterHub's own API on that port too.
        r = client(DENIED).post(straight + f"/hub/api/users/{user['name']}/tokens", timeout=60,
                                json={"note": "x"}, headers={
                                    "Authorization": f"token {token}", **headers})
        refused(r)
    # From the allowed address straight to the port: the socket's address, allowed.
    assert whoami(hub, ALLOWED, token, base=straight).status_code == 200


def test_forwarding_headers_through_the_proxy_are_handled_as_before(hub):
    """Through CHP, X-Forwarded-For is the client's word plus the address CHP saw: only
    the entry CHP appended counts."""
    user = new_user(hub)
    token = token_of(hub, user)
    restrict(hub, user, [f"{ALLOWED}/32"])
    spoof = {"X-Forwarded-For": ALLOWED, "X-Real-Ip": ALLOWED}
    r = whoami(hub, DENIED, token, headers=spoof)
    assert r.status_code == 401 and f"client address {DENIED} is not allowed" in r.text, r.text
    r = whoami(hub, ALLOWED, token, headers={"X-Forwarded-For": "192.0.2.9"})
    assert r.status_code == 200, r.text


# -- allowed_client_ip on every door -------------------------------------------------------


def test_a_denied_address_cannot_log_in_spawn_or_open_hub_pages(hub):
    user = new_user(hub)
    name = user["name"]
    # Credentials obtained before the restriction, from the address that will be denied.
    before, r = login(hub, DENIED, user)
    assert r.status_code == 302, r.text
    token = hub.token_for(before, name)
    restrict(hub, user, [f"{ALLOWED}/32"])

    # Password login with the right password: refused, saying why (not "wrong password").
    _, r = login(hub, DENIED, user)
    text = refused(r)
    assert "Invalid username or password" not in text
    s_ok, r = login(hub, ALLOWED, user)
    assert r.status_code == 302 and r.headers["Location"].endswith("/hub/spawn"), r.text

    # JupyterHub's REST API with the user's token: no spawn, no token, no reading.
    auth = {"Authorization": f"token {token}"}
    denied, allowed = client(DENIED), client(ALLOWED)
    refused(denied.post(hub.base + f"/hub/api/users/{name}/servers/x", headers=auth,
                        json={"image": hub.image, "cpu": "0.5", "mem": "512m"}, timeout=60))
    refused(denied.post(hub.base + f"/hub/api/users/{name}/tokens", headers=auth,
                        json={"note": "x"}, timeout=60))
    refused(denied.get(hub.base + f"/hub/api/users/{name}", headers=auth, timeout=60))
    r = hub.api("GET", f"/users/{name}")
    assert r.json()["servers"] == {}, r.text  # nothing was started
    assert allowed.get(hub.base + f"/hub/api/users/{name}", headers=auth,
                       timeout=60).status_code == 200

    # Hub pages and the OAuth step with the login cookie.
    cookie = client(DENIED, before.cookies)
    for page in ("/hub/home", "/hub/token", "/hub/spawn",
                 f"/hub/api/oauth2/authorize?client_id=jupyterhub-user-{name}"
                 f"&redirect_uri=/user/{name}/oauth_callback&response_type=code"):
        refused(cookie.get(hub.base + page, timeout=60, allow_redirects=False))
    assert client(ALLOWED, before.cookies).get(hub.base + "/hub/home",
                                               timeout=60).status_code == 200
    # Logging out stays possible from anywhere.
    r = cookie.get(hub.base + "/hub/logout", timeout=60, allow_redirects=False)
    assert r.status_code in (200, 302), r.status_code


def _server_status(hub, source: str, name: str, token: str) -> requests.Response:
    return client(source).get(hub.base + f"/user/{name}/api/status", timeout=60,
                              headers={"Authorization": f"token {token}"},
                              allow_redirects=False)


def _served_eventually(hub, source: str, name: str, token: str, status: int,
                       timeout: float = 30) -> None:
    """The server's answer to ``source`` becomes ``status`` (a policy change reaches the
    proxy's routes within seconds)."""
    deadline = time.monotonic() + timeout
    while (r := _server_status(hub, source, name, token)).status_code != status:
        assert time.monotonic() < deadline, (source, r.status_code, r.text[-1000:], hub.log()[-4000:])
        time.sleep(0.2)


def test_a_denied_address_cannot_reach_the_users_running_server(hub):
    user = new_user(hub)
    name = user["name"]
    token = token_of(hub, user)
    restrict(hub, user, [f"{ALLOWED}/32"])
    r = client(ALLOWED).post(hub.base + f"/hub/api/users/{name}/server", timeout=60,
                             headers={"Authorization": f"token {token}"},
                             json={"image": hub.image, "cpu": "0.5", "mem": "512m"})
    assert r.status_code in (201, 202), r.text
    try:
        hub.wait_ready(name, "")
        ok = _server_status(hub, ALLOWED, name, token)
        assert ok.status_code == 200, ok.text
        text = refused(_server_status(hub, DENIED, name, token))
        assert f"client address {DENIED} is not allowed for user '{name}'" in text
        # A websocket to the server from the denied address is refused at the handshake.
        import socket

        with socket.create_connection(("127.0.0.1", hub.port), timeout=30,
                                      source_address=(DENIED, 0)) as sock:
            sock.sendall((f"GET /user/{name}/api/kernels/x/channels HTTP/1.1\r\n"
                          f"Host: 127.0.0.1:{hub.port}\r\nUpgrade: websocket\r\n"
                          "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                          f"Authorization: token {token}\r\n\r\n").encode())
            head = sock.recv(4096).decode(errors="replace")
        assert head.startswith("HTTP/1.1 403") and REFUSAL in head, head

        # The policy changes: the running server follows within seconds, both ways.
        restrict(hub, user, [f"{DENIED}/32"])
        _served_eventually(hub, DENIED, name, token, 200)
        _served_eventually(hub, ALLOWED, name, token, 403)
        # No restriction at all: both are served.
        restrict(hub, user, None)
        _served_eventually(hub, ALLOWED, name, token, 200)
        assert _server_status(hub, DENIED, name, token).status_code == 200
    finally:
        hub.stop_server(name, "")
