"""Issue 22, rows 1 and 2: the hub lives on the hub's host only, and a cookie that a
user's host planted for the parent domain never makes a visitor act as that user
(``jupyterhub_backendai/hubgate.py``).

Real hubs in subdomain mode, local backend, SQLite (the gate acts before any database
work): with the ``*.localhost`` default, and with a registrable domain (hub at
``example.test``, users at ``<user>.example.test``, Chromium resolving both to loopback
with ``--host-resolver-rules``) over HTTP and over HTTPS with a certificate the test
makes. The attacks run in headless Chromium from a page that alice serves from her own
session (``python -m http.server`` behind her server's jupyter-server-proxy).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import uuid

import pytest
import requests

from .chromium import chromium
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub
from .services import free_port, wait_port
from .test_attacks_api import new_user, user_record

pytestmark = [pytest.mark.browser]

CONFIGS = ["localhost-http", "example.test-http", "example.test-https"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from jupyterhub_backendai.common.certs import make_certs

    d = tmp_path_factory.mktemp("pki")
    files = make_certs(str(d), {"web": ["example.test", "*.example.test", "localhost",
                                        "*.localhost", "127.0.0.1"]})
    return files["web"]


@pytest.fixture(scope="module", params=CONFIGS)
def world(request, tmp_path_factory, pki):
    """A hub in subdomain mode on the configuration's domain and scheme; alice with a
    running server; a superadmin token."""
    from jupyterhub_backendai.cli import create_superadmin

    domain, scheme = request.param.rsplit("-", 1)
    tmp = tmp_path_factory.mktemp("hubhost")
    db_url = f"sqlite:///{tmp}/backendai.sqlite"
    admin = create_superadmin(db_url, ADMIN_EMAIL, ADMIN_PASSWORD)
    env = {}
    https = scheme == "https"
    if https:
        env = {"BACKENDAI_SSL_CERT": pki["cert"], "BACKENDAI_SSL_KEY": pki["key"]}
    hub = Hub(db_url=db_url, backend="local", extra_env=env, ca=pki["ca"] if https else None)
    hub.admin_keys = (admin["access_key"], admin["secret_key"])
    hub.domain = domain
    hub.scheme = scheme
    hub.origin = f"{scheme}://{domain}:{hub.port}"
    hub.env["BACKENDAI_HUB_URL"] = hub.origin + "/"
    hub.env["BACKENDAI_SUBDOMAIN_HOST"] = hub.origin
    # The proxy listens on loopback (the name resolves only inside the browser).
    hub.extra_args += [f"--JupyterHub.bind_url={scheme}://127.0.0.1:{hub.port}/"]
    try:
        hub.start()
    except Exception as e:
        raise RuntimeError(f"hub did not start: {e}\n{hub.log()}") from e
    hub._token = _admin_token(hub)
    www = tmp / "www"
    www.mkdir()
    (www / "x.html").write_text(ATTACK_PAGE)
    page_port = free_port()
    page_server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(page_port), "--bind", "127.0.0.1",
         "--directory", str(www)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(page_port, timeout=20, proc=page_server)
        hub.alice = new_user(hub)
        hub.bob = new_user(hub)
        for u in (hub.alice, hub.bob):  # JupyterHub knows a user from the first login
            _log_in_as(hub, u["email"], "victim-pass-1")
        server = "s" + uuid.uuid4().hex[:4]
        r = hub.spawn(hub.alice["username"], server)
        assert r.status_code in (201, 202), r.text
        url = hub.wait_ready(hub.alice["username"], server)["url"]
        hub.alice_host = f"{hub.alice['username']}.{domain}:{hub.port}"
        assert url.startswith(f"{scheme}://{hub.alice_host}/user/"), url
        hub.page_url = f"{url.rstrip('/')}/proxy/{page_port}/x.html"
        yield hub
        hub.stop_server(hub.alice["username"], server)
    finally:
        page_server.terminate()
        page_server.wait(10)
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)


def _as(hub, host: str, method: str, path: str, **kw) -> requests.Response:
    """A request to the proxy as if sent to ``host`` (the Host header decides)."""
    return requests.request(method, hub.base + path, headers={"Host": host, **kw.pop("headers", {})},
                            allow_redirects=False, timeout=60, verify=hub.verify, **kw)


def _log_in_as(hub, email: str, password: str) -> dict[str, str]:
    """Log in on the hub's host without a browser; the cookies it set, by name (sent by
    hand: requests' cookie jar keeps no cookie for "localhost" or a name it cannot
    resolve)."""
    host = f"{hub.domain}:{hub.port}"
    jar: dict[str, str] = {}

    def keep(r):
        for c in r.raw.headers.getlist("Set-Cookie"):
            name, _, rest = c.partition("=")
            jar[name] = rest.split(";", 1)[0]

    keep(_as(hub, host, "GET", "/hub/login"))
    r = _as(hub, host, "POST", "/hub/login", data={
        "username": email, "password": password, "_xsrf": jar.get("_xsrf", "")},
        headers={"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())})
    assert r.status_code == 302, (r.status_code, r.text[:500])
    keep(r)
    return jar


def _admin_token(hub) -> str:
    jar = _log_in_as(hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    r = _as(hub, f"{hub.domain}:{hub.port}", "POST", "/hub/api/users/admin/tokens",
            json={"note": "hub-host test"},
            headers={"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items()),
                     "X-XSRFToken": jar["_xsrf"], "Referer": hub.origin + "/hub/token",
                     "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _clears(r: requests.Response) -> set[tuple[str, str, str]]:
    """(name, domain or "", path) of every cookie the answer deletes."""
    out = set()
    for c in r.raw.headers.getlist("Set-Cookie"):
        name, _, rest = c.partition("=")
        attrs = dict((a.strip().partition("=")[0].lower(), a.strip().partition("=")[2])
                     for a in rest.split(";")[1:])
        if rest.split(";", 1)[0] in ("", '""') and ("max-age" in attrs or "expires" in attrs):
            out.add((name, attrs.get("domain", ""), attrs.get("path", "")))
    return out


def _cleared(r: requests.Response, name: str) -> bool:
    return any(n == name for n, _, _ in _clears(r))


def _tokens(hub, user: str) -> set[str]:
    r = hub.api("GET", f"/users/{user}/tokens")
    assert r.status_code == 200, r.text
    return {t["id"] for t in r.json()["api_tokens"]}


# -- row 1, without a browser: every way in -----------------------------------------------


def test_no_hub_page_or_api_on_a_users_host(world):
    hub, alice = world, world.alice_host
    hub_host = f"{hub.domain}:{hub.port}"
    # Pages: redirected to the same path on the hub's host, the hub's cookies cleared.
    for path in ("/hub/login?next=%2Fhub%2Fhome", "/hub/home", "/hub/", "/hub", "/hub/token",
                 "/hub/spawn/" + hub.alice["username"], "/hub/admin"):
        r = _as(hub, alice, "GET", path)
        assert r.status_code == 302, (path, r.status_code, r.text[:300])
        assert r.headers["Location"] == hub.origin + path, (path, r.headers["Location"])
        assert _cleared(r, "jupyterhub-hub-login"), r.raw.headers.getlist("Set-Cookie")
    # Logging in there sets nothing: the form posts nowhere.
    r = _as(hub, alice, "POST", "/hub/login",
            data={"username": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
    assert r.status_code == 404, r.text
    assert "the hub is not served on a user's host" in r.json()["message"]
    assert not any(c.split("=", 1)[1].split(";")[0].strip('"')
                   for c in r.raw.headers.getlist("Set-Cookie")
                   if c.split("=", 1)[0].endswith("jupyterhub-hub-login")), r.headers
    # The API: 404 with a token too (and the token minted nowhere).
    admin = {"Authorization": f"token {hub.admin_token}"}
    before = _tokens(hub, hub.alice["username"])
    for method, path in (("GET", "/hub/api/user"), ("GET", "/hub/api/"),
                         ("POST", f"/hub/api/users/{hub.alice['username']}/tokens"),
                         ("PATCH", f"/hub/api/backendai/users/{hub.alice['id']}"),
                         ("GET", "/hub/api/oauth2/authorize?client_id=x")):
        r = _as(hub, alice, method, path, headers=admin, json={"role": "superadmin"})
        assert r.status_code == 404, (method, path, r.status_code, r.text[:300])
    assert _tokens(hub, hub.alice["username"]) == before
    assert user_record(hub, hub.alice["id"])["role"] == "user"
    # The hub's host and loopback (where kernels and the proxy reach it) still serve it.
    assert _as(hub, hub_host, "GET", "/hub/login").status_code == 200
    assert _as(hub, hub_host, "GET", "/hub/api/user", headers=admin).status_code == 200
    assert hub.api("GET", "/user").status_code == 200
    # alice's own server is still hers on her host.
    path = urllib.parse.urlsplit(hub.page_url).path
    r = _as(hub, alice, "GET", path)
    assert r.status_code in (200, 302), r.status_code
    if r.status_code == 302:  # to the OAuth flow on the hub's host, not on hers
        assert r.headers["Location"].startswith((hub.origin + "/hub/", "/hub/api/oauth2")) or \
            "/oauth_callback" in r.headers["Location"], r.headers["Location"]


def test_a_hub_cookie_sent_twice_is_refused_and_cleared(world):
    hub = world
    hub_host = f"{hub.domain}:{hub.port}"
    name = ("__Host-" if hub.scheme == "https" else "") + "jupyterhub-hub-login"
    v_mine = _log_in_as(hub, ADMIN_EMAIL, ADMIN_PASSWORD).get(name)  # the visitor
    v_theirs = _log_in_as(hub, world.alice["email"], "victim-pass-1").get(name)
    assert v_mine and v_theirs and v_mine != v_theirs

    def whoami(cookie: str) -> requests.Response:
        return _as(hub, hub_host, "GET", "/hub/api/user", headers={"Cookie": cookie})

    assert whoami(f"{name}={v_mine}").json()["name"] == "admin"
    for cookie in (f"{name}={v_theirs}; {name}={v_mine}", f"{name}={v_mine}; {name}={v_theirs}"):
        r = whoami(cookie)
        assert r.status_code == 400, r.text
        assert f"carries the hub's cookie {name} more than once" in r.json()["message"]
        clears = _clears(r)
        if name.startswith("__Host-"):  # host-only on /, never with a Domain
            assert (name, "", "/") in clears and not [c for c in clears if c[1]], clears
        else:  # the hub's own (host-only, /hub/) and one planted for the parent domain
            assert {(name, "", "/hub/"), (name, hub.domain, "/")} <= clears, clears


# -- rows 1 and 2 in Chromium -----------------------------------------------------------------

ATTACK_PAGE = """<!doctype html><html><body><p>cat pictures</p><script>
window.attack = async (uid, bob, tossed) => {
  const out = {};
  for (const p of ['/hub/login', '/hub/home', '/hub/token']) {
    try {
      const r = await fetch(p, {credentials: 'include', redirect: 'manual'});
      out[p] = r.type + ':' + r.status;
    } catch (e) { out[p] = 'error: ' + e; }
  }
  const tries = {
    patch: ['/hub/api/backendai/users/' + uid, 'PATCH', {role: 'superadmin'}],
    token: ['/hub/api/users/' + bob + '/tokens', 'POST', {note: 'mine now'}],
  };
  for (const [k, [path, method, body]] of Object.entries(tries)) {
    try {
      const r = await fetch(path, {method, credentials: 'include',
        referrer: location.origin + '/hub/home',
        headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
      out[k] = r.status;
    } catch (e) { out[k] = 'error: ' + e; }
  }
  if (tossed) {  // row 2: alice's own hub cookie, planted for the parent domain
    const [name, value, domain] = tossed;
    document.cookie = name + '=' + value + '; domain=' + domain + '; path=/';
    document.cookie = '__Host-' + name.replace('__Host-', '') + '=' + value + '; domain=' +
      domain + '; path=/; secure';
    out.planted = document.cookie;
  }
  return out;
};
</script></body></html>
"""


def _browser_args(hub) -> list[str]:
    args = [f"--host-resolver-rules=MAP {hub.domain} 127.0.0.1, MAP *.{hub.domain} 127.0.0.1"]
    if hub.scheme == "https":
        args.append("--ignore-certificate-errors")
    return args


def _log_in(page, hub) -> None:
    page.goto(hub.origin + "/hub/login")
    page.fill("input[name=username]", ADMIN_EMAIL)
    page.fill("input[name=password]", ADMIN_PASSWORD)
    page.click("#login_submit")
    page.wait_for_url(lambda u: "/hub/login" not in u)


def _open_alices_page(page, hub) -> None:
    """The visitor follows alice's link (through JupyterHub's OAuth, on the hub's host)."""
    page.goto(hub.page_url)
    for _ in range(100):
        if "cat pictures" in page.content():
            return
        authorize = page.locator("form [type=submit]", has_text="Authorize")
        if authorize.count():
            authorize.first.click()
            page.wait_for_load_state()
        page.wait_for_timeout(100)
    raise AssertionError(page.content()[:3000])


def test_a_users_page_cannot_use_the_hub_as_its_own_origin(world):
    """Row 1 as an attacker does it: alice's page sends the visitor (the superadmin) to
    ``/hub/login`` on alice's host, then, same-origin with whatever answers there, reads
    the hub's pages and calls the admin API with a hub Referer."""
    hub = world
    with chromium(*_browser_args(hub)) as browser:
        context = browser.new_context()
        context.set_default_timeout(30_000)
        page = context.new_page()
        # The lure: the login page "on alice's host" is the hub's own, on the hub's host.
        page.goto(f"{hub.scheme}://{hub.alice_host}/hub/login?next={urllib.parse.quote(hub.page_url)}")
        assert page.url.startswith(hub.origin + "/hub/login"), page.url
        page.fill("input[name=username]", ADMIN_EMAIL)
        page.fill("input[name=password]", ADMIN_PASSWORD)
        page.click("#login_submit")
        page.wait_for_url(lambda u: "/hub/login" not in u)
        alice_cookies = [c for c in context.cookies(f"{hub.scheme}://{hub.alice_host}/hub/")
                         if "jupyterhub-hub-login" in c["name"]]
        assert all(c["domain"].lstrip(".") == hub.domain for c in alice_cookies), alice_cookies
        assert not [c for c in context.cookies(f"{hub.scheme}://{hub.alice_host}/")
                    if c["domain"] == hub.alice_host.split(":")[0]
                    and c["name"].endswith(("jupyterhub-hub-login", "jupyterhub-session-id"))]
        before = _tokens(hub, hub.bob["username"])
        _open_alices_page(page, hub)
        out = page.evaluate("([uid, bob]) => window.attack(uid, bob, null)",
                            [hub.alice["id"], hub.bob["username"]])
        for p in ("/hub/login", "/hub/home", "/hub/token"):
            assert out[p] == "opaqueredirect:0", out  # to the hub's host: nothing to read
        assert out["patch"] == 404 and out["token"] == 404, out
        assert user_record(hub, hub.alice["id"])["role"] == "user"
        assert _tokens(hub, hub.bob["username"]) == before
        context.close()


def test_a_cookie_planted_by_a_users_page_never_makes_the_visitor_that_user(world):
    """Row 2: alice's page plants her own hub login cookie for the parent domain; the
    visitor's next hub request is never made as alice (over HTTP: refused and both
    cleared; over HTTPS: the hub's cookie is __Host-, which the page cannot plant)."""
    hub = world
    name = ("__Host-" if hub.scheme == "https" else "") + "jupyterhub-hub-login"
    alice_cookie = _log_in_as(hub, hub.alice["email"], "victim-pass-1").get(name)
    assert alice_cookie
    with chromium(*_browser_args(hub)) as browser:
        context = browser.new_context()
        context.set_default_timeout(30_000)
        page = context.new_page()
        _log_in(page, hub)
        _open_alices_page(page, hub)
        out = page.evaluate("([uid, bob, t]) => window.attack(uid, bob, t)",
                            [hub.alice["id"], hub.bob["username"],
                             [name.removeprefix("__Host-"), alice_cookie, hub.domain]])
        bare = name.removeprefix("__Host-")
        planted = f"{bare}={alice_cookie}" in out["planted"]
        # A registrable domain lets alice's host set a cookie for it (the attack's
        # premise); Chromium refuses Domain=localhost outright.
        assert planted == (hub.domain == "example.test"), out
        whoami_js = """async () => {
            const m = /(?:^|; )_xsrf=([^;]*)/.exec(document.cookie);
            const r = await fetch('/hub/api/user', {headers: {'X-XSRFToken': m ? m[1] : ''}});
            return [r.status, await r.text()]; }"""
        hub_page = context.new_page()
        first = hub_page.goto(hub.origin + "/hub/home")
        whoami = hub_page.evaluate(whoami_js)
        assert hub.alice["username"] not in whoami[1], whoami
        if planted and hub.scheme == "http":
            # Two login cookies: refused and both cleared, so the visitor is logged
            # out (not alice), and the next login is their own.
            assert first.status == 400, first.status
            assert "more than once" in hub_page.content()
            assert whoami[0] == 403, whoami
            assert not [c for c in context.cookies(hub.origin + "/hub/") if c["name"] == name]
            _log_in(page, hub)
            hub_page.goto(hub.origin + "/hub/home")
            whoami = hub_page.evaluate(whoami_js)
        # Over HTTPS the planted cookie is not the hub's (a __Host- one with a Domain is
        # refused by the browser, one without the prefix is not read).
        assert whoami[0] == 200 and json.loads(whoami[1])["name"] == "admin", whoami
        context.close()
