"""The console's Warm pools page (issue 30): a superadmin keeps kernels of an image and a
preset warm in a resource group with the page's form (bad input said under it, nothing
set), sees each pool's size, ready kernels, hits, misses and why it is not full, and
removes one (asked first); a domain admin is told that only superadmins set them, and the
API refuses them too. Headless Chromium against a real hub (local backend, whose
pool's state the page shows as the manager's round leaves it)."""

from __future__ import annotations

import time

import pytest

from .api_world import PASSWORD, new_user, superadmin
from .chromium import chromium, logged_in, screenshot
from .conftest import shutdown_hub
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub

pytestmark = [pytest.mark.browser]
IMAGE = "backendai/python-kernel:latest"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("console-pools")
    hub = Hub(db_url=f"sqlite:///{d}/backendai.sqlite", backend="local",
              extra_args=["--BackendAIManager.warm_pool_interval=0.5"]).start()
    try:
        yield hub
    finally:
        shutdown_hub(hub)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _tab(browser, hub, email, password):
    return logged_in(browser, hub, email, password)


def test_console_sets_shows_and_removes_a_warm_pool(world, browser):
    hub = world
    sa = superadmin(hub)
    ctx, page, errors = _tab(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/warm-pools")
        assert "No warm pools" in page.locator("#backendai-pools tbody").inner_text()
        # Bad input: said under the form, nothing set.
        page.fill("#wp-image", "")
        page.click("#backendai-pool-set [type=submit]")
        err = page.locator("#backendai-pool-set-error")
        assert err.inner_text() == "Name the image to keep warm."
        page.fill("#wp-image", IMAGE)
        page.fill("#wp-size", "101")
        page.click("#backendai-pool-set [type=submit]")
        err.wait_for()
        assert err.inner_text().startswith("Could not set the warm pool: size"), err.inner_text()
        assert sa.ok("GET", "/warm-pools")["items"] == []
        errors.clear()  # Chromium logs the refused call (a 400) as a console error
        # Set: confirmed after the reload, listed with its size.
        page.select_option("#wp-preset", "small")
        page.fill("#wp-size", "1")
        with page.expect_navigation():
            page.click("#backendai-pool-set [type=submit]")
        assert page.locator("#backendai-message").inner_text() == \
            f"Keeping 1 kernel(s) of {IMAGE} (small) warm in default."
        row = page.locator(f'tr[data-pool="default|{IMAGE}|small"]')
        assert row.locator("td").nth(3).inner_text() == "1"
        # The manager's rounds fill it or say why not; the page shows which.
        deadline = time.monotonic() + 60
        while True:
            page.reload()
            ready = row.locator(".backendai-ready").inner_text()
            why = row.locator(".backendai-why").inner_text()
            if ready == "1" or why != "-":
                break
            assert time.monotonic() < deadline, (ready, why)
            time.sleep(0.5)
        [pool] = sa.ok("GET", "/warm-pools")["items"]
        assert (pool["size"], str(pool["ready"])) == (1, ready)
        assert why == (pool["status_info"] or "-")
        screenshot(page, "warm-pools-console.png", full_page=True)
        # Remove: asked first, confirmed, gone.
        asked = []
        page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
        with page.expect_navigation():
            row.locator("button", has_text="Remove").click()
        assert asked == [f"Remove the warm pool of {IMAGE} (small) in default? Its kernels go."]
        assert page.locator("#backendai-message").inner_text() == \
            f"Removed the warm pool of {IMAGE} (small) in default."
        assert sa.ok("GET", "/warm-pools")["items"] == []
        assert errors == []
    finally:
        ctx.close()

    # A domain admin: told, and the API refuses them.
    admin = new_user(sa, role="admin", name="pooladmin")
    ctx, page, errors = _tab(browser, hub, admin["email"], PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/warm-pools")
        assert "Only superadmins" in page.locator("#backendai-pools-superadmin").inner_text()
        assert page.locator("#backendai-pool-set").count() == 0
        assert errors == []
    finally:
        ctx.close()
    r = admin["client"]("PUT", "/warm-pools", json={"resource_group": "default", "image": IMAGE,
                                                   "preset": "small", "size": 1})
    assert r.status_code == 403, r.text
