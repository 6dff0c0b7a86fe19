"""Headless Chromium for the browser tests: Debian's chromium driven by Playwright.

One place for the binary, its flags, the launch and the screenshots, so that every browser
test runs the same browser the same way (never ``playwright install``: it downloads).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from .hub import REPO

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Screenshots the tests leave for a person to look at (CI keeps the folder).
ARTIFACTS = os.environ.get("BACKENDAI_TEST_ARTIFACTS", os.path.join(REPO, "test-artifacts"))


@contextlib.contextmanager
def chromium(*extra_args: str) -> Iterator:
    """A launched headless Chromium (Playwright's sync API), closed on leaving;
    ``extra_args`` go after the usual flags (``--host-resolver-rules=...``).

    A missing browser fails the test: it is a test dependency, not an optional one."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} missing (scripts/install-test-deps.sh installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *extra_args],
                             headless=True)
        try:
            yield b
        finally:
            b.close()


def console_error(m) -> bool:
    """Whether console message ``m`` is an error of the page's. A load that Chromium ends
    with ERR_NETWORK_CHANGED is the machine's, not the page's: the browser shares the
    host's network with the Docker engine, and Chromium fails what is in flight when an
    interface comes or goes, which other tests' session networks do all the time (a
    user's browser is on another host)."""
    return m.type == "error" and "net::ERR_NETWORK_CHANGED" not in m.text


def logged_in(browser, hub, email: str, password: str, *, accept_dialogs: bool = False,
              hub_errors_only: bool = False, **context):
    """A new browser context logged in to ``hub`` as ``email`` through its login form:
    ``(context, page, errors)``, ``errors`` collecting the page's console errors and
    uncaught exceptions (``hub_errors_only``: console errors of hub pages only, not of a
    user's server). ``accept_dialogs`` accepts every confirm(); ``context`` goes to
    ``new_context`` (locale, timezone_id, accept_downloads, viewport)."""
    import re

    ctx = browser.new_context(**{"viewport": {"width": 1280, "height": 900}, **context})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    errors: list[str] = []

    def console(m) -> None:
        if not console_error(m):
            return
        if hub_errors_only and "/hub/" not in page.url:
            return
        errors.append(f"{page.url}: {m.text}" if hub_errors_only else m.text)

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    if accept_dialogs:
        page.on("dialog", lambda dlg: dlg.accept())
    page.goto(hub.base + "/hub/login")
    page.fill("input[name=username]", email)
    page.fill("input[name=password]", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r"/hub/(spawn|home)"))
    return ctx, page, errors


def screenshot(page, path: str, **kwargs) -> None:
    """``page.screenshot`` that survives the page navigating on its own at that moment.

    A spawn's pending page goes on to the server by itself; Chromium then has no frame to
    capture and answers "Unable to capture screenshot". The picture is a record for a person,
    not an assertion, so wait for the next page to load and take it again (three tries)."""
    from playwright.sync_api import Error

    if not os.path.isabs(path):
        path = os.path.join(ARTIFACTS, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for attempt in range(3):
        try:
            page.screenshot(path=path, **kwargs)
            return
        except Error as e:
            if "Unable to capture screenshot" not in str(e) or attempt == 2:
                raise
            page.wait_for_load_state("load")
