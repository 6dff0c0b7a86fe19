"""Issue 10, row 1, in headless Chromium: a page served from alice's server tries to make
alice a superadmin with the logged-in superadmin's cookie. Refused in both configurations:

- one origin (servers under ``/user/...`` on the hub's host): the page is same-origin
  with the hub, opens ``/hub/home``, reads the ``_xsrf`` cookie from that window and
  PATCHes the admin API with it. JupyterHub's XSRF check passes; the admin API refuses
  cookie-authenticated changes whose Referer is not one of the hub's own pages.
- subdomains (``http://localhost:<port>/`` hub, servers on ``alice.localhost``): the page
  has another origin; it can neither read the hub window nor send the change.

The page is served by ``python -m http.server`` (what alice would run in her session),
reached through her server's jupyter-server-proxy at ``/user/alice/<server>/proxy/<port>/``.
Local backend, SQLite (the refusal happens before any database work).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest
import requests

from .chromium import chromium
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub
from .services import free_port, wait_port
from .test_attacks_api import new_user, user_record

pytestmark = [pytest.mark.browser]

ATTACK_PAGE = """<!doctype html><html><body><p>cat pictures</p><script>
window.attack = (async () => {
  const hub = new URLSearchParams(location.search).get('hub');
  const uid = new URLSearchParams(location.search).get('uid');
  const out = {};
  try {
    const w = window.open(hub + '/hub/home');
    let cookie = null;
    for (let i = 0; i < 200 && cookie === null; i++) {
      await new Promise(r => setTimeout(r, 50));
      try {
        if (w.document.readyState === 'complete' && w.location.pathname.startsWith('/hub/'))
          cookie = w.document.cookie;
      } catch (e) { out.read_error = String(e); break; }
    }
    const m = /(?:^|; )_xsrf=([^;]*)/.exec(cookie || '');
    out.xsrf = m ? decodeURIComponent(m[1]) : null;
    const r = await fetch(hub + '/hub/api/backendai/users/' + uid, {
      method: 'PATCH', credentials: 'include',
      headers: {'Content-Type': 'application/json', 'X-XSRFToken': out.xsrf || ''},
      body: JSON.stringify({role: 'superadmin'})});
    out.status = r.status;
    out.body = await r.text();
  } catch (e) { out.fetch_error = String(e); }
  return out;
})();
</script></body></html>
"""


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def attack_server(tmp_path):
    """alice's ``python -m http.server`` with the attack page (her session's process)."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "x.html").write_text(ATTACK_PAGE)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                             "127.0.0.1", "--directory", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, timeout=20, proc=proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _hub(tmp_path, subdomains: bool) -> Hub:
    from jupyterhub_backendai.cli import create_superadmin

    db_url = f"sqlite:///{tmp_path}/backendai.sqlite"
    admin = create_superadmin(db_url, ADMIN_EMAIL, ADMIN_PASSWORD)
    hub = Hub(db_url=db_url, backend="local")
    hub.admin_keys = (admin["access_key"], admin["secret_key"])
    # Where the browser goes; requests (whose cookie jar mishandles "localhost") keep
    # using hub.base, 127.0.0.1, which reaches the hub in both configurations.
    hub.browser_base = hub.base
    if subdomains:
        hub.browser_base = f"http://localhost:{hub.port}"
        hub.env["BACKENDAI_HUB_URL"] = hub.browser_base + "/"
        hub.env["BACKENDAI_SUBDOMAIN_HOST"] = hub.browser_base
    else:
        hub.env["BACKENDAI_SUBDOMAIN_HOST"] = ""
    return hub


