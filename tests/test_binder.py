"""The Binder demo end to end: build ``binder/`` like repo2docker, run it like Binder, use it
in a real browser as a visitor would.

Steps, and how each one differs from what repo2docker and mybinder.org do:

1. Copy the repository into a temporary folder owned by the unprivileged user
   ``binderuser`` (created with ``useradd -m`` when missing; when the suite does not
   run as root, the current user plays it).
   Binder: ``git clone`` of one commit, ``COPY --chown`` into ``$REPO_DIR``, which
   is ``$HOME`` (``/home/jovyan``). Here: the working tree's tracked and untracked,
   not ignored, files (so uncommitted work is tested); the repo and ``$HOME`` are
   two sibling folders.
2. Make a fresh environment of the Python that ``binder/runtime.txt`` names and
   ``pip install -r binder/requirements.txt`` from the repository root, as
   repo2docker does after copying the repo (the file has a local path, ``-e .``).
   Binder: a conda env that already holds repo2docker's base packages (Notebook 7,
   JupyterLab 4, jupyterhub-singleuser 5, jupyter-resource-usage, ipywidgets,
   nodejs 20, ...), and pip runs as the notebook user without a cache. Here: a
   ``uv venv`` with only what requirements.txt pulls in (it pins Notebook, the one
   base package the demo needs), installed with ``uv pip`` (``python -m venv`` +
   pip when uv is missing) as root with root's download cache, copying files out
   of it (no hard links), then ``chown``-ed to binderuser. Node and npm are the
   system's.
3. Run ``./binder/postBuild`` as binderuser from the repository root, like
   repo2docker (``RUN ./binder/postBuild`` as ``$NB_USER``). The environment is
   this machine's minus what points at this checkout (``JUPYTER*``, ``BACKENDAI_*``,
   ``VIRTUAL_ENV``, ...), plus what repo2docker's Dockerfile sets (``USER``,
   ``NB_USER``, ``NB_UID``, ``REPO_DIR``, ``PYTHONUNBUFFERED``), with ``HOME`` the
   temporary home and ``PATH`` = ``~/.local/bin``, ``$REPO_DIR/.local/bin``, the
   env's ``bin``, the system (the machine's locale and certificate settings stay,
   so npm reaches its registry; Binder sets ``LANG=en_US.UTF-8``).
4. Start repo2docker's default command, ``jupyter notebook --ip 0.0.0.0``, as
   binderuser in the repository, with the base URL ``/user/<name>/`` and a token:
   ``jupyter notebook --ip 127.0.0.1 --port <free> --no-browser
   --ServerApp.base_url=/user/<name>/ --IdentityProvider.token=<token>``.
   Binder: repo2docker's entrypoint would run ``binder/start`` first (there is
   none); BinderHub's JupyterHub starts the server with the base URL from
   ``JUPYTERHUB_SERVICE_PREFIX`` and logs the visitor in by OAuth, so the demo hub
   lives under ``/user/<name>/backendai-hub/``. Here the base URL is a command-line
   option, a token stands in for the OAuth login, and the server listens on
   loopback only. The 2 GB memory limit, the culling after 10 idle minutes and the
   container's isolation are not enforced here.
5. Headless Chromium, as a visitor: JupyterLab at ``/user/<name>/lab`` (Binder's
   ``?urlpath=lab``); click the "Backend.AI Hub" launcher tile (it opens a new tab,
   like a person's click); the hub's login page; log in as alice (a demo user whose
   keypair has the ``demo`` resource policy: 1 CPU in all); the spawn form
   (image ``local/python``, 0.5 CPU, 256m) with the demo project's vfolder
   ``shared`` ticked; the session's JupyterLab; a notebook; the cell ``1+1`` shows
   ``2``, the next one reads ``shared/README.md`` and writes ``shared/from-alice.txt``.
   A second named session through the hub's spawn
   page starts too; a third waits PENDING and its progress page says "quota
   exceeded" (the agent itself has room for four); the demo's processes then use
   less than Binder's 2 GB. Then alice logs out, bob logs in, starts a session
   with ``shared`` ticked and his JupyterLab's contents API serves alice's file from
   it; bob logs out, the demo
   superadmin logs in, and the admin console (``/hub/admin``) lists alice's three
   servers, the third one pending.
6. Clean up: the server's process group, the sessions and the hub's proxy by the
   pids the platform recorded, anything else running from the temporary folder, and
   the folder.
"""

from __future__ import annotations

import glob
import json
import os
import re
import runpy
import shutil
import time
from decimal import Decimal
from types import SimpleNamespace

import pytest

from .binder_helpers import REPO, BinderSim
from .chromium import CHROMIUM, chromium

