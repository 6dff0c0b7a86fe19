"""A user's work survives a stop, seen in headless Chromium (Playwright), Docker backend.

login -> the spawn form -> progress -> JupyterLab: a notebook is made and saved ->
stop -> start again -> the notebook is still there and opens with its cell; a terminal
runs the kernel environment's python and pip, and lists the automounted '.'-folder.
Screenshots of the form, the progress page and JupyterLab are saved for review under
``$BACKENDAI_TEST_ARTIFACTS`` (default ``test-artifacts/`` in the checkout).
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from .chromium import ARTIFACTS, screenshot
from .conftest import containers_of
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD
from .test_browser import _wait_terminal_text, browser  # noqa: F401 (fixture)
from .test_mounts import make_hub_folder

pytestmark = [pytest.mark.browser, pytest.mark.docker]

MARK = "saved-by-the-browser-" + str(6 * 7)


def artifacts_dir(name: str) -> str:
    path = os.path.join(ARTIFACTS, name)
    os.makedirs(path, exist_ok=True)
    for old in os.listdir(path):  # this run's pictures only
        if old.endswith(".png"):
            os.unlink(os.path.join(path, old))
    return path


def _home_dir(hub) -> str:
    """The admin's home folder on the hub's volume (there is exactly one)."""
    from sqlalchemy import select

    from jupyterhub_backendai.models import User, VFolder
    from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

    engine = make_engine(hub.db_url)
    try:
        with make_sessionmaker(engine)() as s:
            user = s.scalar(select(User).where(User.username == "admin"))
            [f] = s.scalars(select(VFolder).where(VFolder.user_id == user.id,
                                                  VFolder.name == ".home")).all()
            kind, sid = f.quota_scope_id.split(":")
            return os.path.join(hub.volume_path, kind, sid, f.id)
    finally:
        engine.dispose()


def _spawn_through_form(page, hub, shots: str, tag: str) -> None:
    page.goto(hub.base + "/hub/spawn")
    form = page.locator("#spawn_form")
    form.wait_for()
    page.select_option("#backendai-image", hub.image)
    page.fill("#backendai-cpu", "0.5")
    page.fill("#backendai-mem", "512m")
    screenshot(page, os.path.join(shots, f"{tag}-form.png"), full_page=True)
    form.locator("[type=submit]").click()
    page.wait_for_url(re.compile(r"/hub/spawn-pending/|/user/admin/"))
    if "/spawn-pending/" in page.url:
        try:
            screenshot(page, os.path.join(shots, f"{tag}-progress.png"), full_page=True)
        except Exception:  # the page moved on to JupyterLab meanwhile
            pass
    page.wait_for_url(re.compile(r"/user/admin/lab"), timeout=90_000, wait_until="commit")
    page.locator("#jp-main-dock-panel").wait_for(timeout=60_000)


def test_notebook_survives_stop_and_start(make_hub, docker_image, browser, tmp_path):  # noqa: F811
    shots = artifacts_dir("test_browser_home")
    hub = make_hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="docker")
    _, cfg = make_hub_folder(hub, "admin", ".cfg")
    with open(os.path.join(cfg, "settings.ini"), "w") as f:
        f.write("[x]\n")
    assert hub.admin_token  # before the server runs (see test_browser)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    # What failed on the way (printed when the test fails): a theme stylesheet that did
    # not load put JupyterLab's error dialog over the launcher (CI, stop 30's run:
    # ERR_NETWORK_CHANGED, since the browser has a namespace of its own, tests/chromium.py).
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(f"{r.url} failed: {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.url} -> {r.status}"))
    try:
        page.goto(hub.base + "/hub/login")
        page.fill("input[name=username]", ADMIN_EMAIL)
        page.fill("input[name=password]", ADMIN_PASSWORD)
        page.click("#login_submit")
        page.wait_for_url(re.compile(r"/hub/spawn"))
        _spawn_through_form(page, hub, shots, "first")

        # -- a notebook, made from the launcher, a cell typed, saved ----------------------
        page.locator(".jp-LauncherCard[data-category='Notebook']").first.click(timeout=60_000)
        cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content").first
        cell.wait_for(timeout=60_000)
        cell.click()
        page.keyboard.type(f"print('{MARK}')")
        page.keyboard.press("Control+s")
        # JupyterLab asks for a name at the first save: the user keeps the one it gave.
        # (A renamed notebook stays in JupyterLab's workspace under its first name, and
        # the next lab, restoring its layout, says "File Load Error" for that name until
        # the workspace has caught up with the closed tab, which a loaded machine took
        # longer than 30 s to do (CI's run of stop 39). That is JupyterLab's own.)
        dialog = page.locator(".jp-Dialog")
        saved = dialog.locator("input").first.input_value()
        assert saved == "Untitled.ipynb", saved
        dialog.locator("button", has_text="Rename and Save").click()
        path = os.path.join(_home_dir(hub), saved)
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline and MARK not in text:
            if os.path.exists(path):
                with open(path) as f:
                    text = f.read()
            time.sleep(0.2)
        assert MARK in text, os.listdir(os.path.dirname(path))
        cells = json.loads(text)["cells"]
        assert "".join(cells[0]["source"]) == f"print('{MARK}')"
        screenshot(page, os.path.join(shots, "first-lab.png"), full_page=True)

        # -- stop, start again: the notebook is there --------------------------------------
        hub.stop_server("admin", "")
        assert containers_of(hub.agent_id) == []
        _spawn_through_form(page, hub, shots, "second")
        # The lab restores the notebook's tab from its workspace (the user opens it from
        # the file list where it did not). A notebook saved before its kernel had started
        # names no kernel, and JupyterLab asks for one when it opens it again ("Select
        # Kernel", CI's run A of 2026-11-29): the user takes the one it offers.
        item = page.locator(".jp-DirListing-item", has_text=saved)
        item.first.wait_for(timeout=60_000)
        cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", has_text=MARK)
        ask = page.locator(".jp-Dialog", has_text="Select Kernel")
        opened = False
        deadline = time.monotonic() + 60
        while not (cell.count() and cell.first.is_visible() and not ask.count()):
            assert time.monotonic() < deadline, page.locator(".jp-Dialog").all_inner_texts()
            if ask.count():
                ask.locator("button", has_text="Select").last.click()
            elif not opened and not cell.count() and not page.locator(".jp-Dialog").count():
                item.first.dblclick()
                opened = True
            time.sleep(0.2)
        screenshot(page, os.path.join(shots, "second-lab-notebook.png"), full_page=True)

        # -- a terminal: the kernel environment's python and pip; the '.'-folder ---------
        # xterm draws on a canvas; screen-reader mode mirrors it into the DOM (see
        # test_browser). The setting lives in the home folder, so it is set once here.
        status = page.evaluate(
            """async () => {
                const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
                const r = await fetch('/user/admin/lab/api/settings/@jupyterlab/terminal-extension:plugin', {
                    method: 'PUT',
                    headers: {'Content-Type': 'application/json', 'X-XSRFToken': decodeURIComponent(xsrf)},
                    body: JSON.stringify({raw: '{"screenReaderMode": true}'}),
                });
                return r.status;
            }"""
        )
        assert status == 204, status
        page.goto(hub.base + "/user/admin/lab?reset")  # a fresh layout: the launcher shows
        page.locator("#jp-main-dock-panel").wait_for(timeout=60_000)
        page.locator(".jp-LauncherCard[data-category='Other'][title*='terminal' i]").first.click(
            timeout=60_000)
        term = page.locator(".jp-Terminal .xterm").first
        term.wait_for()
        _wait_terminal_text(page, r"\$\s*$|\$ ", timeout=20)
        term.click()
        page.keyboard.type("python -c 'import ipykernel, sys; print(sys.prefix, ipykernel.__name__)'")
        page.keyboard.press("Enter")
        _wait_terminal_text(page, r"(?m)^/opt/venv ipykernel\s*$")
        page.keyboard.type("pip --version")
        page.keyboard.press("Enter")
        _wait_terminal_text(page, r"(?m)^pip \S+ from /opt/venv/lib/python3\.11/site-packages/pip ")
        page.keyboard.type("ls /home/work/.cfg; echo listed-$((6*7))")
        page.keyboard.press("Enter")
        _wait_terminal_text(page, r"(?m)^settings\.ini\s*$")
        _wait_terminal_text(page, r"(?m)^listed-42\s*$")
        screenshot(page, os.path.join(shots, "second-terminal.png"), full_page=True)
    except BaseException:
        try:
            screenshot(page, os.path.join(shots, "failure.png"), full_page=True)
            print(f"screenshot: {os.path.join(shots, 'failure.png')}; url {page.url}")
            print("failed requests:\n" + "\n".join(failed[-30:]))
            print("hub log:\n" + hub.log()[-4000:])
        except Exception:
            pass
        raise
    finally:
        context.close()
    hub.stop_server("admin", "")
    assert containers_of(hub.agent_id) == []
