"""/hub/backendai/password: a user changes their own password (XSRF-protected form in
JupyterHub's page, linked from the navigation bar); wrong input changes nothing."""

from __future__ import annotations

import re

import pytest

from .chromium import chromium, console_error, screenshot
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub

NEW = "a-new-password-42"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("password")
    h = Hub(db_url=f"sqlite:///{d}/backendai.sqlite", backend="local").start()
    yield h
    h.close()


def _post(hub, s, **fields):
    page = s.get(hub.base + "/hub/backendai/password")
    assert page.status_code == 200
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)
    return s.post(hub.base + "/hub/backendai/password", data={**fields, "_xsrf": xsrf})


def _logs_in(hub, password: str) -> bool:
    s = hub.login(ADMIN_EMAIL, password)
    return s.get(hub.base + "/hub/home", allow_redirects=False).status_code == 200


def test_refusals_change_nothing(hub):
    s = hub.login()
    for fields, message in [
        ({"current": "wrong-password", "new": NEW, "confirm": NEW},
         "The current password is wrong. Nothing was changed."),
        ({"current": ADMIN_PASSWORD, "new": "short", "confirm": "short"},
         "The new password must be at least 8 characters long. Nothing was changed."),
        ({"current": ADMIN_PASSWORD, "new": NEW, "confirm": NEW + "x"},
         "The new password and its confirmation differ. Nothing was changed."),
    ]:
        r = _post(hub, s, **fields)
        assert r.status_code == 400, r.text[-2000:]
        assert message in r.text
    # Without the XSRF token the POST is refused before anything is read.
    r = s.post(hub.base + "/hub/backendai/password",
               data={"current": ADMIN_PASSWORD, "new": NEW, "confirm": NEW})
    assert r.status_code == 403
    assert _logs_in(hub, ADMIN_PASSWORD)
    assert not _logs_in(hub, NEW)


def test_change_then_old_fails_new_works(hub):
    s = hub.login()
    r = _post(hub, s, current=ADMIN_PASSWORD, new=NEW, confirm=NEW)
    assert r.status_code == 200
    assert "Your password was changed." in r.text
    assert not _logs_in(hub, ADMIN_PASSWORD)
    assert _logs_in(hub, NEW)
    # Put it back for the browser test.
    r = _post(hub, hub.login(ADMIN_EMAIL, NEW), current=NEW, new=ADMIN_PASSWORD, confirm=ADMIN_PASSWORD)
    assert r.status_code == 200


def test_page_is_linked_from_the_navigation_bar(hub):
    with chromium() as b:
        page = b.new_page()
        page.set_default_timeout(30_000)
        errors: list[str] = []
        page.on("console", lambda m: console_error(m) and errors.append(m.text))
        page.goto(hub.base + "/hub/login")
        page.fill("input[name=username]", ADMIN_EMAIL)
        page.fill("input[name=password]", ADMIN_PASSWORD)
        page.click("#login_submit")
        page.wait_for_url(re.compile(r"/hub/(spawn|home)"))
        page.goto(hub.base + "/hub/home")
        link = page.locator("#backendai-nav-password")
        assert link.inner_text().strip() == "Password"
        link.click()
        page.wait_for_url(re.compile(r"/hub/backendai/password$"))
        assert errors == [], errors  # the refused POST below is a 400, which Chromium logs
        page.fill("#backendai-current", "wrong-password")
        page.fill("#backendai-new", NEW)
        page.fill("#backendai-confirm", NEW)
        page.click("#backendai-password-form [type=submit]")
        page.locator("#backendai-password-error").wait_for()
        screenshot(page, "password-page.png", full_page=True)
        assert "The current password is wrong" in page.locator("#backendai-password-error").inner_text()