# The demo project's shared vfolder in the spawn form, and the first line of its README.
SHARED_LABEL = "shared (project demo-project, read-write)"
SHARED_README_LINE = "The demo project's shared folder"


def _demo_accounts() -> dict:
    with open(os.path.join(REPO, "binder", "demo-fixture.json")) as f:
        return {u["email"].split("@")[0]: (u["email"], u["password"]) for u in json.load(f)["users"]}


@pytest.fixture
def binder():
    if not shutil.which("npm"):
        pytest.fail("npm is needed (postBuild installs configurable-http-proxy with it)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is needed (scripts/install-test-deps.sh installs it)")
    sim = BinderSim()
    try:
        yield sim
    finally:
        sim.close()


def _login(page, account) -> None:
    page.locator("#username_input").wait_for()
    page.fill("#username_input", account[0])
    page.fill("#password_input", account[1])
    page.click("#login_submit")


@pytest.mark.browser
def test_binder_demo(binder, tmp_path):
    from playwright.sync_api import expect

    accounts = _demo_accounts()
    hub_url = f"{binder.url}backendai-hub/"
    t0 = time.monotonic()
    times = {}

    def mark(name):
        times[name] = round(time.monotonic() - t0, 1)

    binder.copy_repo()
    binder.install_requirements()
    binder.chown()
    mark("installed")
    assert binder.user.pw_uid != 0
    out = binder.post_build()
    for email, password in accounts.values():
        assert f"{email} / {password}" in out, out
    assert "Vfolder 'shared' of project demo-project (rw for its members)" in out, out
    # The shared folder, on the volume the hub will serve, made by the notebook user.
    (readme,) = glob.glob(os.path.join(binder.home, ".backendai-demo", "vfroot", "volume1",
                                       "project", "*", "*", "README.md"))
    assert os.stat(os.path.dirname(readme)).st_uid == binder.user.pw_uid
    # Made by the notebook user, not root.
    record = os.path.join(binder.state_dir, "backendai.sqlite")
    assert os.stat(record).st_uid == binder.user.pw_uid
    mark("postBuild")
    binder.start_server()
    mark("server")

    with chromium() as browser:
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        ctx.set_default_timeout(60_000)
        page = ctx.new_page()
        pages = {"lab": page}
        try:
            page.goto(f"{binder.url}lab?token={binder.token}")
            tile = page.locator(".jp-LauncherCard", has_text="Backend.AI Hub")
            tile.wait_for(timeout=120_000)
            mark("lab")

            # Playwright hands the new tab over once its first response came, and
            # jupyter-server-proxy answers that first request once it has started the hub
            # (binder/jupyter_server_config.py gives it 120 s): CI's loaded run needed more
            # than the 30 s this waited.
            tile.click(trial=True)  # shown, still, nothing over it
            with ctx.expect_page(timeout=150_000) as opened:
                tile.click()
            hub = pages["hub"] = opened.value
            # The first request starts the hub (postBuild did the migrations).
            hub.wait_for_url(re.compile(re.escape(hub_url) + r"hub/login"), timeout=180_000)
            mark("hub login")

            _login(hub, accounts["alice"])
            hub.wait_for_url(re.compile(r"/backendai-hub/hub/spawn"))
            expect(hub.locator("#backendai-image")).to_have_value("local/python")
            expect(hub.locator("#backendai-cpu")).to_have_value("0.5")
            expect(hub.locator("#backendai-mem")).to_have_value("256m")
            # The demo project's shared vfolder (postBuild's fixture made it).
            hub.get_by_label(SHARED_LABEL).check()
            hub.click("button[type=submit]")
            hub.wait_for_url(re.compile(re.escape(hub_url) + r"user/alice/lab"), timeout=180_000, wait_until="commit")
            mark("session")

            card = hub.locator('.jp-LauncherCard[data-category="Notebook"]').first
            card.wait_for(timeout=120_000)
            # A cell run before the notebook has its kernel is not run at all (a person
            # sees the kernel come up first): wait for the kernel's first message.
            kernel_messages = []

            def kernel_channels(ws) -> bool:
                if "/api/kernels/" in ws.url and "/channels" in ws.url:
                    ws.on("framereceived", lambda frame: kernel_messages.append(frame))
                    return True
                return False

            with hub.expect_websocket(kernel_channels, timeout=120_000):
                card.click()
            deadline = time.monotonic() + 120
            while not kernel_messages and time.monotonic() < deadline:
                hub.wait_for_timeout(100)
            assert kernel_messages, "the kernel never spoke"
            editor = hub.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
            editor.wait_for(timeout=120_000)
            editor.click()
            hub.keyboard.type("1+1")
            expect(editor).to_have_text("1+1")
            hub.keyboard.press("Shift+Enter")
            result = hub.locator(".jp-NotebookPanel .jp-OutputArea-output").first
            expect(result).to_have_text("2", timeout=120_000)
            mark("1+1")

            # The shared folder, at shared/ beside the notebook: read its README, leave a file.
            editor = hub.locator(".jp-NotebookPanel .jp-Cell .cm-content").nth(1)
            editor.click()
            hub.keyboard.type(
                'open("shared/from-alice.txt", "w").write("hello from alice"); '
                'print(open("shared/README.md").read())')
            hub.keyboard.press("Shift+Enter")
            readme = hub.locator(".jp-NotebookPanel .jp-OutputArea-output").nth(1)
            expect(readme).to_contain_text(SHARED_README_LINE, timeout=60_000)
            mark("shared")

            # A second session fits alice's quota (1 CPU: two of 0.5).
            hub.goto(f"{hub_url}hub/spawn/alice/second")
            hub.click("button[type=submit]")
            hub.wait_for_url(re.compile(re.escape(hub_url) + r"user/alice/second/"), timeout=180_000)
            hub.locator("#jp-main-dock-panel").wait_for(timeout=120_000)
            mark("second")
            # JupyterLab may still move this tab to its workspace URL (".../lab/workspaces/
            # auto-X?reset=1") after it showed: a navigation started now could be overtaken
            # by it (a CI run's failure). The hub's other pages go on in a fresh tab.
            hub.close()
            hub = pages["hub"] = ctx.new_page()

            # A third does not: it waits, and its progress page says why.
            hub.goto(f"{hub_url}hub/spawn/alice/third")
            hub.click("button[type=submit]")
            hub.wait_for_url(re.compile(r"/hub/spawn-pending/alice/third"))
            expect(hub.locator("#progress-message")).to_contain_text(
                "quota exceeded", timeout=60_000)
            message = hub.locator("#progress-message").inner_text()
            assert message == (
                "pending: quota exceeded: your keypair's resource policy allows 1 core in total; "
                "1 core is in use and this session asks for 0.5 more "
                "(keypair policy 'demo', total_resource_slots)"), message
            mark("quota")
            # mybinder.org gives a container 2 GB: the whole demo, with two sessions
            # and a kernel running, must fit (the browser is the visitor's, not counted).
            used = binder.memory()
            print(f"binder demo memory with two sessions: {used / 2**20:.0f} MiB")
            assert 0 < used < 2 * 10**9, used

            # The admin console: log out (alice's sessions keep running) and log in as
            # the demo superadmin, in the same window (on Binder, a new window would not
            # be logged in to the visitor's Binder server).
            hub.goto(f"{hub_url}hub/logout")

            # bob, in the same project, mounts the same folder and finds alice's file.
            hub.goto(f"{hub_url}hub/login")
            _login(hub, accounts["bob"])
            hub.wait_for_url(re.compile(r"/backendai-hub/hub/spawn"))
            hub.get_by_label(SHARED_LABEL).check()
            hub.click("button[type=submit]")
            hub.wait_for_url(re.compile(re.escape(hub_url) + r"user/bob/lab"), timeout=180_000, wait_until="commit")
            hub.locator("#jp-main-dock-panel").wait_for(timeout=120_000)
            # What bob's JupyterLab shows in shared/ (its file browser's API).
            seen = hub.evaluate(
                """async (prefix) => {
                    // As JupyterLab asks: with the server's _xsrf cookie as a header.
                    const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
                    const r = await fetch(prefix + 'api/contents/shared/from-alice.txt?content=1',
                                          {headers: {'X-XSRFToken': decodeURIComponent(xsrf)}});
                    return [r.status, r.ok ? (await r.json()).content : await r.text()];
                }""",
                f"{binder.prefix}backendai-hub/user/bob/",
            )
            assert seen == [200, "hello from alice"], seen
            mark("bob")
            hub.goto(f"{hub_url}hub/logout")

            hub.goto(f"{hub_url}hub/login")
            _login(hub, accounts["admin"])
            hub.wait_for_url(re.compile(re.escape(hub_url) + r"hub/(spawn|home)"))
            admin = hub
            admin.goto(f"{hub_url}hub/admin")
            # One row per server: alice's two running ones and the one waiting on her quota.
            expect(admin.get_by_test_id("user-row-alice")).to_contain_text("Stop Server")
            expect(admin.get_by_test_id("user-row-alice-second")).to_contain_text("Stop Server")
            expect(admin.get_by_test_id("user-row-alice-third")).to_contain_text("Server is pending")
            expect(admin.get_by_test_id("user-row-admin")).to_be_visible()
            mark("admin")
        except Exception:
            for name, pg in pages.items():
                try:
                    pg.screenshot(path=str(tmp_path / f"{name}.png"))
                except Exception:
                    pass
            print(f"screenshots in {tmp_path}; timings {times}")
            print(binder.log()[-20000:])
            raise
    print(f"binder demo timings (s since start): {times}")


