"""Issue 12 in headless Chromium: alice opens the image's apps (the hello app, TensorBoard)
from their JupyterLab launcher tiles in her Docker session; each opens in a new tab behind
the hub's login, at ``<server>/<name>/``."""

from __future__ import annotations

import contextlib
import re
import subprocess

import pytest

from .chromium import chromium, console_error, screenshot
from .conftest import containers_of, shutdown_hub
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


def _kernel_state(world) -> str:
    """The session's container for a failure's message: its state (OOM-killed, restarted)
    and the last lines of its Jupyter server's log, where jupyter-server-proxy writes each
    app's output and why it gave up on one (two suites at once once met "could not start
    vscode in time": code-server starts in 1-2 s on a quiet machine)."""
    try:
        [cid] = containers_of(world.hub.agent_id)
        state = subprocess.run(["docker", "inspect", "-f", "{{json .State}}", cid],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        events = subprocess.run(["docker", "exec", cid, "cat", "/sys/fs/cgroup/memory.events"],
                                capture_output=True, text=True, timeout=30).stdout.split()
        log = subprocess.run(["docker", "logs", "--tail", "60", cid], capture_output=True,
                             text=True, timeout=30)
        return f"state {state}; memory.events {events}; log:\n{log.stdout}{log.stderr}"
    except Exception as e:
        return f"(unreadable: {e})"


def _open_tile(context, page, title: str):
    tile = page.locator(f".jp-LauncherCard[title^='{title} ']")  # 'Title [↗]': a new tab

    def failed(what: str, e: Exception) -> AssertionError:
        cards = page.locator(".jp-LauncherCard").evaluate_all(
            "els => els.map(e => e.getAttribute('title') + ' | ' + e.innerText)")
        dialogs = page.locator(".jp-Dialog").all_inner_texts()
        screenshot(page, "apps-launcher-" + re.sub(r"\W+", "-", title) + ".png", full_page=True)
        return AssertionError(f"tile {title!r} {what}: {e}; tiles: {cards}; dialogs: {dialogs}")

    try:
        tile.first.wait_for(timeout=60_000)
        # Clickable (shown, still, nothing over it) before the page's wait starts: a click
        # that waited inside that wait ran out its time and hid why (CI's run of stop 39).
        tile.first.click(trial=True, timeout=60_000)
    except Exception as e:
        raise failed("is not there to click", e) from None
    # Playwright hands over a new tab only once its first response has come (its docs:
    # "the earliest moment that page is available is when it has navigated to the
    # initial url"), and jupyter-server-proxy answers an app's first request when the
    # app has started: code-server may take up to its service's 120 s timeout
    # (images/kernel/service-defs/vscode.json; 60 s until two suites at once outran it,
    # pair S of 2026-11-30: "could not start vscode in time"), and it took 60 s on CI's
    # loaded run of stop 39. So the wait is longer than that.
    try:
        with context.expect_page(timeout=150_000) as new:
            tile.first.click()
    except Exception as e:
        raise failed("opened no tab", e) from None
    app = new.value
    app.wait_for_load_state()
    return app


def test_the_status_bar_shows_the_sessions_memory_against_its_limit(world, lab):
    """jupyter-resource-usage in JupyterLab's status bar: the server's memory against
    the session's limit (issue 29: only admins saw a kernel's use)."""
    _, page = lab
    bar = page.locator("#jp-main-statusbar")
    try:
        page.wait_for_function(
            "() => /Mem: [\\d.]+ \\/ [\\d.]+ [MG]B/.test("
            "document.querySelector('#jp-main-statusbar')?.innerText || '')", timeout=60_000)
    except Exception:
        raise AssertionError(f"status bar: {bar.inner_text()!r}") from None
    text = bar.inner_text()
    used, limit = map(float, re.search(r"Mem: ([\d.]+) / ([\d.]+)", text).groups())
    assert 0 < used < limit, text


@pytest.mark.parametrize("title,path,check", [
    ("Hello app", "hello/", "#greeting"),
    ("TensorBoard", "tensorboard/", "tf-tensorboard, #root, body"),
    ("VS Code (code-server)", "vscode/", ".monaco-workbench"),
])
def test_app_opens_from_its_launcher_tile(world, lab, title, path, check, tmp_path):
    context, page = lab
    logged: list = []  # (page, text) of every console error in the context

    def listener(m) -> None:
        if console_error(m):
            logged.append((m.page, f"{m.text} ({m.location.get('url')})"))

    context.on("console", listener)
    if path == "vscode/":
        # A word for the editor's search to find (ripgrep, run by its server), and a
        # broken JSON file for its JSON language server (an extension) to flag.
        world.server.run("echo needle-7f3a > ~/search-me.txt && echo '{\"a\": }' > ~/broken.json"
                         " && echo FILES-MADE", "FILES-MADE")
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
            # Search: ripgrep found the word (it failed to load: issue 29). Into the search
            # box itself, not the keyboard's focus: the Welcome page, opening late on a
            # loaded machine, took the focus after the first letter (CI run P).
            app.keyboard.press("Control+Shift+F")
            box = app.locator(".search-view .search-widget .monaco-findInput").first.locator(
                "textarea, input").first
            box.fill("needle-7f3a")
            box.press("Enter")
            app.locator(".search-view .monaco-list-row", has_text="search-me.txt").wait_for(
                timeout=120_000)
            # The extension host runs: the JSON language server flags the broken file.
            app.keyboard.press("Control+P")
            app.locator(".quick-input-widget .quick-input-box input").fill("broken.json")
            app.locator(".quick-input-list .monaco-list-row", has_text="broken.json").first.wait_for(
                timeout=60_000)
            app.locator(".quick-input-widget .quick-input-box input").press("Enter")
            app.locator(".monaco-editor .squiggly-error").first.wait_for(timeout=120_000)
            # No "Remote Extension host terminated unexpectedly" (nor any other) dialog.
            text = app.locator("body").inner_text()
            assert "terminated unexpectedly" not in text, text[-2000:]
            assert app.locator(".monaco-dialog-box").count() == 0
        else:
            app.wait_for_function("document.title.includes('TensorBoard')", timeout=120_000)
            assert re.search(r"TensorBoard", app.title())
            # TensorBoard's own data API answered the page (through the same proxy path).
            env = app.evaluate("async () => (await fetch('data/environment')).json()")
            assert env["data_location"] == "/home/work/logs"
            # Its fonts load from below its prefix (they were asked for at the host's
            # root, and refused: issue 29).
            app.wait_for_load_state("networkidle")
            faces = app.evaluate("""async () => { await document.fonts.ready;
                return [...document.fonts].map(f => f.family + ' ' + f.status); }""")
            assert any("Roboto" in f and f.endswith(" loaded") for f in faces), faces
            assert not [f for f in faces if f.endswith(" error")], faces
        # The app's page logged no error (a refused font, a failed load, a crash). But
        # code-server's workbench asks for VS Code's `vsda` (Microsoft's closed signing
        # module, in no open-source build) and goes on without it: its 404 is expected.
        mine = [t for p, t in logged if p == app and not re.search(r"/vsda[._]", t)]
        assert not mine, mine
    except Exception as e:
        # What the page showed and logged, in the failure itself (CI's report keeps only
        # the message: its run of stop 41 said no more than that the workbench never came).
        with contextlib.suppress(Exception):
            app.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
        try:
            shown = app.evaluate("document.body ? document.body.innerText.slice(0, 1500) : ''")
        except Exception as why:
            shown = f"(unreadable: {why})"
        raise AssertionError(f"{str(e).splitlines()[0]} at {app.url}; the page's console errors: "
                             f"{[t for p, t in logged if p == app]}; its text: {shown!r}; "
                             f"the session's container: {_kernel_state(world)}") from e
    finally:
        context.remove_listener("console", listener)
        app.close()