@pytest.mark.parametrize("mode", ["single-origin", "subdomains"])
def test_page_on_a_users_server_cannot_promote_its_owner(mode, tmp_path, browser, attack_server):
    hub = _hub(tmp_path, subdomains=mode == "subdomains")
    try:
        try:
            hub.start()
        except Exception as e:
            raise RuntimeError(f"hub did not start: {e}\n{hub.log()}") from e
        context = browser.new_context()
        context.set_default_timeout(30_000)
        page = context.new_page()
        base = hub.browser_base
        # The superadmin logs in (in the browser: with subdomains the session cookie is
        # for "localhost", which requests' cookie jar does not keep).
        page.goto(base + "/hub/login")
        page.fill("input[name=username]", ADMIN_EMAIL)
        page.fill("input[name=password]", ADMIN_PASSWORD)
        page.click("#login_submit")
        page.wait_for_url(lambda u: "/hub/login" not in u)
        page.goto(base + "/hub/home")
        hub._token = page.evaluate("""async () => {
            const xsrf = decodeURIComponent(/(?:^|; )_xsrf=([^;]*)/.exec(document.cookie)[1]);
            const r = await fetch('/hub/api/users/admin/tokens', {method: 'POST',
              headers: {'Content-Type': 'application/json', 'X-XSRFToken': xsrf},
              body: JSON.stringify({note: 'attack test'})});
            return (await r.json()).token; }""")
        assert hub._token
        alice = new_user(hub)
        assert hub.login(alice["email"], "victim-pass-1").last_login.status_code == 200
        server = "att" + uuid.uuid4().hex[:4]
        r = hub.spawn(alice["username"], server)
        assert r.status_code in (201, 202), r.text
        model = hub.wait_ready(alice["username"], server)
        server_url = model["url"]
        if not server_url.startswith("http"):
            server_url = base + server_url
        if mode == "subdomains":
            assert server_url.startswith(f"http://{alice['username']}.localhost:{hub.port}/")
        else:
            assert server_url.startswith(base + "/user/")
        page_url = (f"{server_url.rstrip('/')}/proxy/{attack_server}/x.html"
                    f"?hub={base}&uid={alice['id']}")

        # ...opens alice's link, and clicks through JupyterHub's "Authorize access".
        page.goto(page_url)
        deadline = time.monotonic() + 30
        while "cat pictures" not in page.content():
            authorize = page.locator("form [type=submit]", has_text=re.compile("Authorize", re.I))
            if authorize.count():
                authorize.first.click()
                page.wait_for_load_state()
            assert time.monotonic() < deadline, page.content()[:3000]
            page.wait_for_timeout(100)
        result = page.evaluate("window.attack")

        if mode == "single-origin":
            # Same origin: the page did read the XSRF token, so only the new check stands.
            assert result.get("xsrf"), result
            assert result["status"] == 403, result
            assert "must come from the hub's own pages" in result["body"], result
            assert "/proxy/" in result["body"], result
        else:
            # Another origin: the hub window is unreadable and the change never lands.
            assert not result.get("xsrf"), result
            assert result.get("status") in (None, 403), result
        assert user_record(hub, alice["id"])["role"] == "user"

        # The hub's own pages still make changes with the cookie (same request, from /hub/).
        hub_page = context.new_page()
        hub_page.goto(base + "/hub/home")
        status = hub_page.evaluate("""async (uid) => {
            const xsrf = decodeURIComponent(/(?:^|; )_xsrf=([^;]*)/.exec(document.cookie)[1]);
            const r = await fetch('/hub/api/backendai/users/' + uid, {method: 'PATCH',
              headers: {'Content-Type': 'application/json', 'X-XSRFToken': xsrf},
              body: JSON.stringify({full_name: 'Alice from the admin page'})});
            return r.status; }""", alice["id"])
        assert status == 200
        assert user_record(hub, alice["id"])["full_name"] == "Alice from the admin page"
        context.close()
        hub.stop_server(alice["username"], server)
    finally:
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)


def test_cookie_changes_from_a_server_page_are_refused_without_a_browser(tmp_path):
    """The same rule over plain HTTP: Referer under /user/ or another site's Fetch
    metadata is refused; a script with a session cookie and no browser headers is left
    to the XSRF check."""
    hub = _hub(tmp_path, subdomains=False)
    try:
        hub.start()
        alice = new_user(hub)
        s = hub.login()
        xsrf = s.cookies.get("_xsrf", path="/hub/")
        url = hub.base + f"/hub/api/backendai/users/{alice['id']}"
        cases = [
            ({"Sec-Fetch-Site": "same-origin", "Referer": hub.base + "/user/alice/x.html"},
             "came from '/user/alice/x.html'"),
            ({"Sec-Fetch-Site": "same-site", "Referer": hub.base + "/hub/home"},
             "came from a same-site page"),
            ({"Sec-Fetch-Site": "same-origin"}, "no Referer"),
            ({"Referer": "http://evil.example/hub/home"}, "on 'evil.example'"),
        ]
        for headers, words in cases:
            r = s.patch(url, json={"role": "superadmin"},
                        headers={"X-XSRFToken": xsrf, **headers}, timeout=60)
            assert r.status_code == 403, (headers, r.text)
            assert words in r.json()["detail"], (headers, r.text)
        assert user_record(hub, alice["id"])["role"] == "user"
        ok = s.patch(url, json={"full_name": "A"}, timeout=60, headers={
            "X-XSRFToken": xsrf, "Sec-Fetch-Site": "same-origin",
            "Referer": hub.base + "/hub/admin"})
        assert ok.status_code == 200, ok.text
        # A token is not ambient authority: no Referer needed.
        r = requests.patch(url, json={"full_name": "B"}, timeout=60,
                           headers={"Authorization": f"token {hub.admin_token}"})
        assert r.status_code == 200, r.text
    finally:
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)
