"""Issue 22, rows 8 and 10: an outage is a 503 with Retry-After, never a 401/403 (which
makes clients drop credentials that are still good) or a 500.

- The platform's PostgreSQL stops under a running hub: every call of the admin API (a
  JupyterHub token, the login cookie, a Backend.AI signature) and every login answers 503
  with Retry-After until it is back, then the same credentials work again.
- The packaged ``auto`` backend with a Docker engine that does not answer: the hub
  refuses to fall back (it runs no kernel) and a login says why, as a 503 page.
"""

from __future__ import annotations

import os
import shutil
import time

import requests

from .api_world import PASSWORD, PREFIX, new_user, superadmin
from .hub import Hub
from .services import Postgres
from .test_signing import signed


def test_a_database_outage_is_a_503_everywhere_and_credentials_survive_it(tmp_path):
    pg = Postgres()
    hub = None
    try:
        url = pg.new_database("outage")
        # Credentials are checked against the record at least every second here (the
        # default is a minute), so that the outage meets that check at once too.
        hub = Hub(db_url=url, backend="local",
                  extra_args=["--BackendAIAuthenticator.auth_refresh_age=1"]).start()
        sa = superadmin(hub)
        alice = new_user(sa)
        keys = (alice["keypair"]["access_key"], alice["keypair"]["secret_key"])
        cookie = hub.login(alice["email"], PASSWORD)
        assert cookie.last_login.status_code == 200

        def login() -> requests.Response:
            """What a browser does: the login page, then its form posted (with the
            page's own _xsrf: a token kept from an earlier page may no longer match the
            cookie, and a 403 came once, most likely JupyterHub's XSRF check)."""
            s = requests.Session()
            page = s.get(hub.base + "/hub/login", timeout=60)
            if page.status_code != 200:
                return page
            return s.post(hub.base + "/hub/login", timeout=60, allow_redirects=False, data={
                "username": alice["email"], "password": PASSWORD,
                "_xsrf": s.cookies.get("_xsrf", path="/hub/")})

        calls = {
            "token": lambda: requests.get(hub.base + PREFIX + "/whoami", timeout=60,
                                          headers={"Authorization": f"token {alice['token']}"}),
            "cookie": lambda: cookie.get(hub.base + PREFIX + "/whoami", timeout=60),
            "signed": lambda: signed(hub, "GET", "/whoami", *keys),
            "login": login,
        }
        for name, call in calls.items():
            r = call()
            assert r.status_code in (200, 302), (name, r.status_code, r.text[:300])

        pg.pause()
        seen: dict[str, set[int]] = {name: set() for name in calls}
        deadline = time.monotonic() + 60
        # Every answer during the outage is a 503 with Retry-After and words; each way in
        # answers it (once the per-second credential check is due, at the latest).
        while any(503 not in v for v in seen.values()):
            assert time.monotonic() < deadline, (seen, hub.log()[-3000:])
            for name, call in calls.items():
                r = call()
                seen[name].add(r.status_code)
                assert r.status_code in (200, 503), (name, r.status_code, r.text[-3000:])
                if r.status_code == 503:
                    assert r.headers["Retry-After"] == "5", (name, r.headers)
                    if name == "login":
                        assert "Cannot log in now: the hub&#39;s database does not answer" in \
                            r.text or "Cannot log in now: the hub's database does not answer" \
                            in r.text, r.text[-2000:]
                    else:
                        assert r.headers["Retry-After"] == "5", r.headers
                        assert "the hub's database does not answer" in r.json()["detail"]
            time.sleep(0.2)

        pg.resume()
        # Back: the same credentials work again (none was dropped or refused).
        deadline = time.monotonic() + 60
        while True:
            codes = {name: call().status_code for name, call in calls.items()}
            if set(codes.values()) <= {200, 302}:
                break
            assert set(codes.values()) <= {200, 302, 503}, codes
            assert time.monotonic() < deadline, codes
            time.sleep(0.2)
        assert alice["username"] in calls["token"]().text
    finally:
        if hub is not None:
            hub.close()
            shutil.rmtree(hub.dir, ignore_errors=True)
        pg.stop()


def test_a_hub_without_its_engine_says_why_at_login(tmp_path):
    hub = Hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="auto",
              extra_env={"DOCKER_HOST": f"unix://{tmp_path}/docker.sock"},
              extra_args=["--Agent.docker_wait=0"])
    try:
        hub.start()
        r = hub.login().last_login
        assert r.status_code == 503, (r.status_code, r.text[-2000:])
        assert "Sessions cannot start on this hub" in r.text, r.text[-3000:]
        assert f"the Docker engine at unix://{tmp_path}/docker.sock does not answer" in r.text
        kernels = os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels")
        assert not os.path.isdir(kernels) or os.listdir(kernels) == []
    finally:
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)
