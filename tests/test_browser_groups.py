"""Issue 29 point 3, resource groups in the console, in headless Chromium against a real
hub (local backend): a superadmin creates a group with its scheduler options and edits
them (bad input refused in words beside the form, nothing changed); each group lists its
agents; a domain admin sees the groups without the create form. A project's members are
edited on the projects page (tests/test_browser_pages.py, test_console_forms)."""

from __future__ import annotations

import pytest

from .api_world import PASSWORD, superadmin
from .chromium import chromium, logged_in, screenshot
from .conftest import shutdown_hub
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub
from .test_pages import _user

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("browser-groups")
    hub = Hub(db_url=f"sqlite:///{d}/backendai.sqlite", backend="local").start()
    try:
        sa = superadmin(hub)
        yield {"hub": hub, "sa": sa, "dadmin": _user(sa, "groupdadmin", "admin", "default")}
    finally:
        shutdown_hub(hub)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _tab(browser, hub, email, password):
    return logged_in(browser, hub, email, password, accept_dialogs=True)


def test_superadmin_creates_and_edits_a_resource_group_with_scheduler_options(world, browser):
    hub, sa = world["hub"], world["sa"]
    ctx, page, errors = _tab(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/resource-groups")
        # The default group lists the hub's own agent.
        agent = sa.ok("GET", "/agents")["items"][0]
        default_row = page.locator('#backendai-resource-groups tr[data-name="default"]')
        assert default_row.locator(f'.backendai-group-agents [data-agent="{agent["id"]}"]') \
            .count() == 1
        form, err = page.locator("#backendai-group-create"), page.locator(
            "#backendai-group-create-error")
        before = [g["name"] for g in sa.ok("GET", "/resource-groups")["items"]]
        # Bad input: a missing name (the page), a bad number and a bad name (the API).
        form.get_by_role("button", name="Create").click()
        assert err.inner_text() == "Give the resource group a name."
        page.locator("#rg-name").fill("gpu-night")
        page.locator("#rg-pending").fill("soon")
        form.get_by_role("button", name="Create").click()
        page.wait_for_function("el => el.textContent.includes('pending_timeout')",
                               arg=err.element_handle())
        assert err.inner_text() == ("Could not create resource group gpu-night: scheduler_opts: "
                                    "pending_timeout must be a number of seconds >= 0, not 'soon'")
        page.locator("#rg-pending").fill("600")
        page.locator("#rg-domains").fill("nodomain")
        form.get_by_role("button", name="Create").click()
        page.wait_for_function("el => el.textContent.includes('nodomain')",
                               arg=err.element_handle())
        assert err.inner_text().endswith("allowed_domains: no domain 'nodomain'")
        assert [g["name"] for g in sa.ok("GET", "/resource-groups")["items"]] == before
        screenshot(page, "groups-create-refused.png", full_page=True)

        page.locator("#rg-domains").fill("default")
        page.locator("#rg-description").fill("GPU jobs at night")
        page.locator("#rg-scheduler").select_option("drf")
        page.locator("#rg-selector").select_option("dispersed")
        page.locator("#rg-reservations").fill("2")
        form.get_by_role("button", name="Create").click()
        page.locator("#backendai-message.alert-success").wait_for()
        assert page.locator("#backendai-message").inner_text() == \
            "Created resource group gpu-night."
        g = sa.ok("GET", "/resource-groups/gpu-night")
        assert (g["scheduler"], g["is_public"], g["allowed_domains"], g["description"]) == \
            ("drf", False, ["default"], "GPU jobs at night")
        assert g["scheduler_opts"] == {"agent_selector": "dispersed", "pending_timeout": 600,
                                       "max_reservations": 2}
        row = page.locator('#backendai-resource-groups tr[data-name="gpu-night"]')
        assert row.locator(".backendai-scheduler-opts").inner_text() == \
            "agent selector dispersed; pending timeout 600; max reservations 2"
        assert row.locator(".backendai-group-agents").inner_text() == "none"

        # Edit: a bad option refused in the form, nothing changed; then a good one.
        page.locator("#edit-group-gpu-night-open").click()
        box = row.locator("form.backendai-edit")
        box.get_by_label("Reservations at once").fill("many")
        box.get_by_role("button", name="Save").click()
        inplace = box.locator(".backendai-edit-error")
        inplace.wait_for(state="visible")
        assert "max_reservations" in inplace.inner_text()
        assert sa.ok("GET", "/resource-groups/gpu-night")["scheduler_opts"] == g["scheduler_opts"]
        box.get_by_label("Reservations at once").fill("3")
        box.get_by_label("Agent selector").select_option("roundrobin")
        box.get_by_label("Pending timeout (seconds)").fill("")
        box.get_by_role("button", name="Save").click()
        page.locator("#backendai-message.alert-success").wait_for()
        assert sa.ok("GET", "/resource-groups/gpu-night")["scheduler_opts"] == {
            "agent_selector": "roundrobin", "max_reservations": 3}
        screenshot(page, "groups-edited.png", full_page=True)
        # The refusals asked for, as the browser logs them, and nothing else.
        assert [e for e in errors if "status of 400" not in e] == [], errors
    finally:
        ctx.close()


def test_domain_admin_sees_groups_and_their_agents_without_the_forms(world, browser):
    hub = world["hub"]
    ctx, page, errors = _tab(browser, hub, world["dadmin"]["email"], PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/resource-groups")
        assert page.locator("#backendai-group-create").count() == 0
        row = page.locator('#backendai-resource-groups tr[data-name="default"]')
        assert row.locator(".backendai-group-agents [data-agent]").count() >= 1
        assert row.locator("summary").count() == 0
        assert errors == []
    finally:
        ctx.close()


def test_domain_admin_edits_a_project_and_its_members(world, browser):
    hub, sa = world["hub"], world["sa"]
    proj = sa.ok("POST", "/projects", json={"name": "vision", "domain_name": "default"})
    alice = _user(sa, "projalice", "user", "default", [proj["id"]])
    _user(sa, "projbob", "user", "default")
    ctx, page, errors = _tab(browser, hub, world["dadmin"]["email"], PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/projects")
        row = page.locator('#backendai-projects tr[data-name="vision"]')
        assert row.locator("[data-member]").all_inner_texts()[0].startswith("projalice")
        # Add a member: confirmed after the reload, in the record.
        row.get_by_label("Add a member to vision").select_option(label="projbob")
        row.get_by_role("button", name="Add", exact=True).click()
        page.locator("#backendai-message.alert-success").wait_for()
        assert page.locator("#backendai-message").inner_text() == "Added projbob to vision."
        members = lambda: sorted(m["username"] for m in  # noqa: E731
                                 sa.ok("GET", f"/projects/{proj['id']}/members")["items"])
        assert members() == ["projalice", "projbob"]
        # Remove one (asked first).
        row = page.locator('#backendai-projects tr[data-name="vision"]')
        row.get_by_role("button", name="Remove projalice from vision").click()
        page.wait_for_function("() => document.getElementById('backendai-message')?.textContent"
                               " === 'Removed projalice from vision.'")
        assert members() == ["projbob"]
        # A bad new name: the API's words in the form, nothing changed.
        row = page.locator('#backendai-projects tr[data-name="vision"]')
        page.locator(f"#edit-project-{proj['id']}-open").click()
        box = row.locator("form.backendai-edit")
        box.get_by_label("Name").fill("vision lab!")
        box.get_by_role("button", name="Save").click()
        inplace = box.locator(".backendai-edit-error")
        inplace.wait_for(state="visible")
        assert inplace.inner_text() == ("name: must be 1 to 64 letters, digits, '.', '_' or '-', "
                                        "beginning with a letter or digit")
        assert sa.ok("GET", f"/projects/{proj['id']}")["name"] == "vision"
        box.get_by_label("Name").fill("vision-lab")
        box.get_by_role("button", name="Save").click()
        page.wait_for_function("() => document.getElementById('backendai-message')?.textContent"
                               " === 'Saved project vision.'")
        assert sa.ok("GET", f"/projects/{proj['id']}")["name"] == "vision-lab"
        assert alice["id"] not in [m["id"] for m in
                                   sa.ok("GET", f"/projects/{proj['id']}/members")["items"]]
        screenshot(page, "projects-members-edited.png", full_page=True)
        assert [e for e in errors if "status of 400" not in e] == [], errors
    finally:
        ctx.close()
