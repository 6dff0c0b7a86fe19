"""Issue 12 in headless Chromium: alice opens the image's apps (the hello app, TensorBoard)
from their JupyterLab launcher tiles in her Docker session; each opens in a new tab behind
the hub's login, at ``<server>/<name>/``."""

from __future__ import annotations

import re

import pytest

from .chromium import chromium, screenshot
from .conftest import shutdown_hub
from .test_service_ports import World, start_hub

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def world(docker_image, tmp_path_factory):
    hub = start_hub(tmp_path_factory, subdomains=False)
    try:
        yield World(hub, subdomains=False)
    finally:
        shutdown_hub(hub)


@pytest.fixture(scope="module")
def lab(world):
    with chromium() as b:
        context = b.new_context()
        context.set_default_timeout(60_000)
        page = context.new_page()
        failed: list[str] = []  # what did not load (said if JupyterLab reports an error)
        page.on("requestfailed", lambda r: failed.append(f"{r.url} failed: {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.url} -> {r.status}"))
        page.goto(world.hub.base + "/hub/login")
        page.fill("input[name=username]", world.alice["email"])
        page.fill("input[name=password]", "victim-pass-1")
        page.click("#login_submit")
        page.wait_for_url(lambda u: "/hub/login" not in u)
        page.goto(world.hub.base + world.server.prefix + "lab")
        page.locator("#jp-main-dock-panel").wait_for(timeout=120_000)
        page.wait_for_load_state("networkidle")
        errors = page.locator(".jp-Dialog").all_inner_texts()
        assert not errors, (errors, failed[-30:], world.hub.log()[-3000:])
        yield context, page


def _open_tile(context, page, title: str):
    tile = page.locator(f".jp-LauncherCard[title^='{title} ']")  # 'Title [↗]': a new tab
    try:
        tile.first.wait_for(timeout=60_000)
    except Exception:
        cards = page.locator(".jp-LauncherCard").evaluate_all(
            "els => els.map(e => e.getAttribute('title') + ' | ' + e.innerText)")
        screenshot(page, "apps-launcher-without-the-tile.png", full_page=True)
        raise AssertionError(f"no tile {title!r}; tiles: {cards}") from None
    with context.expect_page(timeout=60_000) as new:
        tile.first.click()
    app = new.value
    app.wait_for_load_state()
    return app


@pytest.mark.parametrize("title,path,check", [
    ("Hello app", "hello/", "#greeting"),
    ("TensorBoard", "tensorboard/", "tf-tensorboard, #root, body"),
    ("VS Code (code-server)", "vscode/", ".monaco-workbench"),
])
def test_app_opens_from_its_launcher_tile(world, lab, title, path, check, tmp_path):
    context, page = lab
    app = _open_tile(context, page, title)
    try:
        assert app.url.startswith(world.hub.base + world.server.prefix + path), app.url
        if title == "Hello app":
            assert app.locator("#greeting").inner_text() == "Hello from the Backend.AI session"
            assert app.locator("#path").inner_text() == "/"
        elif path == "vscode/":
            # The workbench, its explorer on the user's home folder (what the editor's
            # websocket to its server brings in).
            app.locator(".monaco-workbench").wait_for(timeout=120_000)
            app.locator(".explorer-folders-view, .explorer-viewlet").first.wait_for(
                timeout=120_000)
        else:
            app.wait_for_function("document.title.includes('TensorBoard')", timeout=120_000)
            assert re.search(r"TensorBoard", app.title())
            # TensorBoard's own data API answered the page (through the same proxy path).
            env = app.evaluate("async () => (await fetch('data/environment')).json()")
            assert env["data_location"] == "/home/work/logs"
    except BaseException:
        app.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
        print(f"screenshot: {tmp_path / 'failure.png'}; url {app.url}")
        raise
    finally:
        app.close()
