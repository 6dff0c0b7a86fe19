"""Resource presets as database objects (issue 29 point 2): the admin API (create, read,
change, delete; bad input a 4xx in words leaving nothing), the packaged small/medium/
large, the spawn form's cards and a session started from one, and the console's forms
in headless Chromium (bad input shown in place, confirmations, delete asks first).

A real hub on the local backend; screenshots go to $BACKENDAI_TEST_ARTIFACTS."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select

from jupyterhub_backendai.models import ResourcePreset, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import PASSWORD, new_user, superadmin
from .chromium import chromium, logged_in, screenshot
from .conftest import shutdown_hub
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub

pytestmark = [pytest.mark.browser]
GIB = 1 << 30
PACKAGED = [("large", {"cpu": "4", "mem": str(8 * GIB)}),
            ("medium", {"cpu": "2", "mem": str(4 * GIB)}),
            ("small", {"cpu": "1", "mem": str(2 * GIB)})]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("resource-presets")
    url = f"sqlite:///{d}/backendai.sqlite"
    hub = Hub(db_url=url, backend="local", slots={"cpu": 4, "mem": "8g"},
              extra_env={"BACKENDAI_START_TIMEOUT": "60"}).start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    try:
        sa = superadmin(hub)
        sa.ok("POST", "/resource-groups", json={"name": "parked", "is_public": True})
        sa.ok("POST", "/resource-groups", json={"name": "hidden", "is_public": False})
        yield {"hub": hub, "sa": sa, "user": new_user(sa, name="presetuser")}
    finally:
        hub.engine.dispose()
        shutdown_hub(hub)


def _count(hub) -> int:
    with hub.sm() as s:
        return s.scalar(select(func.count()).select_from(ResourcePreset))


def test_packaged_presets_and_the_api(world):
    sa, user = world["sa"], world["user"]
    got = sa.ok("GET", "/resource-presets")
    assert [(p["name"], p["resource_slots"], p["resource_group"]) for p in got["items"]] == [
        (n, slots, None) for n, slots in PACKAGED]
    made = sa.ok("POST", "/resource-presets", json={
        "name": "gpu-parked", "description": "One GPU", "resource_group": "parked",
        "resource_slots": {"cpu": 2, "mem": "6g"}})
    assert (made["resource_slots"], made["resource_group"]) == (
        {"cpu": "2", "mem": str(6 * GIB)}, "parked")
    changed = sa.ok("PATCH", "/resource-presets/gpu-parked",
                    json={"description": "Two cores", "resource_group": None})
    assert (changed["description"], changed["resource_group"]) == ("Two cores", None)
    # A user reads them (the form shows them) but changes nothing.
    c = user["client"]
    assert c.ok("GET", "/resource-presets/gpu-parked")["description"] == "Two cores"
    r = c("PATCH", "/resource-presets/gpu-parked", json={"description": "mine"})
    assert r.status_code == 403, r.text
    # One in a group the user may not use is not theirs to see.
    sa.ok("POST", "/resource-presets", json={"name": "secret", "resource_group": "hidden",
                                             "resource_slots": {"cpu": "1"}})
    assert "secret" not in [p["name"] for p in c.ok("GET", "/resource-presets")["items"]]
    assert c("GET", "/resource-presets/secret").status_code == 404
    sa.ok("DELETE", "/resource-presets/secret")
    sa.ok("DELETE", "/resource-presets/gpu-parked")
    assert sa("GET", "/resource-presets/gpu-parked").status_code == 404


@pytest.mark.parametrize("body, status, words", [
    ({"name": "custom", "resource_slots": {"cpu": "1"}}, 400,
     "name: 'custom' is the form's own choice of custom resources; choose another name"),
    ({"name": "Big Box", "resource_slots": {"cpu": "1"}}, 400, "name"),
    ({"name": "zero", "resource_slots": {"cpu": "0"}}, 400,
     "resource_slots: give at least one amount above zero (e.g. cpu 2, mem 4g)"),
    ({"name": "badmem", "resource_slots": {"mem": "lots"}}, 400, "resource_slots.mem"),
    ({"name": "nogroup", "resource_slots": {"cpu": "1"}, "resource_group": "nowhere"}, 400,
     "resource_group: no resource group 'nowhere'"),
    ({"name": "small", "resource_slots": {"cpu": "1"}}, 409, "resource preset 'small' exists"),
    ({"name": "noslots"}, 400, "resource_slots"),
])
def test_bad_presets_are_refused_in_words_leaving_nothing(world, body, status, words):
    hub, sa = world["hub"], world["sa"]
    before = _count(hub)
    r = sa("POST", "/resource-presets", json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["detail"], r.json()
    assert _count(hub) == before


def test_a_user_may_not_create_presets(world):
    r = world["user"]["client"]("POST", "/resource-presets",
                                json={"name": "mine", "resource_slots": {"cpu": "1"}})
    assert r.status_code == 403, r.text
    assert "you may not create resource presets" in r.json()["detail"]
    assert world["sa"]("GET", "/resource-presets/mine").status_code == 404


def test_form_offers_them_as_cards_and_a_session_gets_the_presets_resources(world):
    hub, sa, user = world["hub"], world["sa"], world["user"]
    sa.ok("POST", "/resource-presets", json={"name": "only-parked", "resource_group": "parked",
                                             "resource_slots": {"cpu": "0.5"}})
    try:
        web = hub.login(user["email"], PASSWORD)
        html = web.get(hub.base + "/hub/spawn").text
        assert re.findall(r'name="preset" value="([^"]+)"', html) == [
            "large", "medium", "only-parked", "small", "custom"]
        assert 'data-groups="parked">' in html  # shown only while "parked" is chosen
        assert "For data work and small models: local/python, 2 cores, 4 GiB memory" in html
        assert html.count('class="card h-100 backendai-preset-card"') == 5
        # A session from a preset: its resources, nothing else to give.
        r = hub.spawn(user["username"], "frompreset", {"preset": "small", "image": None,
                                                        "cpu": None, "mem": None})
        assert r.status_code in (201, 202), r.text
        with hub.sm() as s:
            sess = s.scalars(select(Session).where(Session.name == "frompreset")).one()
            assert dict(sess.requested_slots) == {"cpu": 1, "mem": 2 * GIB}
        hub.stop_server(user["username"], "frompreset")
        # One that names resources too, or a preset of another group: a 400 in words.
        r = hub.spawn(user["username"], "clash", {"preset": "medium", "image": None, "cpu": "3",
                                                "mem": None})
        assert r.status_code == 400
        assert r.json()["message"] == ("preset 'medium' fixes the image and resources; leave "
                                       "out cpu or choose custom resources")
        r = hub.spawn(user["username"], "clash", {"preset": "only-parked", "image": None,
                                                   "cpu": None, "mem": None})
        assert r.status_code == 400
        assert r.json()["message"] == ("preset 'only-parked' is not offered to you in resource "
                                       "group 'default'")
        with hub.sm() as s:
            assert s.scalar(select(func.count()).select_from(Session).where(
                Session.name == "clash")) == 0
    finally:
        sa.ok("DELETE", "/resource-presets/only-parked")


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _tab(browser, hub, email, password):
    return logged_in(browser, hub, email, password)


def test_console_creates_edits_and_deletes_a_preset(world, browser):
    hub, sa, user = world["hub"], world["sa"], world["user"]
    ctx, page, errors = _tab(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/presets")
        rows = page.locator("#backendai-presets-table tbody tr")
        assert rows.locator("td:first-child").all_inner_texts() == ["large", "medium", "small"]
        assert page.locator('tr[data-name="medium"] .backendai-resources').inner_text() == \
            "2 cores, 4 GiB memory"
        # Bad input: the API's words under the form, nothing made.
        before = _count(hub)
        page.fill("#pr-name", "workshop")
        page.fill("#pr-mem", "lots")
        page.click("#backendai-preset-create [type=submit]")
        err = page.locator("#backendai-preset-create-error")
        err.wait_for()
        assert err.inner_text().startswith("Could not create preset workshop: resource_slots.mem")
        assert _count(hub) == before
        screenshot(page, "presets-console-bad-input.png", full_page=True)
        page.fill("#pr-name", "")
        page.click("#backendai-preset-create [type=submit]")
        assert err.inner_text() == "Give the preset a name."
        assert _count(hub) == before
        errors.clear()  # Chromium logs the refused call (a 400) as a console error
        # Create: confirmed after the reload, listed.
        page.fill("#pr-name", "workshop")
        page.fill("#pr-description", "For the Friday workshop")
        page.fill("#pr-cpu", "1.5")
        page.fill("#pr-mem", "3g")
        with page.expect_navigation():
            page.click("#backendai-preset-create [type=submit]")
        assert page.locator("#backendai-message").inner_text() == "Created preset workshop."
        row = page.locator('tr[data-name="workshop"]')
        assert row.locator(".backendai-resources").inner_text() == "1.5 cores, 3 GiB memory"
        assert row.locator(".backendai-group").inner_text() == "every group"
        # Edit: a bad amount shown in the form itself, nothing changed; then a good one.
        page.click("#edit-preset-workshop-open")
        page.fill("#preset-workshop-cpu", "many")
        page.click("#edit-preset-workshop [type=submit]")
        in_place = page.locator("#edit-preset-workshop-error")
        in_place.wait_for()
        assert in_place.inner_text().startswith("resource_slots.cpu")
        assert sa.ok("GET", "/resource-presets/workshop")["resource_slots"]["cpu"] == "1.5"
        screenshot(page, "presets-console-edit-bad.png", full_page=True)
        errors.clear()
        page.fill("#preset-workshop-cpu", "2")
        page.select_option("#preset-workshop-group", "parked")
        with page.expect_navigation():
            page.click("#edit-preset-workshop [type=submit]")
        assert page.locator("#backendai-message").inner_text() == "Saved preset workshop."
        got = sa.ok("GET", "/resource-presets/workshop")
        assert (got["resource_slots"], got["resource_group"]) == (
            {"cpu": "2", "mem": str(3 * GIB)}, "parked")
        screenshot(page, "presets-console.png", full_page=True)
        assert errors == []
    finally:
        ctx.close()

    # The user's form: the new preset is a card, shown while its group is chosen.
    ctx, page, errors = _tab(browser, hub, user["email"], PASSWORD)
    try:
        page.goto(hub.base + "/hub/spawn")
        card = page.locator("#backendai-preset-workshop")
        assert card.is_hidden()
        page.select_option("#backendai-resource-group", "parked")
        assert card.is_visible()
        assert page.locator("#backendai-preset-workshop-help").inner_text() == \
            "For the Friday workshop: local/python, 2 cores, 3 GiB memory"
        page.locator('label[for="backendai-preset-workshop"]').click()
        assert card.is_checked()
        assert page.locator("#backendai-custom").is_hidden()
        screenshot(page, "presets-form-cards.png", full_page=True)
        assert errors == []
    finally:
        ctx.close()

    # Delete: asked first, confirmed, gone.
    ctx, page, errors = _tab(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/presets")
        asked = []
        page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
        with page.expect_navigation():
            page.locator('tr[data-name="workshop"] .backendai-delete').click()
        assert asked == ["Delete preset workshop?"]
        assert page.locator("#backendai-message").inner_text() == "Deleted preset workshop."
        assert page.locator('tr[data-name="workshop"]').count() == 0
        assert sa("GET", "/resource-presets/workshop").status_code == 404
        assert errors == []
    finally:
        ctx.close()