def _server_proxy_entry(monkeypatch, tmp_path) -> dict:
    from traitlets.config import Config

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("BACKENDAI_DEMO_DIR", raising=False)
    cfg = Config()
    runpy.run_path(os.path.join(REPO, "binder", "jupyter_server_config.py"),
                   init_globals={"get_config": lambda: cfg})
    return cfg.ServerProxy.servers["backendai-hub"]


def test_binder_server_proxy_entry(monkeypatch, tmp_path):
    """The tile's command and environment, rendered as jupyter-server-proxy renders them."""
    from jupyter_server_proxy.utils import call_with_asked_args

    from jupyterhub_backendai.common.slots import parse_size

    entry = _server_proxy_entry(monkeypatch, tmp_path)
    assert entry["absolute_url"] is True
    assert entry["launcher_entry"]["title"] == "Backend.AI Hub"
    args = {"port": 41234, "base_url": "/user/someone/", "unix_socket": ""}
    cmd = [a.format(**args) for a in call_with_asked_args(entry["command"], args)]
    env = {k: v.format(**args) for k, v in call_with_asked_args(entry["environment"], args).items()}

    assert os.path.basename(cmd[0]) == "backendai-hub"
    assert any(a.startswith("--ConfigurableHTTPProxy.api_url=http://127.0.0.1:") for a in cmd)
    assert env["BACKENDAI_HUB_URL"] == "http://127.0.0.1:41234/user/someone/backendai-hub/"
    assert env["BACKENDAI_AGENT_BACKEND"] == "local"
    assert env["BACKENDAI_STATE_DIR"] == str(tmp_path / ".backendai-demo" / "state")
    assert env["BACKENDAI_CHP"].startswith(str(tmp_path / ".backendai-demo" / "node"))
    # vfolders live in the demo's folder of the user's home (postBuild fills it too).
    (volumes,) = [json.loads(a.split("=", 1)[1]) for a in cmd
                  if a.startswith("--BackendAIManager.storage_volumes=")]
    assert volumes == {"volume1": {"backend": "vfs",
                                   "path": str(tmp_path / ".backendai-demo" / "vfroot" / "volume1")}}

    # The sizes the walkthrough promises: the agent has room for four default
    # sessions, the "demo" keypair policy for two, so the third waits on the quota.
    opts = dict(a[2:].split("=", 1) for a in cmd if a.startswith("--BackendAISpawner.default_"))
    session = {"cpu": Decimal(opts["BackendAISpawner.default_cpu"]),
               "mem": parse_size(opts["BackendAISpawner.default_mem"])}
    agent = json.loads(env["BACKENDAI_AGENT_SLOTS"])
    agent = {"cpu": Decimal(str(agent["cpu"])), "mem": parse_size(agent["mem"])}
    assert min(agent[k] // session[k] for k in session) == 4
    with open(os.path.join(REPO, "binder", "demo-fixture.json")) as f:
        fixture = json.load(f, parse_float=Decimal)
    (policy,) = [p for p in fixture["keypair_resource_policies"] if p["name"] == "demo"]
    quota = policy["total_resource_slots"]
    assert min(Decimal(quota[k]) // session[k] for k in quota) == 2
    users = [u for u in fixture["users"] if u.get("role", "user") == "user"]
    assert len(users) == 2 and {u.get("keypair_resource_policy") for u in users} == {"demo"}


def test_binder_starting_page(monkeypatch, tmp_path):
    """The proxy's bare 404 before the hub has added its routes becomes a reloading page."""
    from jupyter_server_proxy.handlers import RewritableResponse
    from tornado.httpclient import HTTPRequest, HTTPResponse
    from tornado.httputil import HTTPHeaders

    rewrite = _server_proxy_entry(monkeypatch, tmp_path)["rewrite_response"]

    def respond(code, headers, method="GET"):
        orig = HTTPResponse(HTTPRequest("http://127.0.0.1:1/backendai-hub/"), code,
                            headers=HTTPHeaders(headers), buffer=None)
        resp = RewritableResponse(orig_response=orig)
        resp.body = b"Not Found" if code == 404 else b"hub"
        rewrite(response=resp, request=SimpleNamespace(method=method))
        return resp

    r = respond(404, {})
    assert r.code == 503 and b'http-equiv="refresh"' in r.body
    assert r.headers["Content-Type"].startswith("text/html")
    # The hub's own answers pass unchanged.
    assert respond(404, {"Content-Type": "text/html"}).code == 404
    assert respond(302, {"Location": "/backendai-hub/hub/"}).code == 302
    assert respond(404, {}, method="POST").code == 404
