"""Issue 29's rough edges on the pages, in headless Chromium against a real hub (local
backend): moments shown in the reader's time zone with the exact UTC time on hover (My
keys, the console's keypairs and agents), the agents table inside a 1280 px window, and
the default server called so on "My sessions" (not ``_default``).

Screenshots go to $BACKENDAI_TEST_ARTIFACTS (default test-artifacts/)."""

from __future__ import annotations

import datetime as dt
import re
import time

import pytest

from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import PASSWORD, new_user, superadmin
from .chromium import chromium, logged_in, screenshot
from .conftest import shutdown_hub
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub

pytestmark = [pytest.mark.browser]
# A moment as the page writes it for people: "Nov 28, 2026, 02:32 PM GMT+9" (en-US,
# Asia/Seoul): no ISO "T", no seconds, no microseconds, the reader's zone.
LOCAL = re.compile(r"^[A-Z][a-z]{2} \d{1,2}, \d{4}, \d\d:\d\d [AP]M GMT\+9$")
EXACT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})? UTC$")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("browser-rough")
    url = f"sqlite:///{d}/backendai.sqlite"
    # The agent's GPUs are an NVML stand-in's (a100-mig: six rows of GPUs and MIG
    # instances in the agents page's live use, the widest that page gets).
    hub = Hub(db_url=url, backend="local",
              extra_args=["--Agent.nvml_stand_in=a100-mig"]).start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    try:
        sa = superadmin(hub)
        sa.ok("POST", "/resource-groups", json={"name": "parked", "is_public": True})
        user = new_user(sa, name="roughuser")
        from jupyterhub_backendai.models import Keypair

        with hub.sm.begin() as s:  # the keypair was used (a signed request sets this)
            s.get(Keypair, user["keypair"]["access_key"]).last_used = dt.datetime(
                2026, 11, 28, 5, 7, 9, 123456)
        yield {"hub": hub, "sa": sa, "user": user}
    finally:
        hub.engine.dispose()
        shutdown_hub(hub)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _tab(browser, hub, email, password):
    return logged_in(browser, hub, email, password, locale="en-US", timezone_id="Asia/Seoul")


def _check_time(el) -> dt.datetime:
    """A <time> of ours: text in the reader's zone, exact UTC in title and datetime, the
    same moment in all three (to the minute)."""
    text, title, iso = el.inner_text(), el.get_attribute("title"), el.get_attribute("datetime")
    assert LOCAL.match(text), text
    assert EXACT.match(title), title
    moment = dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    assert title.startswith(moment.strftime("%Y-%m-%d %H:%M:%S")), (title, iso)
    seoul = moment.astimezone(dt.timezone(dt.timedelta(hours=9)))
    assert text == seoul.strftime("%b ") + str(seoul.day) + seoul.strftime(", %Y, %I:%M %p GMT+9")
    return moment


def _park_default_server(hub, user) -> str:
    """The user's default server as the spawner records it (JupyterHub's name '': the
    session "_default" below /user/<name>/), waiting in a group without agents."""
    from jupyterhub_backendai.common.slots import ResourceSlot
    from jupyterhub_backendai.models import Kernel, Session

    with hub.sm.begin() as s:
        sess = Session(
            name="_default", session_type="interactive", user_id=user["id"],
            access_key=user["keypair"]["access_key"], domain_name="default",
            resource_group="parked", image="local/python", status="PENDING",
            service_prefix=f"/user/{user['username']}/",
            status_info="no agent in resource group 'parked'",
            requested_slots=ResourceSlot(cpu="0.5", mem=256 * 2**20))
        sess.kernels.append(Kernel(status="PENDING"))
        s.add(sess)
        s.flush()
        return sess.id


