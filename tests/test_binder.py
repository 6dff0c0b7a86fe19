"""The Binder demo end to end: build ``binder/`` like repo2docker, run it like Binder, use it
in a real browser.

Steps, and how each one differs from what repo2docker and mybinder.org do:

1. Copy the repository into a temporary folder owned by the unprivileged user
   ``binderuser`` (created with ``useradd -m`` when missing).
   Binder: ``git clone`` of one commit, ``COPY --chown`` into ``$REPO_DIR``, which
   is ``$HOME`` (``/home/jovyan``). Here: the working tree's tracked and untracked,
   not ignored, files (so uncommitted work is tested); the repo and ``$HOME`` are
   two sibling folders.
2. Make a fresh environment and ``pip install -r binder/requirements.txt`` from the
   repository root, as repo2docker does after copying the repo (the file has a local
   path, ``-e .``).
   Binder: a conda env with Python 3.11 (``runtime.txt``) that already holds
   repo2docker's base packages (JupyterLab, Notebook, jupyterhub-singleuser 5,
   nodejs 20, ...), and pip runs as the notebook user without a cache. Here: a
   ``uv venv`` on the system's Python >= 3.11 with only what requirements.txt pulls
   in, installed with ``uv pip`` (``python -m venv`` + pip when uv is missing), as
   root with root's cache for speed, then ``chown``-ed to binderuser. Node and npm
   are the system's.
3. Run ``./binder/postBuild`` as binderuser from the repository root, like
   repo2docker (``RUN ./binder/postBuild`` as ``$NB_USER``). The environment is
   this machine's minus what points at this checkout (``JUPYTER*``, ``BACKENDAI_*``,
   ``VIRTUAL_ENV``, ...), with ``HOME`` the temporary home and ``PATH`` =
   ``~/.local/bin``, the env's ``bin``, the system (the machine's certificate
   settings stay, so npm reaches its registry).
4. Start the notebook server as binderuser in the repository:
   ``jupyter server --no-browser --ip=127.0.0.1 --port=<free> --ServerApp.token=<tok>``.
   Binder: BinderHub's JupyterHub starts ``jupyterhub-singleuser`` with base URL
   ``/user/<name>/`` and OAuth login, so the demo hub lives under
   ``/user/<name>/backendai-hub/``; here the base URL is ``/`` and the hub is at
   ``/backendai-hub/``. No ``binder/start`` exists, so none is run. The 2 GB memory
   limit and the container's isolation are not enforced here.
5. Headless Chromium: JupyterLab at ``/lab?token=...``; click the "Backend.AI Hub"
   launcher tile (it opens a new tab, like a person's click); the hub's login page;
   log in as alice; the spawn form (image ``local/python``); the session's
   JupyterLab; a notebook; the cell ``1+1`` shows ``2``.
6. Clean up: the server's process group, the sessions and the hub's proxy by the
   pids the platform recorded, anything else running from the temporary folder, and
   the folder.
"""

from __future__ import annotations

import re
import shutil
import time

import pytest

from .binder_helpers import BinderSim

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run",
]
ALICE = ("alice@demo.example", "alice-demo-pass")


@pytest.fixture
def binder():
    if not shutil.which("npm"):
        pytest.fail("npm is needed (postBuild installs configurable-http-proxy with it)")
    sim = BinderSim()
    try:
        yield sim
    finally:
        sim.close()


def test_binder_demo(binder, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    t0 = time.monotonic()
    times = {}

    def mark(name):
        times[name] = round(time.monotonic() - t0, 1)

    binder.copy_repo()
    binder.install_requirements()
    binder.chown()
    mark("installed")
    out = binder.post_build()
    assert "alice@demo.example / alice-demo-pass" in out, out
    mark("postBuild")
    binder.start_server()
    mark("server")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        ctx.set_default_timeout(60_000)
        page = ctx.new_page()
        hub = None
        try:
            page.goto(f"{binder.base}/lab?token={binder.token}")
            tile = page.locator(".jp-LauncherCard", has_text="Backend.AI Hub")
            tile.wait_for(timeout=120_000)
            mark("lab")

            with ctx.expect_page(timeout=30_000) as opened:
                tile.click()
            hub = opened.value
            # The first request starts the hub (postBuild did the migrations).
            hub.wait_for_url(re.compile(r"/backendai-hub/hub/login"), timeout=180_000)
            hub.locator("#username_input").wait_for()
            mark("hub login")

            hub.fill("#username_input", ALICE[0])
            hub.fill("#password_input", ALICE[1])
            hub.click("#login_submit")
            hub.wait_for_url(re.compile(r"/backendai-hub/hub/spawn"))
            expect(hub.locator("#backendai-image")).to_have_value("local/python")
            expect(hub.locator("#backendai-mem")).to_have_value("384m")
            expect(hub.locator("#backendai-cpu")).to_have_value("0.5")
            hub.select_option("#backendai-image", "local/python")
            hub.click("button[type=submit]")
            hub.wait_for_url(re.compile(r"/backendai-hub/user/alice/lab"), timeout=180_000)
            mark("session")

            card = hub.locator('.jp-LauncherCard[data-category="Notebook"]').first
            card.wait_for(timeout=120_000)
            card.click()
            editor = hub.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
            editor.wait_for(timeout=120_000)
            editor.click()
            hub.keyboard.type("1+1")
            hub.keyboard.press("Shift+Enter")
            result = hub.locator(".jp-NotebookPanel .jp-OutputArea-output").first
            expect(result).to_have_text("2", timeout=120_000)
            mark("1+1")
        except Exception:
            for name, pg in (("lab", page), ("hub", hub)):
                if pg is not None:
                    try:
                        pg.screenshot(path=str(tmp_path / f"{name}.png"))
                    except Exception:
                        pass
            print(f"screenshots in {tmp_path}; timings {times}")
            print(binder.log()[-20000:])
            raise
        finally:
            browser.close()
    print(f"binder demo timings (s since start): {times}")
