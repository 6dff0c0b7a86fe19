"""Presets in the spawn form (c.BackendAISpawner.presets) against a real hub on the local
backend: the form lists the presets offered to the user's project and resource group,
with the quota left in human units and the '.'-folders as "always mounted"; choosing a
preset (form or API) starts a session with exactly its image, slots and folders; a
preset that does not exist or is not offered is a 400 in plain words that leaves
nothing behind."""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest
from markupsafe import escape
from sqlalchemy import func, select

from jupyterhub_backendai.models import Agent, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import new_user, superadmin
from .hub import Hub

PRESETS = [
    {"display_name": "Small Python", "slug": "small", "description": "For notebooks",
     "default": True,
     "user_options": {"image": "local/python", "cpu": "0.5", "mem": "256m",
                      "mounts": ["presetdata"]}},
    {"display_name": "Team box", "slug": "team", "projects": ["teamproj"],
     "user_options": {"image": "local/python", "cpu": "1", "mem": "512m"}},
    {"display_name": "GPU box", "slug": "gpubox", "resource_groups": ["gpus"],
     "user_options": {"image": "local/python", "cpu": "1", "mem": "1g", "gpu": 1}},
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("presets")
    url = f"sqlite:///{d}/backendai.sqlite"
    hub = Hub(db_url=url, backend="local", slots={"cpu": 2, "mem": "3g"},
              extra_env={"BACKENDAI_START_TIMEOUT": "60"},
              extra_args=["--BackendAISpawner.presets=" + json.dumps(PRESETS),
                          "--UsageSeries.interval=0.5"])
    hub.start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    try:
        sa = superadmin(hub)
        # This module is about the configured presets alone: the record's packaged ones
        # go (tests/test_resource_presets.py has the record's presets beside these).
        for name in ("small", "medium", "large"):
            sa.ok("DELETE", f"/resource-presets/{name}")
        proj = sa.ok("POST", "/projects", json={"name": "teamproj", "domain_name": "default"})
        # Project quota: 1.5 cores, 2 GiB (shown in the form as what is left).
        sa.ok("PATCH", f"/projects/{proj['id']}",
              json={"total_resource_slots": {"cpu": "1.5", "mem": "2g"}})
        w = {"hub": hub, "sa": sa}
        w["member"] = new_user(sa, projects=[proj["id"]], name="presetmember")
        w["outsider"] = new_user(sa, projects=[], name="presetoutsider")
        for who in ("member", "outsider"):
            c = w[who]["client"]
            for name in ("presetdata", "extra", ".config"):
                c.ok("POST", "/vfolders", json={"name": name})
        yield w
    finally:
        for u in ("presetmember", "presetoutsider"):
            try:
                for name in list(hub.api("GET", f"/users/{u}").json().get("servers", {})):
                    hub.stop_server(u, name)
            except Exception:
                pass
        hub.close()
        hub.engine.dispose()
        shutil.rmtree(hub.dir, ignore_errors=True)


def _web(w, who):
    from .api_world import PASSWORD

    s = w["hub"].login(w[who]["email"], PASSWORD)
    assert s.last_login.status_code == 200
    return s


def _live(hub) -> int:
    with hub.sm() as s:
        return s.scalar(select(func.count()).select_from(Session).where(
            Session.status.notin_(["TERMINATED", "CANCELLED", "ERROR"])))


def _session(hub, user: dict, name: str, timeout: float = 30) -> Session:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with hub.sm() as s:
            row = s.scalar(select(Session).where(Session.name == name,
                                                 Session.user_id == user["id"]))
            if row is not None:
                s.expunge(row)
                return row
        time.sleep(0.1)
    raise AssertionError(f"no session {name!r}\n" + hub.log())


def _stop(hub, user: dict, name: str) -> None:
    hub.stop_server(user["username"], name, token=user["token"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _live(hub):
        time.sleep(0.1)
    assert _live(hub) == 0
    with hub.sm() as s:
        assert s.get(Agent, hub.agent_id).occupied_slots.nonzero() == {}


def _preset_rows(html: str) -> list[str]:
    return re.findall(r'name="preset" value="([^"]+)"', html)


def test_form_lists_presets_per_project_and_group(world):
    hub = world["hub"]
    member = _web(world, "member").get(hub.base + "/hub/spawn").text
    assert _preset_rows(member) == ["small", "team", "custom"]
    assert 'value="small" id="backendai-preset-small"' in member
    assert re.search(r'value="small"[^>]*checked', member)  # the default
    assert "For notebooks: local/python, 0.5 cores, 256 MiB memory; folders: presetdata" in member
    assert "local/python, 1 core, 512 MiB memory" in member
    # Labels tie to the radios (keyboard and screen readers).
    for slug in ("small", "team", "custom"):
        assert f'<label class="form-check-label" for="backendai-preset-{slug}">' in member
    # The quota left in human units: the project's 1.5 cores, 2 GiB, nothing in use.
    assert "Your quota: 1.5 cores, 2 GiB memory left" in member
    outsider = _web(world, "outsider").get(hub.base + "/hub/spawn").text
    assert _preset_rows(outsider) == ["small", "custom"]  # not in teamproj; no 'gpus' group
    assert "GPU box" not in member and "GPU box" not in outsider


def test_always_mounted_folders_are_not_checkboxes(world):
    hub = world["hub"]
    html = _web(world, "member").get(hub.base + "/hub/spawn").text
    block = re.search(r'<div class="mb-2" id="backendai-always-mounted">(.*?)</div>', html, re.S)
    assert block, html[-4000:]
    assert re.findall(r'data-folder="([^"]+)"', block.group(1)) == [".home", ".config"]
    assert "made at your first start" in block.group(1)
    mounts = re.search(r'<fieldset class="form-group mb-3" id="backendai-mounts">(.*?)</fieldset>',
                       html, re.S).group(1)
    labels = re.findall(r'<label class="form-check-label" for="backendai-mount-[^"]+">([^ <]+)',
                        mounts)
    assert labels == ["extra", "presetdata"]
    assert ".config" not in mounts and ".home" not in mounts


def test_form_preset_starts_exactly_its_request(world):
    hub, user = world["hub"], world["member"]
    s = _web(world, "member")
    # A browser without scripts also sends the custom fields: the preset wins.
    r = s.post(hub.base + "/hub/spawn/presetmember/viaform",
               data={"preset": "small", "image": "other/image", "cpu": "2", "mem": "2g",
                     "mounts": ["extra"], "_xsrf": s.cookies.get("_xsrf", path="/hub/")},
               allow_redirects=False)
    assert r.status_code == 302, r.text[-3000:]
    sess = _session(hub, user, "viaform")
    assert sess.image == "local/python"
    assert {k: str(v) for k, v in sess.requested_slots.nonzero().items()} == {
        "cpu": "0.5", "mem": str(256 * 2**20)}
    names = [m["name"] for m in sess.vfolder_mounts]
    assert names[0] == ".home"
    assert sorted(names[1:]) == [".config", "extra", "presetdata"]
    _stop(hub, user, "viaform")


def test_api_preset_with_project(world):
    hub, user = world["hub"], world["member"]
    r = hub.api("POST", "/users/presetmember/servers/viaapi", token=user["token"],
                json={"preset": "team"})
    assert r.status_code in (201, 202), r.text
    sess = _session(hub, user, "viaapi")
    assert sess.image == "local/python"
    assert {k: str(v) for k, v in sess.requested_slots.nonzero().items()} == {
        "cpu": "1", "mem": str(512 * 2**20)}
    assert sorted(m["name"] for m in sess.vfolder_mounts) == [".config", ".home"]
    assert sess.project_id is not None
    # The console's per-project plot draws the core it holds once the hub samples it.
    sa = hub.login()
    deadline = time.monotonic() + 60
    while True:
        page = sa.get(hub.base + "/hub/backendai/admin/plots", timeout=60).text
        plot = re.search(r'id="plot-project-cpu" data-points="(\d+)">(.*?)</figure>', page, re.S)
        if "teamproj: 1 cores now" in plot.group(2) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert '<g class="backendai-series" data-label="teamproj">' in plot.group(2), page[-3000:]
    assert "teamproj: 1 cores now" in plot.group(2)
    assert re.search(r"<title>teamproj: 1 cores at \d\d:\d\d:\d\d</title>", plot.group(2))
    _stop(hub, user, "viaapi")


@pytest.mark.parametrize("who, body, message", [
    ("member", {"preset": "nosuch"},
     "there is no preset 'nosuch' (the presets here: gpubox, small, team)"),
    ("outsider", {"preset": "team"},
     "preset 'team' is not offered to you in resource group 'default'"),
    ("member", {"preset": "gpubox"},
     "preset 'gpubox' is not offered to you in resource group 'default'"),
    ("member", {"preset": "small", "cpu": "2"},
     "preset 'small' fixes the image and resources; leave out cpu or choose custom resources"),
    ("member", {"preset": "custom", "image": "local/python", "cpu": "2", "mem": "1g"},
     "this session asks for 2 cores and your quota allows 1.5 cores in total"),
])
def test_bad_preset_is_a_400_leaving_nothing(world, who, body, message):
    hub, user = world["hub"], world[who]
    r = hub.api("POST", f"/users/{user['username']}/servers/bad", token=user["token"], json=body)
    assert r.status_code == 400, r.text
    assert r.json()["message"] == message
    assert _live(hub) == 0
    with hub.sm() as s:
        assert s.scalar(select(func.count()).select_from(Session).where(
            Session.name == "bad")) == 0


def test_bad_preset_in_the_form_is_shown_in_plain_words(world):
    hub = world["hub"]
    s = _web(world, "outsider")
    r = s.post(hub.base + "/hub/spawn/presetoutsider/badform",
               data={"preset": "team", "_xsrf": s.cookies.get("_xsrf", path="/hub/")})
    assert r.status_code == 400
    assert str(escape("preset 'team' is not offered to you in resource group 'default'")) in r.text
    assert "SpawnException" not in r.text
    assert _live(hub) == 0


def test_resource_group_chosen_or_refused(world):
    """The form offers the resource groups the user may use (the API's rule: public, or
    allowed for the user's domain, projects or keypairs) with each group's presets; a
    request may name one; a group the user may not use is a 403 (one that does not
    exist a 400) in plain words, nothing created. The groups stay for the browser test."""
    from jupyterhub_backendai.models import Project

    hub, sa = world["hub"], world["sa"]
    with hub.sm() as s:
        pid = s.scalar(select(Project.id).where(Project.name == "teamproj"))
    sa.ok("POST", "/resource-groups", json={"name": "gpus", "is_public": False,
                                            "allowed_projects": [pid]})
    sa.ok("POST", "/resource-groups", json={"name": "locked", "is_public": False})
    member = _web(world, "member").get(hub.base + "/hub/spawn").text
    assert re.findall(r'<option value="([^"]+)"[^>]*data-free=', member) == ["default", "gpus"]
    assert _preset_rows(member) == ["small", "team", "gpubox", "custom"]
    assert 'data-groups="gpus">' in member and 'data-groups="default gpus">' in member
    outsider = _web(world, "outsider").get(hub.base + "/hub/spawn").text
    assert 'id="backendai-resource-group"' not in outsider
    assert '<input type="hidden" name="resource_group" value="default">' in outsider
    assert _preset_rows(outsider) == ["small", "custom"]
    for who, body, code, message in [
        ("outsider", {"resource_group": "gpus", "preset": "small"}, 403,
         "you may not use resource group 'gpus' (yours: default)"),
        ("member", {"resource_group": "locked"}, 403,
         "you may not use resource group 'locked' (yours: default, gpus)"),
        ("member", {"resource_group": "nosuch"}, 400,
         "there is no resource group 'nosuch' (yours: default, gpus)"),
    ]:
        user = world[who]
        r = hub.api("POST", f"/users/{user['username']}/servers/rg", token=user["token"],
                    json=body)
        assert (r.status_code, r.json()["message"]) == (code, message), r.text
    # The chosen group is the one checked: gpubox is offered there, and "gpus" has no
    # agent to hold it (refused by the group's agents, not as a preset of another group).
    user = world["member"]
    r = hub.api("POST", f"/users/{user['username']}/servers/rg", token=user["token"],
                json={"resource_group": "gpus", "preset": "gpubox"})
    assert r.status_code == 400, r.text
    assert "not offered" not in r.json()["message"] and "'gpus'" in r.json()["message"], r.text
    s = _web(world, "outsider")
    r = s.post(hub.base + "/hub/spawn/presetoutsider/rgform",
               data={"preset": "small", "resource_group": "locked",
                     "_xsrf": s.cookies.get("_xsrf", path="/hub/")})
    assert r.status_code == 403
    assert str(escape("you may not use resource group 'locked' (yours: default)")) in r.text
    assert _live(hub) == 0
    with hub.sm() as s:
        assert s.scalar(select(func.count()).select_from(Session).where(
            Session.name.in_(["rg", "rgform"]))) == 0


@pytest.mark.browser
def test_presets_in_chromium(world):
    """In headless Chromium: the presets are radios reached with the keyboard, the custom
    fields only with "Custom", the always-mounted folders listed; the chosen preset with
    a ticked folder starts; the console's plots page draws. Screenshots; no console errors."""
    from .chromium import chromium, console_error, screenshot

    hub, user = world["hub"], world["member"]
    errors: list[tuple[str, str]] = []
    with chromium() as b:
        ctx = b.new_context(viewport={"width": 1280, "height": 1000})
        ctx.set_default_timeout(30_000)
        page = ctx.new_page()
        page.on("console", lambda m: console_error(m) and errors.append((page.url, m.text)))
        page.on("pageerror", lambda e: errors.append((page.url, f"uncaught: {e}")))
        from .api_world import PASSWORD

        page.goto(hub.base + "/hub/login")
        page.fill("input[name=username]", user["email"])
        page.fill("input[name=password]", PASSWORD)
        page.click("#login_submit")
        page.wait_for_url(re.compile(r"/hub/(spawn|home)"))
        page.goto(hub.base + "/hub/spawn/presetmember/inbrowser")
        page.locator("#spawn_form").wait_for()
        assert page.locator("#backendai-preset-small").is_checked()
        assert page.locator("#backendai-custom").is_hidden()
        # The resource group (test_resource_group_chosen_or_refused made "gpus"):
        # its presets show while it is chosen, with its free room.
        assert page.locator("#backendai-preset-gpubox").is_hidden()
        page.select_option("#backendai-resource-group", "gpus")
        assert page.locator("#backendai-preset-gpubox").is_visible()
        assert page.locator("#backendai-free").inner_text().strip() == (
            "Free on the largest agent now: no agent is running in this resource group")
        page.select_option("#backendai-resource-group", "default")
        assert page.locator("#backendai-preset-gpubox").is_hidden()
        assert page.locator("#backendai-preset-small").is_checked()
        assert page.locator("#backendai-quota").inner_text().strip() == (
            "Your quota: 1.5 cores, 2 GiB memory left; 0 of 30 sessions in use")
        assert page.locator("#backendai-always-mounted li").all_inner_texts() == [
            ".home (your home folder, at /home/work)",  # made by the earlier starts
            ".config (at /home/work/.config, read-write)"]
        screenshot(page, "presets-form.png", full_page=True)
        # The keyboard: arrows move through the radio group, as in any radio group.
        page.focus("#backendai-preset-small")
        page.keyboard.press("ArrowDown")
        assert page.locator("#backendai-preset-team").is_checked()
        page.keyboard.press("ArrowDown")
        assert page.locator("#backendai-preset-custom").is_checked()
        assert page.locator("#backendai-custom").is_visible()
        assert page.locator("label[for=backendai-cpu]").inner_text().strip() == "CPU cores"
        assert page.get_attribute("#backendai-cpu", "max") == "1.5"
        screenshot(page, "presets-form-custom.png", full_page=True)
        page.keyboard.press("ArrowUp")
        page.keyboard.press("ArrowUp")
        assert page.locator("#backendai-preset-small").is_checked()
        assert page.locator("#backendai-custom").is_hidden()
        page.focus("#backendai-mounts input[value]:near(:text('extra'))")
        page.check("#backendai-mounts label:has-text('extra')")
        page.locator("#spawn_form [type=submit]").click()
        page.wait_for_url(re.compile(r"/(spawn-pending|user)/presetmember/inbrowser"))
        sess = _session(hub, user, "inbrowser")
        assert {k: str(v) for k, v in sess.requested_slots.nonzero().items()} == {
            "cpu": "0.5", "mem": str(256 * 2**20)}
        assert sorted(m["name"] for m in sess.vfolder_mounts) == [
            ".config", ".home", "extra", "presetdata"]
        hub.wait_ready("presetmember", "inbrowser", token=user["token"])
        # The pending page goes on to JupyterLab by itself; a screenshot taken while it
        # navigates has no frame to capture, so wait for the lab's main area first.
        page.wait_for_url(re.compile(r"/user/presetmember/inbrowser/lab"), timeout=120_000, wait_until="commit")
        page.locator("#jp-main-dock-panel").wait_for(timeout=60_000)
        page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=60_000)
        screenshot(page, "presets-started.png")
        ours = [e for e in errors if "/hub/" in e[0]]
        assert ours == [], errors
        ctx.close()

        # The console's plots, as the superadmin.
        ctx = b.new_context(viewport={"width": 1280, "height": 1000})
        page = ctx.new_page()
        page.on("console", lambda m: console_error(m) and errors.append((page.url, m.text)))
        page.on("pageerror", lambda e: errors.append((page.url, f"uncaught: {e}")))
        page.goto(hub.base + "/hub/login")
        page.fill("input[name=username]", "admin@example.com")
        page.fill("input[name=password]", "admin-pass-123")
        page.click("#login_submit")
        page.wait_for_url(re.compile(r"/hub/(spawn|home)"))
        page.goto(hub.base + "/hub/backendai/admin/plots")
        page.locator("#plot-project-cpu").wait_for()
        assert page.locator("svg[role=img]").count() >= 5
        assert int(page.get_attribute("#plot-agent-cpu", "data-points")) >= 3
        screenshot(page, "console-plots.png", full_page=True)
        assert [e for e in errors if "/hub/" in e[0]] == [], errors
        ctx.close()
    _stop(hub, user, "inbrowser")
