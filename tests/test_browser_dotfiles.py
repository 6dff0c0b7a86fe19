"""Issue 27's console page for dotfiles and session templates ("Dotfiles" in the
navigation): a user adds a dotfile with the form (bad input said under it, nothing
stored), sees it listed, deletes it (asked first); sees the session templates they made
through Backend.AI's API and deletes one. Headless Chromium against a real hub (local
backend); what the page shows is checked against the API."""

from __future__ import annotations

import json
import re

import pytest

from .api_world import PASSWORD, new_user, superadmin
from .chromium import chromium, logged_in, screenshot
from .conftest import shutdown_hub
from .hub import Hub

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("dotfiles-page")
    hub = Hub(db_url=f"sqlite:///{d}/backendai.sqlite", backend="local").start()
    try:
        yield hub
    finally:
        shutdown_hub(hub)


def test_a_user_manages_dotfiles_and_sees_templates(world):
    hub = world
    u = new_user(superadmin(hub), name="dotty")
    tpl = {"kind": "taskTemplate", "metadata": {"name": "nightly"},
           "spec": {"session_type": "batch", "kernel": {"image": "python:3.11"}}}
    u["client"].ok("POST", "/template/session", json={"payload": json.dumps(tpl)}, status=200)

    def listed() -> list[str]:
        return [d["path"] for d in u["client"].ok("GET", "/user-config/dotfiles")]

    with chromium() as browser:
        ctx, page, errors = logged_in(browser, hub, u["email"], PASSWORD)
        page.click("#backendai-nav-dotfiles")
        page.wait_for_url("**/hub/backendai/dotfiles")
        assert "You have no dotfiles." in page.locator("#backendai-dotfiles").inner_text()
        assert page.locator('#backendai-templates tr td:first-child').all_inner_texts() == \
            ["nightly"]
        # Bad input: said under the form, nothing stored.
        page.click("#backendai-dotfile-create [type=submit]")
        err = page.locator("#backendai-dotfile-create-error")
        assert err.inner_text() == "Give the dotfile's path in your home folder."
        page.fill("#df-path", "../escape")
        page.click("#backendai-dotfile-create [type=submit]")
        page.wait_for_function("document.getElementById('backendai-dotfile-create-error')"
                               "?.textContent.includes('Could not add ../escape')")
        assert listed() == []
        errors.clear()  # Chromium logs the refused call (a 400) as a console error
        # Added: confirmed after the reload, listed, stored.
        page.fill("#df-path", ".gitconfig")
        page.fill("#df-data", "[user]\n\tname = Dotty\n")
        with page.expect_navigation():
            page.click("#backendai-dotfile-create [type=submit]")
        assert page.locator("#backendai-message").inner_text() == \
            "Added the dotfile .gitconfig (yours)."
        assert page.locator('tr[data-path=".gitconfig"] td').nth(2).inner_text() == "644"
        assert listed() == [".gitconfig"]
        screenshot(page, "dotfiles-page.png", full_page=True)
        # Deleted: asked first, confirmed, gone.
        asked = []
        page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
        with page.expect_navigation():
            page.locator('tr[data-path=".gitconfig"] button').click()
        assert asked == ["Delete the dotfile .gitconfig (yours)?"]
        assert page.locator("#backendai-message").inner_text() == \
            "Deleted the dotfile .gitconfig (yours)."
        assert listed() == []
        # The template too.
        page.once("dialog", lambda d: d.accept())
        with page.expect_navigation():
            page.locator("#backendai-templates button").click()
        assert "No session templates." in page.locator("#backendai-templates").inner_text()
        assert u["client"].ok("GET", "/template/session") == []
        assert errors == []
        ctx.close()


def test_an_admin_sets_domain_and_project_dotfiles(world):
    """A domain admin's page offers their domain and its projects as owners; a plain
    user's offers only their own; what the admin adds lands where the API says."""
    hub = world
    sa = superadmin(hub)
    proj = sa.ok("POST", "/projects", json={"name": "lab42", "domain_name": "default"},
                 status=201)
    admin = new_user(sa, role="admin", name="dotadmin")
    with chromium() as browser:
        ctx, page, errors = logged_in(browser, hub, admin["email"], PASSWORD)
        page.goto(hub.base + "/hub/backendai/dotfiles")
        owners = page.locator("#df-owner option").all_inner_texts()
        assert owners[:2] == ["yours", "domain default"] and "project default/lab42" in owners
        for label, path in (("domain default", ".domainrc"), ("project default/lab42", ".labrc")):
            page.select_option("#df-owner", label=label)
            page.fill("#df-path", path)
            with page.expect_navigation():
                page.click("#backendai-dotfile-create [type=submit]")
            assert page.locator("#backendai-message").inner_text() == \
                f"Added the dotfile {path} ({label})."
        assert [d["path"] for d in admin["client"].ok(
            "GET", "/domain-config/dotfiles", params={"domain": "default"})] == [".domainrc"]
        assert [d["path"] for d in admin["client"].ok(
            "GET", "/group-config/dotfiles", params={"group": proj["id"],
                                                     "domain": "default"})] == [".labrc"]
        page.once("dialog", lambda d: d.accept())
        with page.expect_navigation():
            page.locator('tr[data-path=".labrc"] button').click()
        assert admin["client"].ok("GET", "/group-config/dotfiles",
                                  params={"group": proj["id"], "domain": "default"}) == []
        assert errors == []
        ctx.close()
    # a plain user's page offers only their own
    u = new_user(sa, name="plaindot")
    page_html = hub.login(u["email"], PASSWORD).get(hub.base + "/hub/backendai/dotfiles").text
    assert re.findall(r'<option value="\d+" data-scope="(\w+)"', page_html) == ["user"]