def test_user_pages_show_moments_and_the_default_server_for_people(world, browser):
    hub, user = world["hub"], world["user"]
    sid = _park_default_server(hub, user)
    ctx, page, errors = _tab(browser, hub, user["email"], PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/keys")
        row = page.locator(f'tr[data-access-key="{user["keypair"]["access_key"]}"]')
        cells = row.locator("time.backendai-time")
        assert cells.count() == 2  # last used, created
        used = _check_time(cells.nth(0))
        assert used == dt.datetime(2026, 11, 28, 5, 7, 9, 123456, tzinfo=dt.UTC)
        assert cells.nth(0).inner_text() == "Nov 28, 2026, 02:07 PM GMT+9"
        assert cells.nth(0).get_attribute("title") == "2026-11-28 05:07:09.123456 UTC"
        _check_time(cells.nth(1))
        assert not re.search(r"\d\d:\d\d:\d\d\.\d", row.inner_text())  # no raw ISO left
        # A keypair made on the page gets the same kind of cell at once.
        page.click("#backendai-create-key")
        page.locator("#backendai-new-key").wait_for()
        ak = page.locator("#backendai-new-access-key").inner_text()
        _check_time(page.locator(f'tr[data-access-key="{ak}"] time.backendai-time').last)
        screenshot(page, "rough-keys.png", full_page=True)

        page.goto(hub.base + "/hub/backendai/sessions")
        row = page.locator(f'tr[data-session-id="{sid}"]')
        assert row.locator(".backendai-session-name").inner_text().splitlines()[0] == \
            "default server"
        assert "_default" not in page.locator("#backendai-sessions").inner_text()
        assert EXACT.match(row.locator(".backendai-age").get_attribute("title")
                           .removeprefix("created "))
        assert row.locator(".backendai-stop").get_attribute("aria-label") == \
            "Stop default server"
        screenshot(page, "rough-sessions-default-server.png", full_page=True)
        assert errors == []
    finally:
        ctx.close()
        world["sa"].ok("DELETE", f"/sessions/{sid}")


def test_console_moments_and_the_agents_table_in_1280_px(world, browser):
    hub, user = world["hub"], world["user"]
    ctx, page, errors = _tab(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/keypairs")
        row = page.locator(f'tr[data-access-key="{user["keypair"]["access_key"]}"]')
        _check_time(row.locator("time.backendai-time"))
        screenshot(page, "rough-console-keypairs.png", full_page=True)

        deadline = time.monotonic() + 40  # the first live sample comes with a heartbeat
        while True:
            page.goto(hub.base + "/hub/backendai/admin/agents")
            if page.locator(".backendai-live-gpus").count() or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert page.locator(".backendai-live-gpus tr[data-gpu]").count() == 6
        rows = page.locator("#backendai-agents > tbody > tr")
        assert rows.count() >= 1
        for i in range(rows.count()):
            _check_time(rows.nth(i).locator("> td time.backendai-time"))
        # Nothing wider than the window: no horizontal scrolling of the page.
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1280, width
        table = page.locator("#backendai-agents").bounding_box()
        assert table["x"] >= 0 and table["x"] + table["width"] <= 1280, table
        screenshot(page, "rough-console-agents-1280.png", full_page=True)
        assert errors == []
    finally:
        ctx.close()


def test_jupyterlab_news_plugin_is_off_in_sessions(world):
    """The hub passes c.BackendAISpawner.jupyterlab_news (default off) to the session:
    JupyterLab's page config disables its announcements plugin (the "official Jupyter
    news?" popup and the internet fetches behind it). A local-process kernel: the hub's
    own JupyterLab, the same version as the kernel image's."""
    from .api_world import PASSWORD as PW
    from .kernel_client import lab_page_config

    hub, user = world["hub"], world["user"]
    name = user["username"]
    r = hub.spawn(name, "lab")
    assert r.status_code in (201, 202), r.text
    try:
        hub.wait_ready(name, "lab")
        web = hub.login(user["email"], PW)
        config = lab_page_config(web.get(hub.base + f"/user/{name}/lab/lab", timeout=60))
        assert "@jupyterlab/apputils-extension:announcements" in config["disabledExtensions"]
        assert config["hubUser"] == name  # this is the session's own JupyterLab
    finally:
        hub.stop_server(name, "lab")


def test_console_decommissions_and_removes_agents(world, browser):
    """Issue 29 point 3: a decommissioned agent takes no new sessions (its own run on),
    goes back into service, and a gone agent (LOST, nothing alive on it) is removed."""
    from sqlalchemy import select

    from jupyterhub_backendai.models import Agent, Session

    hub, sa, user = world["hub"], world["sa"], world["user"]
    aid = hub.agent_id
    ctx, page, errors = _tab(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.accept()))
    sid = None
    try:
        page.goto(hub.base + "/hub/backendai/admin/agents")
        row = page.locator(f'tr[data-agent="{aid}"]')
        with page.expect_navigation():
            row.locator(".backendai-decommission").click()
        assert asked == [f"Decommission agent {aid}? It takes no new sessions; its sessions run "
                         "on to their end."]
        assert page.locator("#backendai-message").inner_text() == \
            f"Decommissioned agent {aid}: it takes no new sessions."
        assert row.locator(".backendai-schedulable").inner_text() == \
            "decommissioned: no new sessions"
        assert sa.ok("GET", f"/agents/{aid}")["schedulable"] is False
        screenshot(page, "rough-console-agent-decommissioned.png", full_page=True)
        # A new session waits, with the scheduler's reason, while the only agent is out.
        sid = user["client"].ok("POST", "/sessions", json={
            "name": "waits", "image": "local/python", "startup_command": "sleep 300",
            "resources": {"cpu": "0.1", "mem": "64m"}})["id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with hub.sm() as s:
                status, info = s.execute(select(Session.status, Session.status_info).where(
                    Session.id == sid)).one()
            if info:
                break
            time.sleep(0.5)
        assert (status, bool(info)) == ("PENDING", True), (status, info)
        # Back in service: the session is placed.
        with page.expect_navigation():
            row.locator(".backendai-recommission").click()
        assert page.locator("#backendai-message").inner_text() == \
            f"Agent {aid} takes new sessions again."
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with hub.sm() as s:
                status = s.scalar(select(Session.status).where(Session.id == sid))
            if status != "PENDING":
                break
            time.sleep(0.5)
        assert status != "PENDING"
        # An alive agent is not removed (no button; the API says why).
        assert row.locator(".backendai-remove-agent").count() == 0
        r = sa("DELETE", f"/agents/{aid}")
        assert r.status_code == 409 and "is alive: decommission it" in r.json()["detail"]
        # A gone agent: removed from the record after a confirmation.
        with hub.sm.begin() as s:
            s.add(Agent(id="gone-agent-x", resource_group="default", status="LOST"))
        page.goto(hub.base + "/hub/backendai/admin/agents")
        gone = page.locator('tr[data-agent="gone-agent-x"]')
        with page.expect_navigation():
            gone.locator(".backendai-remove-agent").click()
        assert asked[-1] == "Remove agent gone-agent-x from the record?"
        assert page.locator("#backendai-message").inner_text() == "Removed agent gone-agent-x."
        assert gone.count() == 0
        assert sa("GET", "/agents/gone-agent-x").status_code == 404
        assert errors == []
    finally:
        ctx.close()
        sa("PATCH", f"/agents/{aid}", json={"schedulable": True})
        if sid:
            sa("DELETE", f"/sessions/{sid}")


def _wait_status(hub, sid: str, want, timeout: float = 60):
    from sqlalchemy import select

    from jupyterhub_backendai.models import Session

    deadline = time.monotonic() + timeout
    while True:
        with hub.sm() as s:
            status, info = s.execute(select(Session.status, Session.status_info).where(
                Session.id == sid)).one()
        if want(status, info) or time.monotonic() > deadline:
            return status, info
        time.sleep(0.3)


def _move_in_console(page, row, group: str):
    row.locator("summary", has_text="Edit").click()
    row.get_by_label("Resource group").select_option(group)
    row.locator("form.backendai-edit button[type=submit]").click()


def test_console_moves_an_agent_to_another_resource_group(world, browser):
    """Issue 29 point 3: a superadmin moves an agent to another resource group from the
    console (Backend.AI's update_scaling_group): refused, in the form, while it holds a
    kernel; then moved, and sessions of its old group wait; the agent keeps the group
    through heartbeats and a hub restart (its state directory), until moved back."""
    hub, sa, user = world["hub"], world["sa"], world["user"]
    aid = hub.agent_id
    client = user["client"]
    held = client.ok("POST", "/sessions", json={
        "name": "holds", "image": "local/python", "startup_command": "sleep 300",
        "resources": {"cpu": "0.1", "mem": "64m"}})["id"]
    assert _wait_status(hub, held, lambda s, _: s == "RUNNING")[0] == "RUNNING"
    ctx, page, errors = _tab(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    waiting = None
    try:
        page.goto(hub.base + "/hub/backendai/admin/agents")
        row = page.locator(f'tr[data-agent="{aid}"]')
        _move_in_console(page, row, "parked")
        err = row.locator(".backendai-edit-error")
        err.wait_for()
        assert "holds 1 kernel of sessions in 'default'" in err.inner_text(), err.inner_text()
        assert sa.ok("GET", f"/agents/{aid}")["resource_group"] == "default"
        sa.ok("DELETE", f"/sessions/{held}")
        assert _wait_status(hub, held, lambda s, _: s == "TERMINATED")[0] == "TERMINATED"
        page.reload()
        with page.expect_navigation():
            _move_in_console(page, row, "parked")
        assert page.locator("#backendai-message").inner_text() == f"Saved agent {aid}."
        assert row.locator(".backendai-agent-group").inner_text() == "parked"
        screenshot(page, "rough-console-agent-moved.png", full_page=True)
        # Its old group has no agent now; its new one has.
        job = {"name": "after-the-move", "image": "local/python", "startup_command": "sleep 300",
               "resources": {"cpu": "0.1", "mem": "64m"}}

        def refused_in_default():
            r = client("POST", "/sessions", json=job)
            return r.status_code == 400 and "'default' has no live agent" in r.text

        assert refused_in_default()
        waiting = client.ok("POST", "/sessions", json={**job, "resource_group": "parked"})["id"]
        assert _wait_status(hub, waiting, lambda s, _: s == "RUNNING")[0] == "RUNNING"
        sa.ok("DELETE", f"/sessions/{waiting}")
        # Heartbeats and a restart keep it there (the agent was told, and keeps it).
        hub.stop_hub()
        hub.start()
        assert sa.ok("GET", f"/agents/{aid}")["resource_group"] == "parked"
        with open(f"{hub.env['BACKENDAI_STATE_DIR']}/agent/resource-group") as f:
            assert f.read().strip() == "parked"
        assert refused_in_default()
        # A group that does not exist: refused, nothing changed.
        r = sa("PATCH", f"/agents/{aid}", json={"resource_group": "nowhere"})
        assert r.status_code == 400 and "no resource group 'nowhere'" in r.text, r.text
        assert sa.ok("GET", f"/agents/{aid}")["resource_group"] == "parked"
        sa.ok("PATCH", f"/agents/{aid}", json={"resource_group": "default"})
        waiting = client.ok("POST", "/sessions", json=job)["id"]
        assert _wait_status(hub, waiting, lambda s, _: s == "RUNNING")[0] == "RUNNING"
        # The one refusal the page met (Chromium logs a 4xx answer as an error).
        assert errors == ["Failed to load resource: the server responded with a status of "
                          "409 (Conflict)"], errors
    finally:
        ctx.close()
        sa("PATCH", f"/agents/{aid}", json={"resource_group": "default"})
        for sid in (held, waiting):
            if sid:
                sa("DELETE", f"/sessions/{sid}")


def test_console_creates_projects_with_members_and_policies(world, browser):
    """Issue 29 point 3: the console's create forms for projects (with their members,
    in one transaction) and resource policies; bad input shown under the form, nothing
    made; every change confirmed."""
    hub, sa, user = world["hub"], world["sa"], world["user"]
    # The API: a refused member leaves no project behind.
    r = sa("POST", "/projects", json={"name": "halfmade", "domain_name": "default",
                                      "member_ids": [user["id"], "f" * 32]})
    assert r.status_code == 400 and r.json()["detail"] == f"user_ids: no user '{'f' * 32}'"
    assert sa.ok("GET", "/projects", params={"name": "halfmade"})["total"] == 0
    ctx, page, errors = _tab(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/projects")
        err = page.locator("#backendai-project-create-error")
        page.click("#backendai-project-create [type=submit]")
        assert err.inner_text() == "Give the project a name."
        page.fill("#pj-name", "bad name!")
        page.click("#backendai-project-create [type=submit]")
        page.wait_for_function("document.getElementById('backendai-project-create-error')"
                               "?.textContent.startsWith('Could not')")
        assert err.inner_text().startswith("Could not create project bad name!: name")
        assert sa.ok("GET", "/projects", params={"name": "bad name!"})["total"] == 0
        errors.clear()  # the refused call (400), logged by Chromium
        page.fill("#pj-name", "labproj")
        page.fill("#pj-description", "The lab's project")
        page.select_option("#pj-members", label=user["username"])
        with page.expect_navigation():
            page.click("#backendai-project-create [type=submit]")
        assert page.locator("#backendai-message").inner_text() == \
            "Created project labproj with 1 member."
        row = page.locator('tr[data-name="labproj"]')
        assert row.locator("[data-member]").all_inner_texts()[0].startswith(user["username"])
        (proj,) = sa.ok("GET", "/projects", params={"name": "labproj"})["items"]
        members = sa.ok("GET", f"/projects/{proj['id']}/members")["items"]
        assert [m["username"] for m in members] == [user["username"]]
        screenshot(page, "rough-console-project-created.png", full_page=True)

        page.goto(hub.base + "/hub/backendai/admin/policies")
        err = page.locator("#backendai-policy-create-error")
        page.fill("#po-name", "tight")
        page.fill("#po-sessions", "many")
        page.click("#backendai-policy-create [type=submit]")
        page.wait_for_function("document.getElementById('backendai-policy-create-error')"
                               "?.textContent.startsWith('Could not')")
        assert "max_concurrent_sessions" in err.inner_text()
        assert sa("GET", "/keypair-resource-policies/tight").status_code == 404
        errors.clear()
        page.fill("#po-sessions", "3")
        page.fill("#po-cpu", "2")
        page.fill("#po-mem", "4g")
        with page.expect_navigation():
            page.click("#backendai-policy-create [type=submit]")
        assert page.locator("#backendai-message").inner_text() == \
            "Created keypair resource policy tight."
        got = sa.ok("GET", "/keypair-resource-policies/tight")
        assert (got["max_concurrent_sessions"], got["total_resource_slots"]) == (
            3, {"cpu": "2", "mem": str(4 << 30)})
        page.select_option("#po-kind", "user")
        assert page.locator("#po-cpu").is_hidden() and page.locator("#po-folders").is_visible()
        page.fill("#po-name", "fewfolders")
        page.fill("#po-folders", "5")
        with page.expect_navigation():
            page.click("#backendai-policy-create [type=submit]")
        assert page.locator("#backendai-message").inner_text() == \
            "Created user resource policy fewfolders."
        assert sa.ok("GET", "/user-resource-policies/fewfolders")["max_vfolder_count"] == 5
        assert page.locator('#backendai-user-policies tr[data-name="fewfolders"]').count() == 1
        screenshot(page, "rough-console-policies-created.png", full_page=True)
        assert errors == []
    finally:
        ctx.close()


def test_console_confirms_a_new_user_after_the_reload(world, browser):
    hub, sa = world["hub"], world["sa"]
    ctx, page, errors = _tab(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
    try:
        page.goto(hub.base + "/hub/backendai/admin/users")
        page.fill("#u-email", "confirmed@example.com")
        page.fill("#u-username", "confirmed")
        page.fill("#u-password", "confirmed-pass-1")
        with page.expect_navigation():
            page.click("#backendai-user-create [type=submit]")
        assert page.locator('tr[data-username="confirmed"]').count() == 1
        message = page.locator("#backendai-message")
        assert message.inner_text() == ("Created user confirmed (confirmed@example.com); they "
                                        "log in with the password you gave.")
        assert "alert-success" in message.get_attribute("class")
        assert errors == []
    finally:
        ctx.close()
    (u,) = sa.ok("GET", "/users", params={"email": "confirmed@example.com"})["items"]
    sa.ok("DELETE", f"/users/{u['id']}")
